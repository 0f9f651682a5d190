"""A session continued on a new socket (docs/protocol.md §3a): a reloaded
page or a dropped network offers its resume token, and the conversation goes
on where it was -- never another visitor's, never twice from one token.

Here the session closes with its socket (``OWLLAYER_RESUME_HOLD_SECONDS=0``,
as when the next socket reaches another process): the conversation goes on
from the database. A session held by its process past its socket is
``test_resume_held.py``'s."""
from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest
from asgiref.sync import sync_to_async
from django.test import override_settings
from django.utils import timezone

from aitp import notify, tenancy
from aitp.models import ApiKey, ConversationMessage, Session
from connection import opening
from tests.aitp.conftest import ADD_TO_CART, ORIGIN
from tests.aitp.test_agent import assert_well_formed, fake, llm, turn  # noqa: F401 (fixtures)
from tests.support.fake_anthropic import text_response, tool_use_response

pytestmark = [pytest.mark.django_db(transaction=True)]

OTHER_ORIGIN = "https://other.example"


@pytest.fixture(autouse=True)
def closed_with_its_socket(settings):
    settings.OWLLAYER_RESUME_HOLD_SECONDS = 0


async def opened(connect, raw_key: str, *, resume: dict | None = None, origin: str = ORIGIN):
    """A page that shook hands (offering ``resume`` when given) and its ACK's payload."""
    page = await connect(origin=origin)
    extra = {} if resume is None else {"resume": resume}
    ack = await page.handshake(raw_key, **extra)
    assert ack["type"] == "HANDSHAKE_ACK", ack
    await page.context(url="/products/headphones", title="Pro Headphones")
    return page, ack["payload"]


async def dropped(page) -> None:
    """The page's socket goes away as a reload or a lost network does."""
    await page.ws.disconnect(code=1001, timeout=10)


async def test_the_deployed_client_that_offers_no_resume_is_given_no_token(connect, api_key):
    page, ack = await opened(connect, api_key.raw)

    assert "resumeToken" not in ack and "resumed" not in ack
    assert (await Session.objects.aget(id=ack["sessionId"])).resume_token_hash == ""
    await page.close()


async def test_a_client_that_can_resume_gets_a_token_for_its_next_socket(connect, api_key):
    page, ack = await opened(connect, api_key.raw, resume={})

    assert ack["resumed"] is False
    assert ack["resumeToken"].startswith(ack["sessionId"] + ".")
    await page.close()


@override_settings(OWLLAYER_RESUME_WINDOW_SECONDS=0)
async def test_with_no_resume_window_no_token_is_given(connect, api_key):
    page, ack = await opened(connect, api_key.raw, resume={})

    assert "resumeToken" not in ack
    await page.close()


async def test_a_reloaded_page_continues_its_session_and_the_model_sees_what_was_said(
        llm, connect, api_key):
    llm.enqueue(text_response("Hello Ada."), text_response("Your name is Ada."))
    first, ack = await opened(connect, api_key.raw, resume={})
    await turn(first, "My name is Ada.")
    await dropped(first)

    second, again = await opened(connect, api_key.raw, resume={"token": ack["resumeToken"]})
    await turn(second, "What is my name?")

    assert again["sessionId"] == ack["sessionId"] and again["resumed"] is True
    assert again["resumeToken"] != ack["resumeToken"]
    request = llm.requests[-1]
    assert_well_formed(request)
    said = [block["text"] for message in request["messages"] for block in message["content"]
            if block["type"] == "text" and not block["text"].startswith("[page]")]
    assert said == ["My name is Ada.", "Hello Ada.", "What is my name?"]
    stored = [(m.seq, m.role, m.turn) async for m in
              ConversationMessage.objects.filter(session_id=ack["sessionId"]).order_by("seq")]
    assert stored == [(1, "user", 1), (2, "assistant", 1), (3, "user", 2), (4, "assistant", 2)]
    row = await Session.objects.aget(id=ack["sessionId"])
    assert row.resumes == 1 and row.ended_at is None
    await second.close()


