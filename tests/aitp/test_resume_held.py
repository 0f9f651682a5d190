"""A session held by its process past its socket (docs/protocol.md §3a): the
turn that was running when a resuming page's socket dropped goes on, and the
page's next socket on this process gets what it had not handled, once and in
order -- the rest of the answer, a call it never saw -- while a call it had
handled and not answered ends ``disconnected``."""
from __future__ import annotations

import asyncio
import json
import time
from dataclasses import asdict
from datetime import timedelta

import pytest
from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from django.test import override_settings
from django.utils import timezone

from aitp import notify, resume, tenancy
from aitp.models import ApiKey, Session, ToolCall
from aitp.operator_commands import RELAY
from aitp.store.port import HandshakeInfo
from connection import holding
from tests.aitp.conftest import ADD_TO_CART, ORIGIN
from tests.aitp.test_agent import fake, llm, until_done  # noqa: F401 (fixtures)
from tests.support.fake_anthropic import text_response, tool_use_response

pytestmark = [pytest.mark.django_db(transaction=True)]

SOON = 10
ANSWER = "One pair of Pro Headphones is in your cart now, ready for checkout whenever you are."
OTHER_ORIGIN = "https://other.example"


async def opened(connect, raw_key: str, resume: dict, *, origin: str = ORIGIN, tools=(ADD_TO_CART,)):
    page = await connect(origin=origin)
    ack = await page.handshake(raw_key, resume=resume)
    assert ack["type"] == "HANDSHAKE_ACK", ack
    return page, ack


async def mid_answer(llm, connect, api_key, question: str, *, frames: int):
    """A page asked ``question`` and got the first ``frames`` frames of a long
    streamed answer: (page, ack, those frames)."""
    llm.enqueue(text_response(ANSWER, chunks=12, event_delay=0.05))
    page, ack = await opened(connect, api_key.raw, {})
    await page.send("USER_INPUT", {"modality": "text", "content": question})
    return page, ack, [await page.recv_until("AGENT_RESPONSE", SOON) for _ in range(frames)]


async def held_after(page, session_id: str, *, code: int = 1006) -> None:
    await page.ws.disconnect(code=code, timeout=SOON)
    assert holding.holding(session_id)


async def closed_row(session_id: str) -> Session:
    """The session's row once closed (its connection's teardown writes it)."""
    for _ in range(200):
        row = await Session.objects.aget(id=session_id)
        if row.ended_at is not None:
            return row
        await asyncio.sleep(0.05)
    raise AssertionError(f"session {session_id} still open")


def text_of(frames: list[dict]) -> str:
    """The answer the page showed: its deltas (the done frame repeats the whole text)."""
    return "".join(f["payload"]["chunk"] for f in frames
                   if f["type"] == "AGENT_RESPONSE" and not f["payload"]["done"])


async def test_every_frame_to_a_page_that_can_resume_is_numbered_in_order_after_its_ack(
        llm, connect, api_key):
    llm.enqueue(text_response(ANSWER, chunks=6))
    page, ack = await opened(connect, api_key.raw, {})
    await page.send("CONTEXT_UPDATE", {"url": "/", "title": "Home", "activeTools": [], "context": {}})
    await page.send("USER_INPUT", {"modality": "text", "content": "Hello"})
    frames = [await page.recv(SOON)] + await until_done(page)

    assert ack["meta"] == {"seq": 0}
    assert [f["meta"]["seq"] for f in frames] == list(range(1, len(frames) + 1))
    await page.close()


async def test_the_deployed_client_gets_no_numbers_and_its_session_ends_with_its_socket(connect, api_key):
    page = await connect(origin=ORIGIN)
    ack = await page.handshake(api_key.raw)
    await page.send("CONTEXT_UPDATE", {"url": "/", "title": "Home", "activeTools": [], "context": {}})
    reply = await page.recv(SOON)

    assert "meta" not in ack and "meta" not in reply
    await page.ws.disconnect(code=1006, timeout=SOON)
    assert not holding.holding(ack["payload"]["sessionId"])


