"""An operator in charge of a chat, end to end inside one process: a page on
a WebsocketCommunicator, the real consumer and agent, the real Anthropic SDK
against the fake Messages API, and the operator's steps through
``operators.handover`` (the session command reaches the connection through
the channel layer, as from the admin).

Every frame the page receives passes the deployed client's check (``Page``).
"""
from __future__ import annotations

import asyncio
import base64
import contextlib

import pytest
from asgiref.sync import sync_to_async
from django.contrib.auth import get_user_model

from agent.conversation import HANDED_BACK, OPERATOR, TAKEN_OVER, TO_OPERATOR
from aitp.models import ConversationMessage, Session, ToolCall
from aitp.transcript import OPERATOR_JOINED, OPERATOR_LEFT
from connection.turns import OPERATOR_READS_TEXT
from operators import handover
from tests.aitp.conftest import ADD_TO_CART, api_key, connect, tenant  # noqa: F401 (fixtures)
from tests.aitp.test_agent import fake, llm, open_shop, until_done  # noqa: F401 (fixtures)
from tests.support.fake_anthropic import text_response, tool_use_response

pytestmark = [pytest.mark.django_db(transaction=True)]

SOON = 10.0


@pytest.fixture
def operator(db):
    return get_user_model().objects.create_user("jane", password="x", first_name="Jane", last_name="Doe",
                                                is_staff=True)


async def take_over(session_id: str, user) -> handover.InCharge:
    session = await Session.objects.aget(pk=session_id)
    return await sync_to_async(handover.session_take_over)(session=session, user=user)


async def operator_says(session_id: str, user, text: str) -> bool:
    session = await Session.objects.aget(pk=session_id)
    return await sync_to_async(handover.session_operator_says)(session=session, user=user, text=text)


async def hand_back(session_id: str, user, note: str = "") -> bool:
    session = await Session.objects.aget(pk=session_id)
    return await sync_to_async(handover.session_hand_back)(session=session, user=user, note=note)


async def next_done(page) -> dict:
    frames = await until_done(page, timeout=SOON)
    return frames[-1]["payload"]


async def received_within(page, seconds: float) -> list[dict]:
    frames = []
    with contextlib.suppress(TimeoutError):
        while True:
            frames.append(await page.recv(seconds))
    return frames


async def stored_human(session_id: str) -> list[dict]:
    return [block async for message in ConversationMessage.objects.filter(session_id=session_id).order_by("seq")
            for block in message.content if isinstance(block, dict) and "human" in block]


async def in_charge_of_idle_page(connect, api_key, operator):
    page = await open_shop(connect, api_key, tools=[ADD_TO_CART])
    assert (await take_over(page.session_id, operator)).taken
    joined = await next_done(page)
    assert joined["chunk"] == OPERATOR_JOINED.format(operator="Jane Doe")
    return page


async def test_an_operator_taking_over_a_streaming_answer_cuts_it_and_the_page_gets_done_with_what_it_was_shown(
        llm, connect, api_key, operator):
    llm.enqueue(text_response("one two three four five six seven eight nine ten", chunks=10, event_delay=0.3))
    page = await open_shop(connect, api_key)
    await page.send("USER_INPUT", {"modality": "text", "content": "tell me a story"})
    first = await page.recv(SOON)
    assert first["type"] == "AGENT_RESPONSE" and not first["payload"]["done"]

    await take_over(page.session_id, operator)
    frames = await until_done(page, timeout=SOON)
    shown = "".join(f["payload"]["chunk"] for f in [first, *frames[:-1]] if f["type"] == "AGENT_RESPONSE")
    joined = await next_done(page)

    assert frames[-1]["payload"]["chunk"] == shown and shown
    assert not shown.endswith("ten")
    assert joined["chunk"] == OPERATOR_JOINED.format(operator="Jane Doe")
    assert await received_within(page, 1.0) == []  # the rest of the stream, had it gone on
    said = await ConversationMessage.objects.filter(session_id=page.session_id, role="assistant").alast()
    assert said.content[0]["text"] == shown.strip()
    assert [b["human"] for b in await stored_human(page.session_id)] == [TAKEN_OVER]