async def test_a_call_cut_by_the_drop_has_one_result_when_the_conversation_goes_on(llm, connect, api_key):
    llm.enqueue(tool_use_response([("toolu_cut", "add_to_cart", {"quantity": 1})]),
                text_response("I could not tell whether it was added."))
    first = await connect()
    ack = (await first.handshake(api_key.raw, resume={}))["payload"]
    await first.context(url="/products/headphones", title="Pro Headphones", tools=[ADD_TO_CART])
    await first.send("USER_INPUT", {"modality": "text", "content": "Add one, please."})
    await first.recv_until("TOOL_CALL")
    await dropped(first)  # the call was never answered

    second, _ = await opened(connect, api_key.raw, resume={"token": ack["resumeToken"]})
    await turn(second, "Did it work?")

    request = llm.requests[-1]
    assert_well_formed(request)
    results = [block for message in request["messages"] for block in message["content"]
               if block["type"] == "tool_result"]
    assert [r["tool_use_id"] for r in results] == ["toolu_cut"]
    assert results[0].get("is_error") is True
    await second.close()


async def test_a_token_serves_one_socket_and_the_next_offer_of_it_gets_a_new_session(connect, api_key):
    first, ack = await opened(connect, api_key.raw, resume={})
    await dropped(first)
    second, continued = await opened(connect, api_key.raw, resume={"token": ack["resumeToken"]})
    await dropped(second)

    third, fresh = await opened(connect, api_key.raw, resume={"token": ack["resumeToken"]})

    assert continued["resumed"] is True
    assert fresh["resumed"] is False and fresh["sessionId"] != ack["sessionId"]
    assert fresh["resumeToken"].startswith(fresh["sessionId"] + ".")
    await third.close()


async def test_two_sockets_offering_one_token_at_once_continue_it_once(connect, api_key):
    first, ack = await opened(connect, api_key.raw, resume={})
    await dropped(first)

    (one, a), (two, b) = await asyncio.gather(
        opened(connect, api_key.raw, resume={"token": ack["resumeToken"]}),
        opened(connect, api_key.raw, resume={"token": ack["resumeToken"]}))

    assert sorted([a["resumed"], b["resumed"]]) == [False, True]
    assert {a["sessionId"], b["sessionId"]} & {ack["sessionId"]} == {ack["sessionId"]}
    assert a["sessionId"] != b["sessionId"]
    await one.close()
    await two.close()


async def test_a_forged_token_gets_a_new_session(connect, api_key):
    first, ack = await opened(connect, api_key.raw, resume={})
    await dropped(first)
    forged = ack["sessionId"] + "." + "A" * 43

    page, fresh = await opened(connect, api_key.raw, resume={"token": forged})

    assert fresh["resumed"] is False and fresh["sessionId"] != ack["sessionId"]
    await page.close()


@pytest.mark.parametrize("token", ["", "nonsense", "ses_1.short", "x" * 200])
async def test_a_token_that_is_not_one_gets_a_new_session(connect, api_key, token):
    page, fresh = await opened(connect, api_key.raw, resume={"token": token})

    assert fresh["resumed"] is False
    await page.close()


async def test_a_token_past_the_window_gets_a_new_session(connect, api_key):
    first, ack = await opened(connect, api_key.raw, resume={})
    await dropped(first)
    await Session.objects.filter(id=ack["sessionId"]).aupdate(
        ended_at=timezone.now() - timedelta(seconds=601))

    page, fresh = await opened(connect, api_key.raw, resume={"token": ack["resumeToken"]})

    assert fresh["resumed"] is False and fresh["sessionId"] != ack["sessionId"]
    await page.close()


async def test_a_token_offered_with_another_key_gets_a_new_session_of_that_key(connect, api_key, tenant):
    first, ack = await opened(connect, api_key.raw, resume={})
    await dropped(first)
    _, other_raw = await sync_to_async(tenancy.key_create)(tenant=tenant, name="other",
                                                            allowed_origins=[ORIGIN])

    page, fresh = await opened(connect, other_raw, resume={"token": ack["resumeToken"]})

    assert fresh["resumed"] is False and fresh["sessionId"] != ack["sessionId"]
    assert (await Session.objects.aget(id=fresh["sessionId"])).api_key_id != api_key.id
    await page.close()