async def test_an_answer_streaming_when_the_socket_drops_completes_once_on_the_next(llm, connect, api_key):
    first, ack, seen = await mid_answer(llm, connect, api_key, "Add the headphones.", frames=3)
    session_id = ack["payload"]["sessionId"]
    await held_after(first, session_id)

    second, again = await opened(connect, api_key.raw, {"token": ack["payload"]["resumeToken"],
                                                        "lastSeq": first.last_seq})
    rest = await until_done(second)

    assert again["payload"]["resumed"] is True and again["payload"]["sessionId"] == session_id
    assert again["payload"]["capabilities"] == ack["payload"]["capabilities"]
    assert again["meta"]["seq"] == first.last_seq
    assert text_of(seen) + text_of(rest) == ANSWER
    assert [f["meta"]["seq"] for f in rest] == list(range(first.last_seq + 1, first.last_seq + 1 + len(rest)))
    assert sum(1 for f in seen + rest if f["type"] == "AGENT_RESPONSE" and f["payload"]["done"]) == 1
    await second.close()


async def test_frames_sent_after_the_last_one_the_page_handled_are_sent_again_in_order(
        llm, connect, api_key):
    llm.enqueue(text_response(ANSWER, chunks=6))
    first, ack = await opened(connect, api_key.raw, {})
    await first.send("USER_INPUT", {"modality": "text", "content": "Hello"})
    everything = await until_done(first)
    handled = everything[:2]  # the page handled two; the rest were lost with the network
    await held_after(first, ack["payload"]["sessionId"])

    second, again = await opened(connect, api_key.raw, {"token": ack["payload"]["resumeToken"],
                                                        "lastSeq": handled[-1]["meta"]["seq"]})
    replayed = [await second.recv(SOON) for _ in everything[2:]]

    assert [f["id"] for f in replayed] == [f["id"] for f in everything[2:]]
    assert text_of(handled + replayed) == ANSWER
    await second.close()


async def test_a_page_that_handled_everything_is_sent_nothing_again(llm, connect, api_key):
    llm.enqueue(text_response(ANSWER, chunks=3), text_response("Next."))
    first, ack = await opened(connect, api_key.raw, {})
    await first.send("USER_INPUT", {"modality": "text", "content": "Hello"})
    await until_done(first)
    await held_after(first, ack["payload"]["sessionId"])

    second, _ = await opened(connect, api_key.raw, {"token": ack["payload"]["resumeToken"],
                                                    "lastSeq": first.last_seq})
    await second.send("USER_INPUT", {"modality": "text", "content": "And now?"})
    frames = await until_done(second)

    assert text_of(frames) == "Next."
    await second.close()


async def held_with_a_call(llm, connect, api_key, tool_use_id: str, answer: str):
    """A page asked for a call, got its TOOL_CALL, and dropped: (first page, ack, the call)."""
    llm.enqueue(tool_use_response([(tool_use_id, "add_to_cart", {"quantity": 1})]), text_response(answer))
    first, ack = await opened(connect, api_key.raw, {})
    await first.context(tools=[ADD_TO_CART])
    await first.send("USER_INPUT", {"modality": "text", "content": "Add one."})
    call = await first.recv_until("TOOL_CALL", SOON)
    await held_after(first, ack["payload"]["sessionId"])
    return first, ack, call


def results_told(llm) -> list[dict]:
    return [b for m in llm.requests[-1]["messages"] for b in m["content"] if b["type"] == "tool_result"]


async def test_a_tool_call_the_page_never_handled_is_sent_again_once_and_its_answer_taken(
        llm, connect, api_key):
    first, ack, call = await held_with_a_call(llm, connect, api_key, "toolu_again", "Added.")
    before = call["meta"]["seq"] - 1  # the page lost the call with its network

    second, _ = await opened(connect, api_key.raw, {"token": ack["payload"]["resumeToken"], "lastSeq": before})
    again = await second.recv_until("TOOL_CALL", SOON)
    await second.send("TOOL_RESULT", {"callId": again["payload"]["callId"], "status": "success",
                                      "result": {"cart": 1}})
    frames = await until_done(second)

    assert again["id"] == call["id"] and again["meta"]["seq"] == call["meta"]["seq"]
    assert text_of(frames) == "Added." and not [f for f in frames if f["type"] == "TOOL_CALL"]
    row = await ToolCall.objects.aget(call_id=call["payload"]["callId"])
    assert row.status == "success"
    tool_results = results_told(llm)
    assert len(tool_results) == 1 and not tool_results[0].get("is_error")
    await second.close()


