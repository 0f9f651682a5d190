"""A high or critical page tool counts only once the page asked its user.

A page (anyone holding the publishable key) that answers such a call with a
TOOL_RESULT, or with an APPROVAL_RESPONSE no APPROVAL_REQUEST came before, is
refused: an ``approval_required`` error event, the call ends denied, the model
is told the action was not approved, and an audited approval row closed as a
violation waits in the operators' review queue.

Driven like tests/aitp/test_agent.py: the real consumer on a
WebsocketCommunicator, the real SDK against the fake Messages API.
"""
from __future__ import annotations

import pytest
from asgiref.sync import sync_to_async

from agent.approvals import MISMATCH_MESSAGE
from aitp_client import AitpClient, system_event
from approvals.audit import verify_chain
from approvals.models import Approval, AuditEvent
from approvals.selectors import in_review_queue
from tests.aitp.conftest import ADD_TO_CART, ORIGIN, api_key, connect, tenant  # noqa: F401 (fixtures)
from tests.aitp.test_agent import (  # noqa: F401 (fixtures)
    API_KEY,
    CHECKOUT,
    PAY,
    TOOL_TIMEOUT,
    approval_request,
    close,
    errors,
    fake,
    llm,
    open_shop,
    start_payment,
    stored_calls,
    tool_results,
    until_done,
)
from tests.support.fake_anthropic import text_response, tool_use_response

pytestmark = [pytest.mark.django_db(transaction=True)]

SKIPS = {
    "tool_result_success": ("TOOL_RESULT", {"status": "success", "result": {"paid": True}}),
    "tool_result_error": ("TOOL_RESULT", {"status": "error", "result": None, "error": "card"}),
    "approval_response_without_request": ("APPROVAL_RESPONSE",
                                          {"approved": True, "result": {"paid": True}}),
}


async def skip_approval(page, call: dict, how: str) -> list[dict]:
    frame_type, fields = SKIPS[how]
    await page.send(frame_type, {"callId": call["payload"]["callId"], **fields})
    return await until_done(page)


@pytest.mark.parametrize("how", sorted(SKIPS))
async def test_a_critical_call_answered_without_approval_is_refused_with_approval_required(
    llm, connect, api_key, settings, how
):
    page, call = await start_payment(llm, connect, api_key, settings)
    frames = await skip_approval(page, call, how)

    assert [e["data"]["code"] for e in errors(frames)] == ["approval_required"]
    assert errors(frames)[0]["data"]["callId"] == call["payload"]["callId"]
    (row,) = await stored_calls(page.session_id)
    assert row.status == "denied"
    assert row.result is None
    await close(page)


async def test_the_model_is_told_the_action_was_not_approved(llm, connect, api_key, settings):
    page, call = await start_payment(llm, connect, api_key, settings)
    await skip_approval(page, call, "tool_result_success")

    (result,) = tool_results(llm.requests[1]["messages"][-1])
    assert result["is_error"] is True
    assert "not approved" in result["content"]
    assert "paid" not in result["content"]
    await close(page)


@pytest.mark.parametrize("how", sorted(SKIPS))
async def test_a_skipped_approval_is_audited_and_waits_in_the_review_queue(
    llm, connect, api_key, settings, how
):
    page, call = await start_payment(llm, connect, api_key, settings)
    await skip_approval(page, call, how)

    approval = await Approval.objects.select_related("tool_call").aget(
        tool_call__call_id=call["payload"]["callId"]
    )
    assert approval.status == Approval.Status.VIOLATION
    assert approval.risk == "critical"
    events = [e async for e in AuditEvent.objects.filter(approval_id=approval.pk)]
    assert [e.action for e in events] == [AuditEvent.Action.VIOLATION]
    assert events[0].data["reason"] in ("tool_result", "approval_response_without_request")
    assert (await sync_to_async(verify_chain)()).ok

    def queued() -> list[int]:
        return list(in_review_queue(Approval.objects.all()).values_list("pk", flat=True))

    assert approval.pk in await sync_to_async(queued)()
    await close(page)


async def test_an_approved_request_still_counts_as_a_success(llm, connect, api_key, settings):
    page, call = await start_payment(llm, connect, api_key, settings)
    await page.send("APPROVAL_REQUEST", approval_request(call))
    await page.send("APPROVAL_RESPONSE", {"callId": call["payload"]["callId"], "approved": True,
                                          "result": {"paid": True}})
    frames = await until_done(page)

    assert errors(frames) == []
    (row,) = await stored_calls(page.session_id)
    assert row.status == "success"
    assert not await AuditEvent.objects.filter(action=AuditEvent.Action.VIOLATION).aexists()
    await close(page)


async def test_a_direct_answer_after_an_approval_request_is_still_refused_as_pending(
    llm, connect, api_key, settings
):
    page, call = await start_payment(llm, connect, api_key, settings)
    call_id = call["payload"]["callId"]
    await page.send("APPROVAL_REQUEST", approval_request(call))
    await page.send("TOOL_RESULT", {"callId": call_id, "status": "success", "result": {"paid": 1}})
    refused = await page.recv_until("SYSTEM_EVENT")
    assert refused["payload"]["data"]["code"] == "approval_pending"
    await page.send("APPROVAL_RESPONSE", {"callId": call_id, "approved": False,
                                          "error": "Action denied by user"})
    await until_done(page)
    (row,) = await stored_calls(page.session_id)
    assert row.status == "denied"
    await close(page)