async def test_a_token_offered_from_another_origin_gets_a_new_session(connect, tenant):
    key, raw = await sync_to_async(tenancy.key_create)(tenant=tenant, name="two sites",
                                                       allowed_origins=[ORIGIN, OTHER_ORIGIN])
    first, ack = await opened(connect, raw, resume={})
    await dropped(first)

    page, fresh = await opened(connect, raw, resume={"token": ack["resumeToken"]}, origin=OTHER_ORIGIN)

    assert fresh["resumed"] is False and fresh["sessionId"] != ack["sessionId"]
    await page.close()


@pytest.mark.parametrize("code, reason", [(1008, "ended by an operator"), (1008, "api key revoked"),
                                          (1008, "usage limit exceeded"), (1011, "internal error"),
                                          (1003, "unsupported data")])
async def test_a_session_whose_close_was_final_is_not_continued(connect, api_key, code, reason):
    first, ack = await opened(connect, api_key.raw, resume={})
    await dropped(first)
    await Session.objects.filter(id=ack["sessionId"]).aupdate(close_code=code, close_reason=reason)

    page, fresh = await opened(connect, api_key.raw, resume={"token": ack["resumeToken"]})

    assert fresh["resumed"] is False and fresh["sessionId"] != ack["sessionId"]
    await page.close()


async def test_a_token_of_a_revoked_key_is_refused_as_the_key_is(connect, api_key):
    first, ack = await opened(connect, api_key.raw, resume={})
    await dropped(first)
    await sync_to_async(tenancy.key_revoke)(key=api_key)

    page = await connect()
    refused = await page.handshake(api_key.raw, resume={"token": ack["resumeToken"]})
    closed = await page.recv()

    assert refused["payload"]["data"]["code"] == "api_key_revoked"
    assert closed == {"type": "__close__", "code": 1008, "reason": "api key revoked"}
    assert (await Session.objects.aget(id=ack["sessionId"])).ended_at is not None


@pytest.mark.parametrize("change, code, reason", [
    ({"status": ApiKey.Status.DISABLED}, "api_key_disabled", "api key disabled"),
    ({"expires_at": timezone.now() - timedelta(minutes=1)}, "api_key_expired", "api key expired"),
])
async def test_a_token_of_a_disabled_or_expired_key_is_refused_as_the_key_is(
        connect, api_key, change, code, reason):
    first, ack = await opened(connect, api_key.raw, resume={})
    await dropped(first)
    await ApiKey.objects.filter(pk=api_key.pk).aupdate(**change)

    page = await connect()
    refused = await page.handshake(api_key.raw, resume={"token": ack["resumeToken"]})
    closed = await page.recv()

    assert refused["payload"]["data"]["code"] == code
    assert closed == {"type": "__close__", "code": 1008, "reason": reason}
    assert (await Session.objects.aget(id=ack["sessionId"])).ended_at is not None


async def test_a_newer_socket_with_the_token_takes_the_session_over_and_the_older_is_told(
        connect, api_key):
    # A reload or a dropped network the server has not seen close yet, or a
    # second tab with a copy of the first one's storage.
    first, ack = await opened(connect, api_key.raw, resume={})

    newer, again = await opened(connect, api_key.raw, resume={"token": ack["resumeToken"]})
    goodbye = await first.recv_until("SYSTEM_EVENT", kind="disconnect")
    closed = await first.recv()

    assert (again["sessionId"], again["resumed"]) == (ack["sessionId"], True)
    assert goodbye["payload"]["message"] == "This conversation goes on in another tab or window."
    assert closed == {"type": "__close__", "code": 4409, "reason": "continued on another socket"}
    row = await Session.objects.aget(id=ack["sessionId"])
    assert row.ended_at is None and [s["code"] for s in row.sockets] == [4409, None]
    await newer.close()