async def test_a_tool_call_the_page_handled_and_never_answered_ends_disconnected_and_is_not_sent_again(
        llm, connect, api_key):
    first, ack, call = await held_with_a_call(llm, connect, api_key, "toolu_lost",
                                              "I cannot tell whether it was added.")

    second, _ = await opened(connect, api_key.raw, {"token": ack["payload"]["resumeToken"],
                                                    "lastSeq": first.last_seq})
    frames = await until_done(second)

    assert not [f for f in frames if f["type"] == "TOOL_CALL"]
    assert text_of(frames) == "I cannot tell whether it was added."
    row = await ToolCall.objects.aget(call_id=call["payload"]["callId"])
    assert row.status == "disconnected"
    tool_results = results_told(llm)
    assert len(tool_results) == 1 and tool_results[0]["is_error"] is True
    assert "may or may not have run" in str(tool_results[0]["content"])
    await second.close()


async def test_an_answer_for_a_call_of_the_dropped_socket_is_taken_once_on_the_next(llm, connect, api_key):
    first, ack, call = await held_with_a_call(llm, connect, api_key, "toolu_late", "Added.")

    # The page ran the call; its answer goes out on the next socket, before it says what it handled.
    second, _ = await opened(connect, api_key.raw, {"token": ack["payload"]["resumeToken"],
                                                    "lastSeq": call["meta"]["seq"] - 1})
    resent = await second.recv_until("TOOL_CALL", SOON)
    answer = {"callId": call["payload"]["callId"], "status": "success", "result": {"cart": 1}}
    await second.send("TOOL_RESULT", answer)
    await second.send("TOOL_RESULT", answer)
    frames = await until_done(second)

    assert resent["payload"]["callId"] == call["payload"]["callId"]
    errors = [f for f in frames if f["type"] == "SYSTEM_EVENT" and f["payload"]["kind"] == "error"]
    assert [e["payload"]["data"]["code"] for e in errors] == ["unknown_call"]
    await second.close()


@override_settings(OWLLAYER_RESUME_HOLD_SECONDS=0.2)
async def test_a_held_session_nobody_continues_ends_as_its_socket_did_once_its_turn_is_over(
        llm, connect, api_key):
    llm.enqueue(text_response(ANSWER, chunks=6, event_delay=0.05))
    first, ack = await opened(connect, api_key.raw, {})
    session_id = ack["payload"]["sessionId"]
    await first.send("USER_INPUT", {"modality": "text", "content": "Hello"})
    await first.recv_until("AGENT_RESPONSE", SOON)
    await held_after(first, session_id, code=1001)

    row = await closed_row(session_id)

    assert row.close_code == 1001 and not holding.holding(session_id)

    # Still within the resume window: the conversation goes on from the database.
    second, again = await opened(connect, api_key.raw, {"token": ack["payload"]["resumeToken"],
                                                        "lastSeq": first.last_seq})
    assert again["payload"]["resumed"] is True and again["meta"] == {"seq": 0}
    await second.close()


async def test_a_socket_that_closes_as_the_page_leaves_is_not_held(connect, api_key):
    page, ack = await opened(connect, api_key.raw, {})
    await page.ws.disconnect(code=1000, timeout=SOON)

    assert not holding.holding(ack["payload"]["sessionId"])
    assert (await Session.objects.aget(id=ack["payload"]["sessionId"])).close_code == 1000


async def test_an_operator_ending_a_held_session_ends_it_and_its_token(connect, api_key):
    page, ack = await opened(connect, api_key.raw, {})
    session_id = ack["payload"]["sessionId"]
    await held_after(page, session_id)

    await notify.asend(notify.session_group(session_id), "session.command", command="end")
    row = await closed_row(session_id)

    assert row.close_code == 1008 and not holding.holding(session_id)

    other, fresh = await opened(connect, api_key.raw, {"token": ack["payload"]["resumeToken"], "lastSeq": 0})
    assert fresh["payload"]["resumed"] is False and fresh["payload"]["sessionId"] != session_id
    await other.close()


