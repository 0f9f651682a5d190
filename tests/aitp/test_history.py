"""A page reads its conversation again with its resume token
(docs/protocol.md §3b): after a reload the widget draws the earlier
messages from the server, never another visitor's, and reading spends
nothing."""
from __future__ import annotations

import json
from datetime import timedelta

import pytest
from asgiref.sync import sync_to_async
from django.test import AsyncClient
from django.urls import reverse
from django.utils import timezone

from aitp import tenancy
from aitp.models import ApiKey, Session
from tests.aitp.conftest import ADD_TO_CART, ORIGIN
from tests.aitp.test_agent import fake, llm, turn  # noqa: F401 (fixtures)
from tests.aitp.test_resume import OTHER_ORIGIN, dropped, opened
from tests.support.fake_anthropic import text_response, tool_use_response

pytestmark = [pytest.mark.django_db(transaction=True)]


@pytest.fixture(autouse=True)
def closed_with_its_socket(settings):
    settings.OWLLAYER_RESUME_HOLD_SECONDS = 0


async def read(raw_key: str, token: str, *, origin: str = ORIGIN, body: bytes | None = None):
    """What the page's POST to the conversation address answers."""
    sent = body if body is not None else json.dumps({"apiKey": raw_key, "token": token}).encode()
    return await AsyncClient().post(reverse("conversation"), data=sent, content_type="text/plain",
                                    headers={"Origin": origin})


async def conversation_of_two_turns(llm, connect, api_key):
    """A page that asked twice (once with a tool call), then dropped; its ACK."""
    llm.enqueue(text_response("Hello Ada."),
                tool_use_response([("toolu_1", "add_to_cart", {"quantity": 1})]),
                text_response("Added to your cart."))
    page, ack = await opened(connect, api_key.raw, resume={})
    await page.context(url="/products/headphones", title="Pro Headphones", tools=[ADD_TO_CART])
    await turn(page, "My name is Ada.")
    await page.send("USER_INPUT", {"modality": "text", "content": "Add one, please."})
    call = (await page.recv_until("TOOL_CALL"))["payload"]["callId"]
    await page.send("TOOL_RESULT", {"callId": call, "status": "success", "result": {"added": True}})
    await page.recv_until("AGENT_RESPONSE", done=True)
    await dropped(page)
    return ack


async def test_a_reloaded_page_reads_the_words_and_tool_lines_of_its_conversation(llm, connect, api_key):
    ack = await conversation_of_two_turns(llm, connect, api_key)

    answer = await read(api_key.raw, ack["resumeToken"])

    assert answer.status_code == 200
    assert answer["Access-Control-Allow-Origin"] == ORIGIN
    body = answer.json()
    assert body["sessionId"] == ack["sessionId"] and body["truncated"] is False
    assert [(m["role"], m.get("text") or m.get("name"), m["turn"]) for m in body["messages"]] == [
        ("user", "My name is Ada.", 1), ("assistant", "Hello Ada.", 1),
        ("user", "Add one, please.", 2), ("tool", "add_to_cart", 2), ("assistant", "Added to your cart.", 2)]


async def test_reading_spends_nothing_and_the_token_still_continues_the_session(llm, connect, api_key):
    ack = await conversation_of_two_turns(llm, connect, api_key)
    await read(api_key.raw, ack["resumeToken"])

    page, again = await opened(connect, api_key.raw, resume={"token": ack["resumeToken"]})

    assert (again["sessionId"], again["resumed"]) == (ack["sessionId"], True)
    await page.close()


async def test_the_socket_holding_the_session_reads_with_its_current_token_and_not_the_spent_one(
        llm, connect, api_key):
    ack = await conversation_of_two_turns(llm, connect, api_key)
    page, again = await opened(connect, api_key.raw, resume={"token": ack["resumeToken"]})

    current = await read(api_key.raw, again["resumeToken"])
    spent = await read(api_key.raw, ack["resumeToken"])

    assert current.status_code == 200 and len(current.json()["messages"]) == 5
    assert spent.status_code == 404 and spent.json()["error"]["code"] == "unknown_conversation"
    await page.close()


async def test_a_forged_token_reads_nothing(llm, connect, api_key):
    ack = await conversation_of_two_turns(llm, connect, api_key)

    answer = await read(api_key.raw, ack["sessionId"] + "." + "A" * 43)

    assert answer.status_code == 404 and answer.json()["error"]["code"] == "unknown_conversation"
    assert "messages" not in answer.json()


@pytest.mark.parametrize("token", ["", "nonsense", "ses_1.short", "x" * 200])
async def test_a_token_that_is_not_one_reads_nothing(api_key, token):
    answer = await read(api_key.raw, token)

    assert answer.status_code == 404 and answer.json()["error"]["code"] == "unknown_conversation"