async def test_a_session_whose_socket_will_not_close_is_not_taken_and_a_new_one_opens(
        connect, api_key, monkeypatch):
    monkeypatch.setattr(opening, "RESUME_WAIT_SECONDS", 0.5)
    first, ack = await opened(connect, api_key.raw, resume={})
    # The older socket's process never answers: the session stays open.
    await Session.objects.filter(id=ack["sessionId"]).aupdate(process="")

    async def unheard(*args, **kwargs):
        return None

    monkeypatch.setattr(notify, "asend", unheard)

    copy, other = await opened(connect, api_key.raw, resume={"token": ack["resumeToken"]})

    assert other["resumed"] is False and other["sessionId"] != ack["sessionId"]
    assert (await Session.objects.aget(id=ack["sessionId"])).ended_at is None
    await first.close()
    await copy.close()


async def test_the_session_keeps_each_of_its_sockets_open_and_close(connect, api_key):
    first, ack = await opened(connect, api_key.raw, resume={})
    await dropped(first)
    second, again = await opened(connect, api_key.raw, resume={"token": ack["resumeToken"]})
    await second.ws.disconnect(code=1006, timeout=10)
    third, _ = await opened(connect, api_key.raw, resume={"token": again["resumeToken"]})

    row = await Session.objects.aget(id=ack["sessionId"])
    sockets = row.sockets

    assert [(s["code"], s["reason"]) for s in sockets] == [
        (1001, "client disconnected"), (1006, "client disconnected"), (None, "")]
    assert sockets[0]["opened_at"] == row.started_at and sockets[-1]["closed_at"] is None
    assert all(s["opened_at"] <= s["closed_at"] for s in sockets[:-1])
    assert sockets[1]["opened_at"] >= sockets[0]["closed_at"]
    await third.close()


async def test_a_socket_offering_a_token_gets_none_of_that_sessions_commands_before_it_has_it(
        connect, api_key, monkeypatch):
    first, ack = await opened(connect, api_key.raw, resume={})
    gate, asked = asyncio.Event(), asyncio.Event()
    real = opening.continue_session

    async def held(*args, **kwargs):
        asked.set()
        await gate.wait()
        return await real(*args, **kwargs)

    monkeypatch.setattr(opening, "continue_session", held)
    copy = await connect()
    await copy.send("HANDSHAKE_INIT", {"apiKey": api_key.raw, "protocolVersion": "1.0.0",
                                       "resume": {"token": ack["resumeToken"]}})
    await asyncio.wait_for(asked.wait(), 10)

    await notify.asend(notify.session_group(ack["sessionId"]), "session.command",
                       command="end", message="Goodbye, first tab.")
    ended = await first.recv_until("SYSTEM_EVENT", kind="disconnect")
    gate.set()
    copy_ack = await copy.recv(10)

    assert ended["payload"]["message"] == "Goodbye, first tab."
    # The session ended for good (1008): the copy got a session of its own, and no goodbye.
    assert copy_ack["type"] == "HANDSHAKE_ACK" and copy_ack["payload"]["sessionId"] != ack["sessionId"]
    await copy.close()


async def test_a_result_for_a_call_of_the_old_socket_is_unknown_on_the_new_one(connect, api_key):
    first = await connect()
    ack = (await first.handshake(api_key.raw, resume={}))["payload"]
    await first.context(tools=[ADD_TO_CART])
    await first.send("USER_INPUT", {"modality": "text", "content": '/tool add_to_cart {"quantity": 1}'})
    call = (await first.recv_until("TOOL_CALL"))["payload"]["callId"]
    await dropped(first)

    second, _ = await opened(connect, api_key.raw, resume={"token": ack["resumeToken"]})
    await second.send("TOOL_RESULT", {"callId": call, "status": "success", "result": {"added": True}})
    error = await second.recv_until("SYSTEM_EVENT", kind="error")

    assert error["payload"]["data"]["code"] == "unknown_call"
    await second.close()
