"""Asking for a person, end to end inside one process: a page on a
WebsocketCommunicator, the real consumer and agent, the real Anthropic SDK
against the fake Messages API, a key that offers ``ask_for_a_person``."""
from __future__ import annotations

import asyncio

import pytest
from asgiref.sync import sync_to_async

from aitp import alerts, tenancy
from aitp.models import Session, ToolCall
from connection.handoff import ASK_FOR_A_PERSON, NONE_FREE, WAITING
from tests.aitp.conftest import ORIGIN, api_key, connect, tenant  # noqa: F401 (fixtures)
from tests.aitp.test_agent import fake, llm, open_shop, until_done  # noqa: F401 (fixtures)
from tests.aitp.test_takeover import next_done, operator, received_within, take_over  # noqa: F401 (fixture)
from tests.support.fake_anthropic import text_response, tool_use_response

pytestmark = [pytest.mark.django_db(transaction=True)]

SOON = 10.0


@pytest.fixture
def handoff_key(api_key):
    api_key.handoff = True
    api_key.save(update_fields=["handoff"])
    return api_key


@pytest.fixture
def alerted(monkeypatch) -> list[tuple]:
    """The tenant alerts the connection sends, by name and arguments."""
    sent: list[tuple] = []
    monkeypatch.setattr(alerts, "send_in_background", lambda fn, *args: sent.append((fn.__name__, *args)),
                        raising=False)
    return sent


def asks_for_a_person(reason: str = "wants a refund"):
    return tool_use_response([("toolu_person", ASK_FOR_A_PERSON, {"reason": reason})])


def waiting_events(frames: list[dict]) -> list[dict]:
    return [f["payload"] for f in frames if f["type"] == "SYSTEM_EVENT" and f["payload"]["kind"] == "waiting"]


async def asked(page) -> list[dict]:
    await page.send("USER_INPUT", {"modality": "text", "content": "I want to talk to a human"})
    return await until_done(page, timeout=SOON)


def offered_tools(request: dict) -> list[str]:
    return [tool["name"] for tool in request.get("tools", [])]


async def test_a_key_that_offers_a_person_gives_its_agent_the_tool_and_another_key_does_not(
        llm, connect, api_key, tenant, alerted):
    offering, raw = await sync_to_async(tenancy.key_create)(tenant=tenant, name="help", allowed_origins=[ORIGIN])
    offering.handoff, offering.raw = True, raw
    await offering.asave(update_fields=["handoff"])
    llm.enqueue(text_response("Hello."), text_response("Hello again."))
    for key in (api_key, offering):
        page = await open_shop(connect, key)
        await page.send("USER_INPUT", {"modality": "text", "content": "hi"})
        await until_done(page, timeout=SOON)

    assert ASK_FOR_A_PERSON not in offered_tools(llm.requests[0])
    assert ASK_FOR_A_PERSON in offered_tools(llm.requests[1])


async def test_the_agent_asking_for_a_person_tells_the_page_marks_the_session_waiting_and_alerts_the_tenant(
        llm, connect, handoff_key, alerted):
    llm.enqueue(asks_for_a_person(), text_response("I have asked a colleague to join; meanwhile I am here."))
    page = await open_shop(connect, handoff_key)

    frames = await asked(page)

    assert waiting_events(frames) == [{"kind": "waiting", "message": WAITING, "data": {"reason": "operator_handoff"}}]
    assert frames[-1]["payload"]["chunk"] == "I have asked a colleague to join; meanwhile I am here."
    row = await Session.objects.aget(pk=page.session_id)
    assert row.handoff_requested_at is not None and row.handoff_reason == "wants a refund"
    assert alerted == [("handoff_requested", page.session_id)]
    result = llm.requests[1]["messages"][-1]["content"][0]
    assert result["type"] == "tool_result" and "operator_asked" in str(result["content"])
    call = await ToolCall.objects.aget(session_id=page.session_id)
    assert (call.name, call.status) == (ASK_FOR_A_PERSON, "success")


async def test_when_no_operator_takes_the_chat_in_time_the_page_is_told_and_the_agent_knows_it(
        llm, connect, handoff_key, alerted, settings):
    settings.OWLLAYER_HANDOFF_WAIT_SECONDS = 1.0
    llm.enqueue(asks_for_a_person(), text_response("A colleague is asked."), text_response("Let me help then."))
    page = await open_shop(connect, handoff_key)
    await asked(page)

    over = await page.recv_until("SYSTEM_EVENT", timeout=SOON, kind="waiting")
    await page.send("USER_INPUT", {"modality": "text", "content": "still nobody?"})
    answer = await next_done(page)

    assert over["payload"] == {
        "kind": "waiting", "message": NONE_FREE, "data": {"reason": "operator_handoff", "over": True}}
    row = await Session.objects.aget(pk=page.session_id)
    assert row.handoff_requested_at is None and row.handoff_reason == ""
    told = [block.get("text", "") for block in llm.requests[2]["messages"][-1]["content"]]
    assert any(text.startswith("[No human operator was free") for text in told)
    assert answer["chunk"] == "Let me help then."


async def test_an_operator_taking_over_while_the_chat_waits_ends_the_wait_and_nothing_says_none_is_free(
        llm, connect, handoff_key, alerted, operator, settings):
    settings.OWLLAYER_HANDOFF_WAIT_SECONDS = 1.0
    llm.enqueue(asks_for_a_person(), text_response("A colleague is asked."))
    page = await open_shop(connect, handoff_key)
    await asked(page)

    assert (await take_over(page.session_id, operator)).taken
    joined = await next_done(page)
    later = await received_within(page, 2.0)

    assert joined["chunk"].startswith("Jane Doe has joined")
    assert waiting_events(later) == []
    row = await Session.objects.aget(pk=page.session_id)
    assert row.handoff_requested_at is None and row.operator_name == "Jane Doe"


async def test_asking_again_while_the_chat_waits_keeps_the_first_request_and_alerts_once(
        llm, connect, handoff_key, alerted):
    llm.enqueue(asks_for_a_person("refund"), text_response("Asked."),
                asks_for_a_person("still refund"), text_response("Still asked."))
    page = await open_shop(connect, handoff_key)
    await asked(page)
    first = await Session.objects.aget(pk=page.session_id)
    again = await asked(page)

    row = await Session.objects.aget(pk=page.session_id)
    assert (row.handoff_requested_at, row.handoff_reason) == (first.handoff_requested_at, "refund")
    assert len(waiting_events(again)) == 1
    assert alerted == [("handoff_requested", page.session_id)]


async def test_the_page_leaving_while_the_chat_waits_stops_the_wait(llm, connect, handoff_key, alerted, settings):
    settings.OWLLAYER_HANDOFF_WAIT_SECONDS = 1.0
    llm.enqueue(asks_for_a_person(), text_response("Asked."))
    page = await open_shop(connect, handoff_key)
    await asked(page)
    await page.close()

    await asyncio.sleep(1.5)  # past the wait, had it gone on

    row = await Session.objects.aget(pk=page.session_id)
    assert row.ended_at is not None
    # The wait, had it run to its end, would have cleared it; an ended
    # session is not counted as waiting anyway.
    assert row.handoff_requested_at is not None