async def test_a_page_call_pending_at_the_takeover_ends_cancelled_once_and_its_late_result_is_refused(
        llm, connect, api_key, operator):
    llm.enqueue(tool_use_response([("toolu_1", "add_to_cart", {"productId": "p1", "quantity": 1})]))
    page = await open_shop(connect, api_key)
    await page.send("USER_INPUT", {"modality": "text", "content": "add it"})
    call = await page.recv_until("TOOL_CALL", SOON)

    await take_over(page.session_id, operator)
    cut = await next_done(page)
    joined = await next_done(page)
    await page.send("TOOL_RESULT", {"callId": call["payload"]["callId"], "status": "success", "result": {}})
    late = await page.recv_until("SYSTEM_EVENT", SOON)

    assert cut["chunk"] == "" and joined["chunk"].startswith("Jane Doe")
    rows = [row async for row in ToolCall.objects.filter(session_id=page.session_id)]
    assert [(row.call_id, row.status) for row in rows] == [(call["payload"]["callId"], "cancelled")]
    assert late["payload"]["data"]["code"] == "unknown_call"
    assert len(llm.requests) == 1


async def test_while_an_operator_is_in_charge_each_message_of_the_page_user_is_theirs_and_closed_at_once(
        llm, connect, api_key, operator):
    page = await in_charge_of_idle_page(connect, api_key, operator)

    await page.send("USER_INPUT", {"modality": "text", "content": "is anyone there?"})
    first = await next_done(page)
    await page.send("USER_INPUT", {"modality": "text", "content": "hello?"})
    second = await next_done(page)

    assert first["chunk"] == second["chunk"] == ""
    assert llm.requests == []
    stored = await stored_human(page.session_id)
    assert [(b["human"], b["text"]) for b in stored] == [
        (TAKEN_OVER, ""), (TO_OPERATOR, "is anyone there?"), (TO_OPERATOR, "hello?")]


async def test_a_spoken_message_while_an_operator_is_in_charge_is_refused_as_text_only_and_closed(
        llm, connect, api_key, operator):
    page = await in_charge_of_idle_page(connect, api_key, operator)

    speech = base64.b64encode(bytes(16000)).decode()  # half a second of 16 kHz silence
    await page.send("USER_INPUT", {"modality": "audio", "content": speech, "mimeType": "audio/pcm;rate=16000"})
    frames = await until_done(page, timeout=SOON)

    codes = [f["payload"]["data"]["code"] for f in frames if f["type"] == "SYSTEM_EVENT"]
    assert codes == [OPERATOR_READS_TEXT]
    assert frames[-1]["payload"]["chunk"] == ""
    assert llm.requests == []


async def test_the_operators_words_reach_the_page_as_one_whole_answer_with_done_saying_whose_they_are(
        llm, connect, api_key, operator):
    page = await in_charge_of_idle_page(connect, api_key, operator)

    assert await operator_says(page.session_id, operator, "Hi, I am Jane. How can I help?")
    frames = await until_done(page, timeout=SOON)

    assert [f["payload"] for f in frames] == [
        {"chunk": "Hi, I am Jane. How can I help?", "done": True, "operator": "Jane Doe"}]
    assert (await stored_human(page.session_id))[-1] == {
        "type": "text", "text": "Hi, I am Jane. How can I help?", "human": OPERATOR, "operator": "Jane Doe"}


async def test_an_operator_not_in_charge_cannot_write_to_the_page(llm, connect, api_key, operator):
    other = await sync_to_async(get_user_model().objects.create_user)("max", password="x", is_staff=True)
    page = await in_charge_of_idle_page(connect, api_key, operator)

    assert not await operator_says(page.session_id, other, "I am not in charge")
    assert not await hand_back(page.session_id, other)
    assert (await take_over(page.session_id, other)) == handover.InCharge(False, "Jane Doe")
    assert await received_within(page, 0.5) == []


