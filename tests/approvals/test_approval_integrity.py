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

from approvals.audit import verify_chain
from approvals.models import Approval, AuditEvent
from approvals.selectors import review_queue
from tests.aitp.conftest import api_key, connect, tenant  # noqa: F401 (fixtures)
from tests.aitp.test_agent import (  # noqa: F401 (fixtures)
    approval_request,
    close,
    errors,
    fake,
    llm,
    start_payment,
    stored_calls,
    tool_results,
    until_done,
)
from tests.support.people import make_user

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
        root = make_user("root-reviewer", superuser=True)
        return list(review_queue(root).values_list("pk", flat=True))

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