# --- hostile tokens offered for a held session ------------------------------------------------


async def test_a_forged_token_for_a_held_session_gets_a_new_session_and_leaves_it_held(connect, api_key):
    page, ack = await opened(connect, api_key.raw, {})
    session_id = ack["payload"]["sessionId"]
    await held_after(page, session_id)
    forged = session_id + "." + "A" * 43

    other, fresh = await opened(connect, api_key.raw, {"token": forged, "lastSeq": 0})

    assert fresh["payload"]["resumed"] is False and fresh["payload"]["sessionId"] != session_id
    assert holding.holding(session_id)
    await other.close()


async def test_a_held_sessions_token_with_another_key_gets_a_new_session_of_that_key(connect, api_key, tenant):
    _, other_raw = await sync_to_async(tenancy.key_create)(tenant=tenant, name="other",
                                                            allowed_origins=[ORIGIN])
    page, ack = await opened(connect, api_key.raw, {})
    await held_after(page, ack["payload"]["sessionId"])

    other, fresh = await opened(connect, other_raw, {"token": ack["payload"]["resumeToken"], "lastSeq": 0})

    assert fresh["payload"]["sessionId"] != ack["payload"]["sessionId"] and fresh["payload"]["resumed"] is False
    assert holding.holding(ack["payload"]["sessionId"])
    await other.close()


async def test_a_held_sessions_token_from_another_origin_gets_a_new_session(connect, api_key):
    await ApiKey.objects.filter(pk=api_key.pk).aupdate(allowed_origins=[ORIGIN, OTHER_ORIGIN])
    page, ack = await opened(connect, api_key.raw, {})
    await held_after(page, ack["payload"]["sessionId"])

    other, fresh = await opened(connect, api_key.raw, {"token": ack["payload"]["resumeToken"], "lastSeq": 0},
                                origin=OTHER_ORIGIN)

    assert fresh["payload"]["sessionId"] != ack["payload"]["sessionId"]
    await other.close()


async def test_two_sockets_offering_a_held_sessions_token_at_once_continue_it_once(connect, api_key):
    page, ack = await opened(connect, api_key.raw, {})
    await held_after(page, ack["payload"]["sessionId"])
    offer = {"token": ack["payload"]["resumeToken"], "lastSeq": 0}

    (one, a), (two, b) = await asyncio.gather(opened(connect, api_key.raw, offer),
                                              opened(connect, api_key.raw, offer))

    assert sorted([a["payload"]["resumed"], b["payload"]["resumed"]]) == [False, True]
    await one.close()
    await two.close()


@pytest.mark.parametrize("change, code", [
    ({"status": ApiKey.Status.REVOKED}, "api_key_revoked"),
    ({"status": ApiKey.Status.DISABLED}, "api_key_disabled"),
    ({"expires_at": timezone.now() - timedelta(minutes=1)}, "api_key_expired"),
], ids=["revoked", "disabled", "expired"])
async def test_a_held_sessions_token_of_a_key_no_longer_usable_is_refused_as_the_key_is(
        connect, api_key, change, code):
    page, ack = await opened(connect, api_key.raw, {})
    await held_after(page, ack["payload"]["sessionId"])
    # Changed behind the server's back (no notice reaches the held session).
    await ApiKey.objects.filter(pk=api_key.pk).aupdate(**change)

    other = await connect(origin=ORIGIN)
    answer = await other.handshake(api_key.raw, resume={"token": ack["payload"]["resumeToken"], "lastSeq": 0})

    assert answer["payload"]["data"]["code"] == code
    assert (await other.recv(SOON))["code"] == 1008


async def test_revoking_the_key_of_a_held_session_ends_it_at_once(connect, api_key):
    page, ack = await opened(connect, api_key.raw, {})
    session_id = ack["payload"]["sessionId"]
    await held_after(page, session_id)

    await sync_to_async(tenancy.key_revoke)(key=api_key)
    row = await closed_row(session_id)

    assert row.close_code == 1008 and not holding.holding(session_id)


