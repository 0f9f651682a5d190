"""An operator in charge of a chat held by another process: the page user's
socket on a daphne process, the operator's steps taken here (as the admin
on another process does), carried over the channel layer; and two operators
taking over the same chat at once."""
from __future__ import annotations

import asyncio
import threading

import pytest
from asgiref.sync import sync_to_async
from django.contrib.auth import get_user_model
from django.db import connection

from agent.conversation import HANDED_BACK, OPERATOR, TAKEN_OVER, TO_OPERATOR
from aitp.models import OperatorAction, Session, ToolCall
from aitp.transcript import OPERATOR_JOINED, OPERATOR_LEFT
from aitp_client import AitpClient
from aitp_client.frames import turn_done
from operators import handover
from tests.aitp.test_resume_processes import ORIGIN, SOON, raw_key  # noqa: F401 (fixture)
from tests.aitp.test_takeover import hand_back, operator_says, stored_human, take_over
from tests.support.people import make_session

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.redis]


def staff(name: str):
    return get_user_model().objects.create_user(name, password="x", first_name=name.title(), is_staff=True)


async def test_an_operator_on_another_process_takes_over_writes_and_hands_back(daphne_factory, raw_key):
    server = daphne_factory()
    jane = await sync_to_async(staff)("jane")
    page = AitpClient(server.ws_url(), api_key=raw_key, origin=ORIGIN)
    ack = await page.connect(timeout=SOON)
    await page.context_update(url="/", title="Home")
    session_id = ack["sessionId"]

    await take_over(session_id, jane)
    joined = await page.recv_until(turn_done, SOON)
    closed = await page.say("can a person help me?", timeout=SOON)
    await operator_says(session_id, jane, "I can. What is it?")
    reply = await page.recv_until(turn_done, SOON)
    await hand_back(session_id, jane, note="Asked for help, nothing more.")
    left = await page.recv_until(turn_done, SOON)
    answered = await page.say("hello", timeout=SOON)
    await page.close()

    assert joined["payload"]["chunk"] == OPERATOR_JOINED.format(operator="Jane")
    assert [f["payload"]["chunk"] for f in closed if f["type"] == "AGENT_RESPONSE"] == [""]
    assert reply["payload"]["chunk"] == "I can. What is it?"
    assert left["payload"]["chunk"] == OPERATOR_LEFT.format(operator="Jane")
    assert answered[-1]["payload"]["chunk"]  # the model answers again
    assert [b["human"] for b in await stored_human(session_id)] == [TAKEN_OVER, TO_OPERATOR, OPERATOR, HANDED_BACK]


async def test_an_operator_on_another_process_runs_a_page_tool_through_the_process_that_holds_the_session(
        daphne_factory, raw_key):
    server = daphne_factory()
    jane = await sync_to_async(staff)("jane")
    page = AitpClient(server.ws_url(), api_key=raw_key, origin=ORIGIN)
    ack = await page.connect(timeout=SOON)
    tool = {"name": "open_product", "description": "Open a product's page", "risk": "none",
            "parameters": {"type": "OBJECT", "properties": {"id": {"type": "STRING"}}, "required": ["id"]}}
    await page.context_update(url="/", title="Home", tools=[tool])
    session_id = ack["sessionId"]
    for _ in range(int(SOON / 0.05)):
        if (await Session.objects.aget(pk=session_id)).tools:
            break
        await asyncio.sleep(0.05)
    await take_over(session_id, jane)
    await page.recv_until(turn_done, SOON)

    session = await Session.objects.aget(pk=session_id)
    call_id = await sync_to_async(handover.session_operator_runs_tool)(
        session=session, user=jane, tool="open_product", arguments={"id": "p1"})
    call = await page.recv_until("TOOL_CALL", SOON)
    await page.tool_result(call_id, result={"opened": "p1"})
    for _ in range(int(SOON / 0.05)):
        row = await ToolCall.objects.aget(call_id=call_id)
        if row.status == "success":
            break
        await asyncio.sleep(0.05)
    await page.close()

    assert call["payload"] == {"callId": call_id, "name": "open_product", "args": {"id": "p1"}}
    assert (row.status, row.result) == ("success", {"opened": "p1"})


def test_two_operators_taking_over_the_same_chat_at_once_leave_exactly_one_in_charge(db):
    from aitp import tenancy

    session = make_session(tenancy.tenant_create(slug="race", name="Race"))
    operators = [staff(name) for name in ("ann", "bob", "cyd", "dan")]
    start = threading.Barrier(len(operators))
    answers: dict[str, handover.InCharge] = {}

    def click(user) -> None:
        start.wait()
        try:
            answers[user.username] = handover.session_take_over(session=session, user=user)
        finally:
            connection.close()

    threads = [threading.Thread(target=click, args=(user,)) for user in operators]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    winners = [name for name, answer in answers.items() if answer.taken]
    assert len(winners) == 1
    assert {answer.name for answer in answers.values()} == {winners[0].title()}
    row = Session.objects.get(pk=session.pk)
    assert row.operator.username == winners[0]
    assert OperatorAction.objects.filter(session=session, action="session_take_over").count() == 1
