"""An operator in charge of a chat runs the page's tools of risk none or
low, end to end inside one process: the page on a WebsocketCommunicator, the
real consumer and agent, the operator's step through ``operators.handover``
(the session command reaches the connection through the channel layer, as
from the admin). The call goes through the session's own ledger: the page
answers it as any call, its row says it was an operator's, the model is
told of it at the hand back."""
from __future__ import annotations

import asyncio
import json

import pytest
from asgiref.sync import sync_to_async

from agent.conversation import OPERATOR_TOOL
from aitp import notify
from aitp.ledger import OPERATOR_CALL, new_call_id
from aitp.models import OperatorAction, Session, ToolCall
from aitp.operator_commands import OPERATOR_TOOL as OPERATOR_TOOL_COMMAND
from operators import handover
from tests.aitp.conftest import ADD_TO_CART, api_key, connect, tenant  # noqa: F401 (fixtures)
from tests.aitp.test_agent import CHECKOUT, GO_TO_CART, PAY, fake, llm, open_shop  # noqa: F401 (fixtures)
from tests.aitp.test_takeover import hand_back, next_done, operator, stored_human, take_over  # noqa: F401
from tests.support.fake_anthropic import text_response

pytestmark = [pytest.mark.django_db(transaction=True)]

SOON = 10.0
PAGE_TOOLS = (ADD_TO_CART, GO_TO_CART, CHECKOUT, PAY)


async def in_charge(connect, api_key, operator):
    """A page offering tools of every risk, its chat taken over, its row
    showing the tools it declared."""
    page = await open_shop(connect, api_key, tools=PAGE_TOOLS)
    for _ in range(int(SOON / 0.05)):
        if len((await Session.objects.aget(pk=page.session_id)).tools) == len(PAGE_TOOLS):
            break
        await asyncio.sleep(0.05)
    assert (await take_over(page.session_id, operator)).taken
    await next_done(page)
    return page


async def runs(session_id: str, user, tool: str, arguments: dict) -> str | None:
    session = await Session.objects.aget(pk=session_id)
    return await sync_to_async(handover.session_operator_runs_tool)(
        session=session, user=user, tool=tool, arguments=arguments)


async def ended_call(call_id: str) -> ToolCall:
    for _ in range(int(SOON / 0.05)):
        row = await ToolCall.objects.filter(call_id=call_id).afirst()
        if row is not None and row.status not in ("pending", "sent", "running"):
            return row
        await asyncio.sleep(0.05)
    raise AssertionError(f"call {call_id} never ended")


async def test_an_operator_in_charge_runs_a_low_risk_page_tool_which_the_page_answers_through_the_ledger(
        llm, connect, api_key, operator):
    page = await in_charge(connect, api_key, operator)

    call_id = await runs(page.session_id, operator, "add_to_cart", {"quantity": 2})
    frame = await page.recv_until("TOOL_CALL", SOON)
    await page.send("TOOL_RESULT", {"callId": frame["payload"]["callId"], "status": "success",
                                    "result": {"cartCount": 2}})
    row = await ended_call(call_id)

    assert frame["payload"] == {"callId": call_id, "name": "add_to_cart", "args": {"quantity": 2}}
    assert (row.status, row.result, row.origin, row.risk) == ("success", {"cartCount": 2}, "client", "low")
    assert row.tool_use_id == OPERATOR_CALL + call_id
    action = await OperatorAction.objects.aget(session_id=page.session_id, action="session_operator_tool")
    assert action.user_id == operator.pk
    assert action.data == {"tool": "add_to_cart", "arguments": {"quantity": 2}, "call_id": call_id,
                           "channel": "admin"}
    assert llm.requests == []


async def test_a_page_tool_of_risk_none_runs_for_the_operator_too(llm, connect, api_key, operator):
    page = await in_charge(connect, api_key, operator)

    call_id = await runs(page.session_id, operator, "go_to_cart", {})
    frame = await page.recv_until("TOOL_CALL", SOON)
    await page.send("TOOL_RESULT", {"callId": call_id, "status": "success", "result": None})

    assert frame["payload"]["name"] == "go_to_cart"
    assert (await ended_call(call_id)).status == "success"


