"""A page asks its user about a risky call in one of two ways: an
APPROVAL_REQUEST, or a TOOL_RESULT with status pending_approval. Both are one
ask of the same call:

- they count against the call's one limit (OWLLAYER_APPROVAL_REQUESTS_PER_CALL),
  together; past it, ``rate_limited`` with the callId;
- the first opens the approval (one ``requested`` audit row); a repeat,
  either way, writes no audit row;
- the first moves the call's deadline to the approval timeout; a repeat
  never moves it again.

The limits and the audit rows are checked through the real consumer (the
offline backend calls the tool named in "/tool <name> {json}"); the deadline,
which only the turn knows, on a real Agent whose page is a stand-in.
"""
from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest
from django.test import override_settings

from agent.loop import Agent, AgentConfig, PageSnapshot
from agent.store import AgentStore
from aitp import protocol as p
from aitp.ledger import ERROR, SUCCESS, Outcome
from aitp.limits import ConnectionLimits
from aitp.tools import ToolSurface, parse_client_tools
from approvals.models import Approval, AuditEvent
from llm.offline import OfflineBackend
from runtime.config import config
from tests.aitp.conftest import api_key, connect, in_db, open_page, open_session_row, tenant  # noqa: F401 (fixtures)

pytestmark = [pytest.mark.django_db(transaction=True)]

PAY = {
    "name": "pay",
    "description": "Pay with the saved card",
    "parameters": {"type": "OBJECT", "properties": {"amount": {"type": "NUMBER"}},
                   "required": ["amount"]},
    "risk": "critical",
}
PAY_COMMAND = '/tool pay {"amount": 42}'
LIMIT = 5
# Far longer than any of these tests: the call never times out while asked about.
PATIENCE = 30.0


def ask(way: str, call_id: str) -> tuple[str, dict]:
    """One ask about the call, as a frame type and its payload."""
    if way == "pending_approval":
        return "TOOL_RESULT", {"callId": call_id, "status": "pending_approval", "result": None}
    return "APPROVAL_REQUEST", {"callId": call_id, "toolName": "pay", "risk": "critical",
                                "args": {"amount": 42}, "message": "Pay 42 USD with the saved card?"}


# Sixty asks of one call: by APPROVAL_REQUEST, by TOOL_RESULT pending_approval,
# and the two taking turns.
WAYS = {
    "approval_request": ["approval_request"] * 60,
    "pending_approval": ["pending_approval"] * 60,
    "both_in_turn": ["approval_request", "pending_approval"] * 30,
}


async def start_payment(connect, api_key):
    page = await open_page(connect, api_key, tools=[PAY], url="/checkout")
    await page.send("USER_INPUT", {"modality": "text", "content": PAY_COMMAND})
    call = await page.recv_until("TOOL_CALL", timeout=PATIENCE)
    return page, call["payload"]["callId"]


@pytest.mark.parametrize("way", sorted(WAYS))
@override_settings(OWLLAYER_APPROVAL_REQUESTS_PER_CALL=LIMIT, OWLLAYER_FRAMES_PER_SECOND=0)
async def test_every_way_of_asking_counts_against_the_one_limit_of_the_call(connect, api_key, way):
    page, call_id = await start_payment(connect, api_key)

    for each in WAYS[way]:
        await page.send(*ask(each, call_id))
    # Every ask past the limit is answered; the first LIMIT are not (accepted).
    refused = [await page.recv(PATIENCE) for _ in range(len(WAYS[way]) - LIMIT)]

    assert [f["payload"]["data"] for f in refused] == [
        {"code": "rate_limited", "limit": "approval_requests_per_call", "callId": call_id}
    ] * (len(WAYS[way]) - LIMIT)
    await page.send("APPROVAL_RESPONSE", {"callId": call_id, "approved": False,
                                          "error": "Action denied by user"})
    done = await page.recv_until("AGENT_RESPONSE", timeout=PATIENCE, done=True)
    assert "declined" in done["payload"]["chunk"]
    await page.close()


@pytest.mark.parametrize("way", sorted(WAYS))
@override_settings(OWLLAYER_APPROVAL_REQUESTS_PER_CALL=LIMIT, OWLLAYER_FRAMES_PER_SECOND=0)
async def test_a_repeated_ask_writes_no_audit_row_whichever_way_it_comes(connect, api_key, way):
    page, call_id = await start_payment(connect, api_key)

    for each in WAYS[way][:LIMIT]:
        await page.send(*ask(each, call_id))
    # One more past the limit: its answer comes after every ask before it was handled.
    await page.send(*ask(WAYS[way][LIMIT], call_id))
    refused = await page.recv(PATIENCE)
    assert refused["payload"]["data"]["code"] == "rate_limited"

    trail = [event.action async for event in AuditEvent.objects.filter(call_id=call_id)]
    assert trail == ["requested"]
    await page.close()


# --- the deadline ------------------------------------------------------------------


class StandInPage:
    """The connection's side of the turn: keeps the frames, and says when
    the TOOL_CALL is out."""

    def __init__(self, tool: dict = PAY) -> None:
        self._surface = ToolSurface.build([], parse_client_tools([tool]))
        self.frames: list[p.Message] = []
        self.called = asyncio.Event()

    async def send(self, message) -> None:
        if not isinstance(message, p.Message):
            return  # where the turn is, and its end
        self.frames.append(message)
        if message.type is p.MessageType.TOOL_CALL:
            self.called.set()

    def surface(self) -> ToolSurface:
        return self._surface

    def page(self) -> PageSnapshot:
        return PageSnapshot(url="/checkout", title="Checkout", context={})