@pytest.mark.parametrize("last_seq", [-1, 1.5, "3", True, 2**60])
async def test_a_last_seq_that_is_not_a_frame_number_is_refused_as_an_invalid_handshake(
        connect, api_key, last_seq):
    page, ack = await opened(connect, api_key.raw, {})
    await held_after(page, ack["payload"]["sessionId"])

    other = await connect(origin=ORIGIN)
    answer = await other.handshake(api_key.raw, resume={"token": ack["payload"]["resumeToken"],
                                                        "lastSeq": last_seq})

    assert answer["type"] == "SYSTEM_EVENT" and answer["payload"]["data"]["code"] == "invalid_message"
    assert holding.holding(ack["payload"]["sessionId"])


async def test_a_last_seq_past_the_last_frame_sent_gets_nothing_again(llm, connect, api_key):
    llm.enqueue(text_response(ANSWER, chunks=3))
    first, ack = await opened(connect, api_key.raw, {})
    await first.send("USER_INPUT", {"modality": "text", "content": "Hello"})
    await until_done(first)
    await held_after(first, ack["payload"]["sessionId"])

    second, again = await opened(connect, api_key.raw, {"token": ack["payload"]["resumeToken"],
                                                        "lastSeq": 10**6})
    await second.send("CONTEXT_UPDATE", {"url": "/", "title": "Home", "activeTools": [], "context": {}})
    reply = await second.recv(SOON)

    assert again["meta"]["seq"] == first.last_seq
    assert reply["meta"]["seq"] == first.last_seq + 1 and reply["type"] != "AGENT_RESPONSE"
    await second.close()


async def test_a_session_that_cannot_be_held_closes_with_its_socket_as_before(connect, api_key, monkeypatch):
    from channels.layers import get_channel_layer

    page, ack = await opened(connect, api_key.raw, {})
    session_id = ack["payload"]["sessionId"]

    async def broken(*args, **kwargs):
        raise ConnectionError("the channel layer is down")

    monkeypatch.setattr(type(get_channel_layer()), "new_channel", broken)
    await page.ws.disconnect(code=1006, timeout=SOON)
    row = await closed_row(session_id)

    assert row.close_code == 1006 and not holding.holding(session_id)


async def test_a_newer_socket_while_the_older_still_looks_open_is_told_and_the_newer_gets_what_it_missed(
        llm, connect, api_key):
    first, ack, seen = await mid_answer(llm, connect, api_key, "Hello", frames=2)
    session_id = ack["payload"]["sessionId"]
    # The network dropped, but the server has not seen the first socket close.

    second, again = await opened(connect, api_key.raw, {"token": ack["payload"]["resumeToken"],
                                                        "lastSeq": seen[-1]["meta"]["seq"]})
    rest = await until_done(second)
    told = await first.recv_until("SYSTEM_EVENT", SOON, kind="disconnect")
    closed = await first.recv(SOON)

    assert again["payload"]["resumed"] is True and again["payload"]["sessionId"] == session_id
    assert again["meta"]["seq"] == seen[-1]["meta"]["seq"]
    assert text_of(seen) + text_of(rest) == ANSWER
    assert "meta" not in told and closed["code"] == 4409
    assert not [f for f in rest if f["type"] == "SYSTEM_EVENT" and f["payload"]["kind"] == "disconnect"]
    await second.close()


async def test_the_ack_names_the_last_question_taken_and_one_sent_again_with_its_id_is_taken_once(
        llm, connect, api_key):
    llm.enqueue(text_response(ANSWER, chunks=6, event_delay=0.05))
    first, ack = await opened(connect, api_key.raw, {})
    question = await first.send("USER_INPUT", {"modality": "text", "content": "Hello"})
    await first.recv_until("AGENT_RESPONSE", SOON)
    await held_after(first, ack["payload"]["sessionId"])

    second, again = await opened(connect, api_key.raw, {"token": ack["payload"]["resumeToken"],
                                                        "lastSeq": first.last_seq})
    await second.send("USER_INPUT", question["payload"], id=question["id"])  # not knowing it arrived
    frames = await until_done(second)
    await second.send("CONTEXT_UPDATE", {"url": "/", "title": "Home", "activeTools": [], "context": {}})
    after = await second.recv(SOON)

    assert again["meta"]["lastInput"] == question["id"]
    assert sum(1 for f in frames if f["type"] == "AGENT_RESPONSE" and f["payload"]["done"]) == 1
    assert after["type"] == "SYSTEM_EVENT" and after["payload"]["kind"] == "tools_effective"
    assert len(llm.requests) == 1
    await second.close()