async def test_after_the_hand_back_the_model_answers_the_next_message_told_what_was_said_meanwhile(
        llm, connect, api_key, operator):
    page = await in_charge_of_idle_page(connect, api_key, operator)
    await page.send("USER_INPUT", {"modality": "text", "content": "I want a refund"})
    await next_done(page)
    await operator_says(page.session_id, operator, "Your refund is on its way.")
    await next_done(page)

    assert await hand_back(page.session_id, operator, note="Refund 42 issued; offer a discount code.")
    left = await next_done(page)
    llm.enqueue(text_response("Glad it is sorted. Here is a code: THANKS10."))
    await page.send("USER_INPUT", {"modality": "text", "content": "thanks!"})
    answer = await next_done(page)

    assert left["chunk"] == OPERATOR_LEFT.format(operator="Jane Doe")
    assert answer["chunk"] == "Glad it is sorted. Here is a code: THANKS10."
    told = [block["text"] for block in llm.requests[0]["messages"][-1]["content"] if block["type"] == "text"]
    assert told[0].startswith("[A human operator, Jane Doe, took this chat over")
    assert told[1] == "[The user, to the human operator:] I want a refund"
    assert told[2] == "[The human operator Jane Doe, to the user:] Your refund is on its way."
    assert "Refund 42 issued; offer a discount code." in told[3]
    assert told[4] == "thanks!"
    assert all(set(block) <= {"type", "text", "cache_control"}
               for block in llm.requests[0]["messages"][-1]["content"])
    assert [b["human"] for b in await stored_human(page.session_id)] == [
        TAKEN_OVER, TO_OPERATOR, OPERATOR, HANDED_BACK]
    row = await Session.objects.aget(pk=page.session_id)
    assert (row.operator_id, row.operator_name) == (None, "")


async def test_the_page_user_leaving_while_an_operator_is_in_charge_ends_the_session_as_always(
        llm, connect, api_key, operator):
    page = await in_charge_of_idle_page(connect, api_key, operator)

    await page.close()
    for _ in range(50):
        row = await Session.objects.aget(pk=page.session_id)
        if row.ended_at is not None:
            break
        await asyncio.sleep(0.1)

    assert row.ended_at is not None
    assert not await operator_says(page.session_id, operator, "still there?")


async def test_speech_from_the_microphone_while_an_operator_is_in_charge_is_refused_as_text_only_and_closed(
        llm, connect, api_key, operator):
    page = await in_charge_of_idle_page(connect, api_key, operator)

    chunk = base64.b64encode(bytes(8192)).decode()  # a quarter second of 16 kHz silence
    await page.send("AUDIO_STREAM", {"data": chunk, "mimeType": "audio/pcm;rate=16000"})
    await page.send("VOICE_INPUT_END", {"reason": "user_stop"})
    frames = await until_done(page, timeout=SOON)

    codes = [f["payload"]["data"]["code"] for f in frames if f["type"] == "SYSTEM_EVENT"]
    assert codes == [OPERATOR_READS_TEXT]
    assert ("VOICE_STATE_EVENT", "turn_complete") in [(f["type"], f["payload"].get("event")) for f in frames]
    assert llm.requests == []


async def test_a_page_reloaded_while_an_operator_is_in_charge_stays_with_the_operator_until_the_hand_back(
        llm, connect, api_key, operator, settings):
    settings.OWLLAYER_RESUME_HOLD_SECONDS = 0  # the session closes with its socket and is continued
    first = await connect()
    ack = (await first.handshake(api_key.raw, resume={}))["payload"]
    await first.context(url="/", title="Home")
    await take_over(ack["sessionId"], operator)
    await next_done(first)
    await first.ws.disconnect(code=1001, timeout=10)

    second = await connect()
    again = (await second.handshake(api_key.raw, resume={"token": ack["resumeToken"]}))["payload"]
    await second.context(url="/", title="Home")
    await second.send("USER_INPUT", {"modality": "text", "content": "still there?"})
    closed = await next_done(second)
    await hand_back(ack["sessionId"], operator)
    await next_done(second)
    llm.enqueue(text_response("I am back."))
    await second.send("USER_INPUT", {"modality": "text", "content": "hello"})
    answer = await next_done(second)

    assert again["sessionId"] == ack["sessionId"] and again["resumed"] is True
    assert closed["chunk"] == ""
    assert answer["chunk"] == "I am back." and len(llm.requests) == 1
    assert [b["human"] for b in await stored_human(ack["sessionId"])] == [
        TAKEN_OVER, TO_OPERATOR, HANDED_BACK]