async def test_a_token_past_the_window_reads_nothing(llm, connect, api_key):
    ack = await conversation_of_two_turns(llm, connect, api_key)
    await Session.objects.filter(id=ack["sessionId"]).aupdate(ended_at=timezone.now() - timedelta(seconds=601))

    assert (await read(api_key.raw, ack["resumeToken"])).status_code == 404


async def test_with_no_resume_window_nothing_is_read(llm, connect, api_key, settings):
    ack = await conversation_of_two_turns(llm, connect, api_key)
    settings.OWLLAYER_RESUME_WINDOW_SECONDS = 0

    assert (await read(api_key.raw, ack["resumeToken"])).status_code == 404


async def test_a_token_read_with_another_key_of_the_tenant_reads_nothing(llm, connect, api_key, tenant):
    ack = await conversation_of_two_turns(llm, connect, api_key)
    _, other_raw = await sync_to_async(tenancy.key_create)(tenant=tenant, name="other", allowed_origins=[ORIGIN])

    assert (await read(other_raw, ack["resumeToken"])).status_code == 404


async def test_a_token_read_from_another_origin_the_key_allows_reads_nothing(llm, connect, tenant):
    _, raw = await sync_to_async(tenancy.key_create)(tenant=tenant, name="two sites",
                                                     allowed_origins=[ORIGIN, OTHER_ORIGIN])
    llm.enqueue(text_response("Hello."))
    page, ack = await opened(connect, raw, resume={})
    await turn(page, "Hi.")
    await dropped(page)

    answer = await read(raw, ack["resumeToken"], origin=OTHER_ORIGIN)

    assert answer.status_code == 404


async def test_an_origin_the_key_does_not_allow_is_refused_and_not_given_the_cors_header(llm, connect, api_key):
    ack = await conversation_of_two_turns(llm, connect, api_key)

    answer = await read(api_key.raw, ack["resumeToken"], origin=OTHER_ORIGIN)

    assert answer.status_code == 403 and answer.json()["error"]["code"] == "origin_not_allowed"
    assert "Access-Control-Allow-Origin" not in answer


@pytest.mark.parametrize("code, reason", [(1008, "ended by an operator"), (1008, "api key revoked"),
                                          (1008, "usage limit exceeded"), (1011, "internal error"),
                                          (1003, "unsupported data")])
async def test_a_session_whose_close_was_final_reads_nothing(llm, connect, api_key, code, reason):
    ack = await conversation_of_two_turns(llm, connect, api_key)
    await Session.objects.filter(id=ack["sessionId"]).aupdate(close_code=code, close_reason=reason)

    assert (await read(api_key.raw, ack["resumeToken"])).status_code == 404


async def test_a_revoked_key_is_refused_as_a_handshake_would_be(llm, connect, api_key):
    ack = await conversation_of_two_turns(llm, connect, api_key)
    await sync_to_async(tenancy.key_revoke)(key=api_key)

    answer = await read(api_key.raw, ack["resumeToken"])

    assert answer.status_code == 403 and answer.json()["error"]["code"] == "api_key_revoked"


@pytest.mark.parametrize("change, code", [
    ({"status": ApiKey.Status.DISABLED}, "api_key_disabled"),
    ({"expires_at": timezone.now() - timedelta(minutes=1)}, "api_key_expired"),
])
async def test_a_disabled_or_expired_key_is_refused_as_a_handshake_would_be(llm, connect, api_key, change, code):
    ack = await conversation_of_two_turns(llm, connect, api_key)
    await ApiKey.objects.filter(pk=api_key.pk).aupdate(**change)

    answer = await read(api_key.raw, ack["resumeToken"])

    assert answer.status_code == 403 and answer.json()["error"]["code"] == code


async def test_a_key_that_is_not_one_is_unauthorised(api_key):
    answer = await read("pk_live_nonsense", "ses_1." + "A" * 43)

    assert answer.status_code == 401 and answer.json()["error"]["code"] == "invalid_api_key"


@pytest.mark.parametrize("body", [b"", b"not json", b"[]", b'{"apiKey": 1, "token": "x"}', b'{"token": "x"}',
                                  b'{"apiKey": "k", "token": "x", "pad": "' + b"x" * 5000 + b'"}',
                                  b"\xff\xfe"])
async def test_a_body_that_is_not_a_key_and_a_token_gets_invalid_message(api_key, body):
    answer = await read(api_key.raw, "", body=body)

    assert answer.status_code == 400 and answer.json()["error"]["code"] == "invalid_message"


async def test_reading_is_a_post_only(api_key):
    answer = await AsyncClient().get(reverse("conversation"), headers={"Origin": ORIGIN})

    assert answer.status_code == 405