@pytest.mark.parametrize("tool", ["checkout", "pay"])
async def test_a_page_tool_that_needs_an_approval_is_not_offered_to_the_operator_and_is_refused(
        llm, connect, api_key, operator, tool):
    page = await in_charge(connect, api_key, operator)
    session = await Session.objects.aget(pk=page.session_id)

    offered = [t["name"] for t in handover.operator_tools(session)]
    with pytest.raises(ValueError, match="no tool"):
        await runs(page.session_id, operator, tool, {})

    assert offered == ["add_to_cart", "go_to_cart"]
    assert not await OperatorAction.objects.filter(action="session_operator_tool").aexists()


@pytest.mark.parametrize("tool", ["checkout", "pay"])
async def test_the_connection_itself_refuses_an_operator_call_of_a_tool_that_needs_an_approval(
        llm, connect, api_key, operator, tool):
    # A command that reached the session whatever the admin checked (the
    # page's tools as its row showed them may be older than the page's own).
    page = await in_charge(connect, api_key, operator)
    call_id = new_call_id()

    await sync_to_async(notify.session_command)(page.session_id, OPERATOR_TOOL_COMMAND, operator="Jane Doe",
                                                call_id=call_id, tool=tool, arguments={})
    row = await ended_call(call_id)

    assert (row.status, row.error) == ("unavailable", "Only the page's tools of risk none or low can be run "
                                                      "by an operator.")
    assert await page.ws.receive_nothing(0.3)


async def test_an_operator_call_with_arguments_the_tool_does_not_take_ends_invalid_and_never_reaches_the_page(
        llm, connect, api_key, operator):
    page = await in_charge(connect, api_key, operator)

    call_id = await runs(page.session_id, operator, "add_to_cart", {"quantity": "many"})
    row = await ended_call(call_id)

    assert row.status == "invalid_args" and row.error.startswith("Invalid arguments")
    assert await page.ws.receive_nothing(0.3)


async def test_an_operator_not_in_charge_cannot_run_a_page_tool(llm, connect, api_key, operator):
    page = await open_shop(connect, api_key, tools=PAGE_TOOLS)
    for _ in range(int(SOON / 0.05)):
        if (await Session.objects.aget(pk=page.session_id)).tools:
            break
        await asyncio.sleep(0.05)

    assert await runs(page.session_id, operator, "add_to_cart", {"quantity": 1}) is None
    assert not await ToolCall.objects.filter(session_id=page.session_id).aexists()


async def test_after_the_hand_back_the_model_is_told_which_page_tool_the_operator_ran_and_what_it_answered(
        llm, connect, api_key, operator):
    page = await in_charge(connect, api_key, operator)
    call_id = await runs(page.session_id, operator, "add_to_cart", {"quantity": 2})
    await page.recv_until("TOOL_CALL", SOON)
    await page.send("TOOL_RESULT", {"callId": call_id, "status": "success", "result": {"cartCount": 2}})
    await ended_call(call_id)
    for _ in range(int(SOON / 0.05)):
        if OPERATOR_TOOL in [b["human"] for b in await stored_human(page.session_id)]:
            break
        await asyncio.sleep(0.05)

    assert await hand_back(page.session_id, operator)
    await next_done(page)
    llm.enqueue(text_response("Two are in your cart."))
    await page.send("USER_INPUT", {"modality": "text", "content": "how many?"})
    await next_done(page)

    told = [block["text"] for block in llm.requests[0]["messages"][-1]["content"] if block["type"] == "text"]
    ran = '[The human operator Jane Doe ran the page tool add_to_cart {"quantity": 2}: ' \
          + json.dumps({"cartCount": 2}, separators=(",", ":")) + "]"
    assert ran in told


async def test_the_page_leaving_while_an_operator_call_waits_ends_the_call_disconnected(
        llm, connect, api_key, operator):
    page = await in_charge(connect, api_key, operator)
    call_id = await runs(page.session_id, operator, "add_to_cart", {"quantity": 1})
    await page.recv_until("TOOL_CALL", SOON)

    await page.close()
    row = await ended_call(call_id)

    assert row.status == "disconnected"