# --- a socket on another process relays the held session (connection.relay) -----------------


async def relay_asked(session_id: str, token: str, raw_key: str, *, last_seq: int, answer_by: float,
                      channel: str, reply: str) -> resume.ResumeToken:
    """What a socket on another process sends the holder to relay the
    session (``connection.relay.relayed``); the token it offers next."""
    following = resume.new_token(session_id)
    info = HandshakeInfo(session_id=session_id, origin=ORIGIN, user_agent="pytest", viewport="1x1",
                         sdk_version="0.4.0", protocol_version="1.0.0", channel_name=channel,
                         process="elsewhere", resume_token_hash=following.secret_hash)
    await notify.asend(notify.session_group(session_id), "session.command", command=RELAY, reply=reply,
                       channel=channel, apiKey=raw_key, sessionId=session_id,
                       tokenHash=resume.parse(token).secret_hash, lastSeq=last_seq, info=asdict(info),
                       answerBy=answer_by)
    return following


async def test_a_held_session_relayed_elsewhere_sends_there_what_the_page_missed_and_is_held_again_after(
        llm, connect, api_key):
    first, ack, seen = await mid_answer(llm, connect, api_key, "Add the headphones.", frames=3)
    session_id = ack["payload"]["sessionId"]
    await held_after(first, session_id)
    layer = get_channel_layer()
    reply, relayed = await layer.new_channel(), await layer.new_channel()

    following = await relay_asked(session_id, ack["payload"]["resumeToken"], api_key.raw,
                                  last_seq=first.last_seq, answer_by=time.time() + 5, channel=relayed, reply=reply)
    answer = await asyncio.wait_for(layer.receive(reply), SOON)
    frames = []
    while not frames or not (frames[-1]["type"] == "AGENT_RESPONSE" and frames[-1]["payload"]["done"]):
        frames.append(json.loads((await asyncio.wait_for(layer.receive(relayed), SOON))["text"]))

    assert answer["type"] == "relay.accepted" and answer["position"] == first.last_seq
    assert text_of(seen) + text_of(frames) == ANSWER
    assert [f["meta"]["seq"] for f in frames] == list(range(first.last_seq + 1, first.last_seq + 1 + len(frames)))
    row = await Session.objects.aget(id=session_id)
    assert row.resumes == 1 and row.ended_at is None

    await notify.asend(notify.session_group(session_id), "session.command", command=RELAY, gone=True,
                       channel=relayed)
    back, again = await opened(connect, api_key.raw, {"token": following.text, "lastSeq": frames[-1]["meta"]["seq"]})

    assert (again["payload"]["sessionId"], again["payload"]["resumed"]) == (session_id, True)
    await back.close()


async def test_a_relay_asked_for_too_late_is_not_taken_up_and_the_token_still_continues_here(connect, api_key):
    page, ack = await opened(connect, api_key.raw, {})
    session_id = ack["payload"]["sessionId"]
    await held_after(page, session_id)
    layer = get_channel_layer()
    reply, relayed = await layer.new_channel(), await layer.new_channel()

    await relay_asked(session_id, ack["payload"]["resumeToken"], api_key.raw, last_seq=0,
                      answer_by=time.time() - 1, channel=relayed, reply=reply)
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(layer.receive(reply), 1.0)
    back, again = await opened(connect, api_key.raw, {"token": ack["payload"]["resumeToken"], "lastSeq": 0})

    assert (again["payload"]["sessionId"], again["payload"]["resumed"]) == (session_id, True)
    await back.close()