async def waiting_payment(tool: dict = PAY, command: str = PAY_COMMAND):
    """An agent whose turn waits on the page's ``pay`` call (or ``tool``'s,
    called by ``command``); (agent, call, turn task)."""
    session = await in_db(open_session_row)()
    page = StandInPage(tool)
    agent = Agent(
        session_id=session.id, tenant_id=session.tenant_id, system_prompt="",
        backend=OfflineBackend(),
        config=AgentConfig(model="offline", tool_timeout=PATIENCE, approval_timeout=2 * PATIENCE,
                           stream_interval=0.001),
        io=page, store=AgentStore(session_id=session.id, tenant_id=session.tenant_id),
        limits=ConnectionLimits(replace(config().limits, approval_requests_per_call=0)),
    )
    task = asyncio.ensure_future(agent.run_turn(command))
    await asyncio.wait_for(page.called.wait(), PATIENCE)
    [call] = agent.ledger.open_calls()
    return agent, call, task


async def send_ask(agent: Agent, way: str, call_id: str) -> p.Message | None:
    frame_type, payload = ask(way, call_id)
    if frame_type == "TOOL_RESULT":
        return await agent.on_tool_result(p.ToolResult(**payload))
    return await agent.on_approval_request(p.ApprovalRequest(**payload))


@pytest.mark.parametrize("way", sorted(WAYS))
async def test_the_first_ask_moves_the_deadline_once_and_repeats_never_move_it_again(way):
    agent, call, task = await waiting_payment()
    first, *repeats = WAYS[way][:6]
    before = call.deadline

    assert await send_ask(agent, first, call.call_id) is None
    extended = call.deadline
    for each in repeats:
        assert await send_ask(agent, each, call.call_id) is None

    assert extended > before
    assert call.deadline == extended
    await agent.on_approval_response(p.ApprovalResponse(callId=call.call_id, approved=False,
                                                        error="Action denied by user"))
    await asyncio.wait_for(task, PATIENCE)


@pytest.mark.parametrize("way", ["approval_request", "pending_approval"])
async def test_an_ask_about_a_call_the_turn_does_not_hold_is_unknown_call_naming_it(way):
    agent, call, task = await waiting_payment()
    before = call.deadline

    refused = await send_ask(agent, way, "tc_not_a_real_call")

    assert (refused.payload.kind, refused.payload.data) == (
        "error", {"code": "unknown_call", "callId": "tc_not_a_real_call"})
    assert call.deadline == before and call.approval_id is None
    await agent.on_tool_result(p.ToolResult(callId=call.call_id, status="error", error="gone"))
    await asyncio.wait_for(task, PATIENCE)


async def test_a_pending_approval_result_opens_the_approval_with_no_words_the_page_did_not_send():
    agent, call, task = await waiting_payment()

    assert await send_ask(agent, "pending_approval", call.call_id) is None

    approval = await Approval.objects.aget(pk=call.approval_id)
    assert (approval.tool_name, approval.arguments, approval.message) == ("pay", {"amount": 42}, "")
    await agent.on_approval_response(p.ApprovalResponse(callId=call.call_id, approved=False,
                                                        error="Action denied by user"))
    await asyncio.wait_for(task, PATIENCE)


async def test_a_direct_answer_to_a_call_awaiting_its_approval_is_approval_pending_naming_the_call():
    agent, call, task = await waiting_payment()
    assert await send_ask(agent, "approval_request", call.call_id) is None

    refused = await agent.on_tool_result(
        p.ToolResult(callId=call.call_id, status="success", result={"paid": 1}))

    assert (refused.payload.kind, refused.payload.message, refused.payload.data) == (
        "error", "This call is waiting for the user's decision; answer with APPROVAL_RESPONSE.",
        {"code": "approval_pending", "callId": call.call_id})
    assert not call.future.done()
    await agent.on_approval_response(p.ApprovalResponse(callId=call.call_id, approved=False,
                                                        error="Action denied by user"))
    await asyncio.wait_for(task, PATIENCE)


SHOW = {"name": "show", "description": "Show a product", "risk": "low",
        "parameters": {"type": "OBJECT", "properties": {"sku": {"type": "STRING"}}}}


@pytest.mark.parametrize("answer, outcome", [
    ({"status": "success", "result": {"shown": True}}, Outcome(SUCCESS, result={"shown": True})),
    ({"status": "error", "error": "No such product"}, Outcome(ERROR, error="No such product")),
    ({"status": "error"}, Outcome(ERROR, error="The tool failed in the page.")),
], ids=["success", "error", "error-without-words"])
async def test_a_bare_answer_to_a_low_risk_call_is_its_outcome_for_the_model(answer, outcome):
    agent, call, task = await waiting_payment(SHOW, '/tool show {"sku": "A1"}')

    assert await agent.on_tool_result(p.ToolResult(callId=call.call_id, **answer)) is None

    assert call.future.result() == outcome
    await asyncio.wait_for(task, PATIENCE)