# --- high is refused as critical is ----------------------------------------------------

BARE_RESULTS = {
    "success": {"status": "success", "result": {"done": True}},
    "error": {"status": "error", "result": None, "error": "the handler threw"},
}


async def start_risky_call(llm, connect, api_key, settings, tool: dict, args: dict):
    """A turn waiting on the page's call of ``tool`` (high or critical)."""
    settings.OWLLAYER_TOOL_TIMEOUT = TOOL_TIMEOUT
    settings.OWLLAYER_APPROVAL_TIMEOUT = 10.0
    llm.enqueue(tool_use_response([("toolu_risky", tool["name"], args)]),
                text_response("Handled."))
    page = await open_shop(connect, api_key, tools=(ADD_TO_CART, CHECKOUT, PAY))
    await page.send("USER_INPUT", {"modality": "text", "content": "go ahead"})
    call = await page.recv_until("TOOL_CALL")
    assert call["payload"]["name"] == tool["name"]
    return page, call


async def assert_a_bare_tool_result_is_refused(llm, connect, api_key, settings, tool, args,
                                               status) -> None:
    page, call = await start_risky_call(llm, connect, api_key, settings, tool, args)
    call_id = call["payload"]["callId"]

    await page.send("TOOL_RESULT", {"callId": call_id, **BARE_RESULTS[status]})
    frames = await until_done(page)

    assert [(e["data"]["code"], e["data"]["callId"]) for e in errors(frames)] == [
        ("approval_required", call_id)]
    (row,) = await stored_calls(page.session_id)
    assert (row.status, row.result) == ("denied", None)
    (result,) = tool_results(llm.requests[1]["messages"][-1])
    assert result["is_error"] is True
    assert "not approved" in result["content"]
    assert "done" not in result["content"] and "threw" not in result["content"]
    approval = await Approval.objects.aget(tool_call__call_id=call_id)
    assert (approval.status, approval.risk) == (Approval.Status.VIOLATION, tool["risk"])
    events = [(e.action, e.data["reason"]) async for e in
              AuditEvent.objects.filter(approval_id=approval.pk)]
    assert events == [(AuditEvent.Action.VIOLATION, "tool_result")]
    await close(page)


@pytest.mark.parametrize("status", sorted(BARE_RESULTS))
async def test_a_high_risk_call_answered_by_a_bare_tool_result_is_refused_like_a_critical_one(
    llm, connect, api_key, settings, status
):
    await assert_a_bare_tool_result_is_refused(llm, connect, api_key, settings, CHECKOUT, {},
                                               status)


@pytest.mark.parametrize("status", sorted(BARE_RESULTS))
async def test_a_critical_call_answered_by_a_bare_tool_result_is_refused(
    llm, connect, api_key, settings, status
):
    await assert_a_bare_tool_result_is_refused(llm, connect, api_key, settings, PAY,
                                               {"amount": 42}, status)


# --- approval for other arguments, in a real turn over a socket --------------------------


async def test_an_approval_request_for_other_arguments_is_refused_in_a_real_turn_over_a_socket(
    daphne_factory, fake, api_key
):
    server = daphne_factory(
        OWLLAYER_LLM="anthropic", ANTHROPIC_API_KEY=API_KEY, ANTHROPIC_BASE_URL=fake.base_url,
        OWLLAYER_MODEL="claude-test-model", OWLLAYER_LLM_MAX_RETRIES=0, OWLLAYER_LLM_TIMEOUT=10,
    )
    fake.enqueue(tool_use_response([("toolu_pay", "pay", {"amount": 42})]),
                 text_response("The payment did not go through."))
    client = AitpClient(server.ws_url(), api_key=api_key.raw, origin=ORIGIN)
    await client.connect()
    try:
        await client.context_update("/checkout", "Checkout", tools=[PAY])
        await client.recv_until(system_event("tools_effective"))
        await client.user_input("pay for it")
        call = await client.recv_until("TOOL_CALL")
        call_id = call["payload"]["callId"]
        assert call["payload"]["args"] == {"amount": 42}

        await client.send("APPROVAL_REQUEST", {
            "callId": call_id, "toolName": "pay", "risk": "critical", "args": {"amount": 4200},
            "message": "Pay 4200 USD with the saved card?"})
        refused = await client.recv_until(system_event("error"))
        done = await client.recv_until(lambda f: f["type"] == "AGENT_RESPONSE" and f["payload"]["done"])
    finally:
        await client.close()

    assert (refused["payload"]["data"]["code"], refused["payload"]["data"]["callId"]) == (
        "approval_mismatch", call_id)
    assert done["payload"]["chunk"] == "The payment did not go through."
    (result,) = tool_results(fake.requests[1]["messages"][-1])
    assert result == {"type": "tool_result", "tool_use_id": "toolu_pay", "is_error": True,
                      "content": MISMATCH_MESSAGE}
    (row,) = await stored_calls(client.session_id)
    assert (row.status, row.result, row.error) == ("denied", None, MISMATCH_MESSAGE)
    trail = [e.action async for e in AuditEvent.objects.filter(call_id=call_id).order_by("seq")]
    assert trail == [AuditEvent.Action.MISMATCH]
