"""The consumer's wiring: authentication, handshake, context, limits, close codes.

Each test talks to the real ASGI application through Channels'
WebsocketCommunicator; rows must be committed for the consumer's database
thread to see them, hence transaction=True.
"""
from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest
from django.test import override_settings
from django.utils import timezone

from aitp import row_writer, store, tenancy
from aitp.models import ApiKey, Session, ToolCall
from tests.aitp.conftest import ADD_TO_CART, CONSUMER_PATIENCE, ORIGIN, in_db, open_page
from tests.support.pages import patient

pytestmark = [pytest.mark.django_db(transaction=True)]


@pytest.fixture
def connect(connect):
    """The package's ``connect``, handing out patient pages (tests.support.pages)."""
    return patient(connect)


async def test_a_valid_handshake_gets_an_ack_with_a_session_and_integer_tool_limit(connect, api_key,
                                                                                  settings):
    settings.OWLLAYER_VOICE = False
    page = await connect()
    ack = await page.handshake(api_key.raw)
    assert ack["type"] == "HANDSHAKE_ACK"
    payload = ack["payload"]
    assert payload["sessionId"].startswith("ses_")
    assert payload["protocolVersion"] == "1.0.0"
    assert payload["maxActiveTools"] == 30
    assert "audio" not in payload["capabilities"]
    session = await Session.objects.aget(id=payload["sessionId"])
    assert session.origin == ORIGIN and session.viewport == "1440x900"
    await page.close()


async def test_the_key_may_come_from_the_query_string_alone(connect, api_key):
    page = await connect(query=f"apiKey={api_key.raw}")
    ack = await page.handshake(None)
    assert ack["type"] == "HANDSHAKE_ACK"
    await page.close()


async def test_different_keys_in_query_and_handshake_are_refused_with_1008(connect, api_key, tenant):
    _, other = await in_db(tenancy.key_create)(tenant=tenant)
    page = await connect(query=f"apiKey={other}")
    error = await page.handshake(api_key.raw)
    assert error["payload"]["kind"] == "error"
    assert error["payload"]["data"]["code"] == "api_key_mismatch"
    close = await page.recv()
    assert close == {"type": "__close__", "code": 1008, "reason": "api key mismatch"}


@pytest.mark.parametrize(
    "change, code",
    [
        ({"status": ApiKey.Status.REVOKED}, "api_key_revoked"),
        ({"status": ApiKey.Status.DISABLED}, "api_key_disabled"),
        ({"expires_at": timezone.now() - timedelta(seconds=1)}, "api_key_expired"),
    ],
)
async def test_a_key_that_cannot_be_used_is_refused_with_its_reason(connect, api_key, change, code):
    await ApiKey.objects.filter(pk=api_key.pk).aupdate(**change)
    page = await connect()
    error = await page.handshake(api_key.raw)
    assert error["payload"]["data"]["code"] == code
    assert (await page.recv())["code"] == 1008


async def test_an_unknown_key_is_refused_without_an_http_403(connect, api_key):
    page = await connect()
    error = await page.handshake(api_key.raw[:-2] + "zz")
    assert error["payload"]["data"]["code"] == "invalid_api_key"
    assert (await page.recv())["code"] == 1008


async def test_an_origin_not_on_the_key_list_is_refused(connect, api_key):
    page = await connect(origin="https://evil.example")
    error = await page.handshake(api_key.raw)
    assert error["payload"]["data"]["code"] == "origin_not_allowed"
    assert (await page.recv())["code"] == 1008


async def test_a_key_with_no_origin_list_accepts_a_client_without_origin(connect, tenant):
    _, raw = await in_db(tenancy.key_create)(tenant=tenant)
    page = await connect(origin=None)
    assert (await page.handshake(raw))["type"] == "HANDSHAKE_ACK"
    await page.close()


async def test_a_protocol_version_mismatch_is_an_error_then_1008(connect, api_key):
    page = await connect()
    error = await page.handshake(api_key.raw, protocolVersion="2.0.0")
    assert error["payload"]["data"]["code"] == "protocol_version_mismatch"
    assert (await page.recv())["code"] == 1008


async def test_messages_before_the_handshake_get_handshake_required(connect, api_key):
    page = await connect()
    await page.send("USER_INPUT", {"modality": "text", "content": "hi"})
    error = await page.recv()
    assert error["payload"]["data"]["code"] == "handshake_required"
    assert (await page.handshake(api_key.raw))["type"] == "HANDSHAKE_ACK"
    await page.close()


@override_settings(OWLLAYER_HANDSHAKE_TIMEOUT=0.2)
async def test_no_handshake_within_the_timeout_closes_the_socket(connect):
    page = await connect()
    error = await page.recv()
    assert error["payload"]["data"]["code"] == "handshake_timeout"
    assert (await page.recv())["code"] == 1008


async def test_the_concurrent_session_cap_refuses_one_more(connect, tenant):
    key, raw = await in_db(tenancy.key_create)(tenant=tenant, max_sessions=2)
    pages = []
    for _ in range(2):
        page = await connect()
        assert (await page.handshake(raw))["type"] == "HANDSHAKE_ACK"
        pages.append(page)
    extra = await connect()
    error = await extra.handshake(raw)
    assert error["payload"]["data"]["code"] == "session_limit"
    assert (await extra.recv())["code"] == 1008
    await pages[0].close()
    # A closed session frees its slot.
    again = await connect()
    assert (await again.handshake(raw))["type"] == "HANDSHAKE_ACK"
    await again.close()
    await pages[1].close()


async def test_a_context_update_replaces_the_snapshot_and_reports_effective_tools(connect, api_key):
    page = await connect()
    ack = await page.handshake(api_key.raw)
    effective = await page.context(url="/p/1", title="Headphones", tools=[ADD_TO_CART],
                                   context={"productId": "p1"})
    data = effective["payload"]["data"]
    assert [t["name"] for t in data["effectiveTools"]] == ["add_to_cart"]
    assert data["clientTools"][0]["risk"] == "low"
    assert data["serverTools"] == [] and data["ignoredClientTools"] == []
    await page.context(url="/p/1", title="Headphones", tools=[ADD_TO_CART], context={"productId": "p1"})
    await page.context(url="/cart", title="Cart", tools=[], context={})
    await page.close()  # the snapshot is written behind the connection; closing flushes it
    session = await Session.objects.aget(id=ack["payload"]["sessionId"])
    assert session.current_url == "/cart" and session.tools == [] and session.context == {}
    assert [entry["url"] for entry in session.page_history] == ["/p/1", "/cart"]


async def test_a_page_that_leaves_within_the_row_interval_has_its_snapshot_written_with_the_close(
        connect, api_key, monkeypatch):
    live_writes: list[dict] = []
    real_write = row_writer.LIVE_ROWS.write

    async def recorded(**write):
        live_writes.append(write)
        await real_write(**write)

    monkeypatch.setattr(row_writer.LIVE_ROWS, "write", recorded)
    monkeypatch.setattr(row_writer, "ROW_WRITE_INTERVAL", 3600)
    page = await connect()
    ack = await page.handshake(api_key.raw)
    effective = await page.context(url="/p/1", title="Headphones", tools=[ADD_TO_CART],
                                   context={"productId": "p1"})
    await page.close()
    session = await Session.objects.aget(id=ack["payload"]["sessionId"])
    assert live_writes == []
    assert (session.current_url, session.context) == ("/p/1", {"productId": "p1"})
    assert session.tools == effective["payload"]["data"]["clientTools"]
    assert [tool["name"] for tool in session.tools] == ["add_to_cart"]
    assert session.ended_at is not None and [v["url"] for v in session.page_history] == ["/p/1"]


async def test_too_many_tools_are_refused_and_the_previous_tools_kept(connect, api_key):
    page = await open_page(connect, api_key, tools=[ADD_TO_CART])
    many = [dict(ADD_TO_CART, name=f"tool_{i}") for i in range(31)]
    error = await page.context(tools=many)
    assert error["payload"]["data"]["code"] == "too_many_tools"
    await page.send("USER_INPUT", {"modality": "text", "content": "hello"})
    # The offline backend lists the page's tools: still the old set.
    done = await page.recv_until("AGENT_RESPONSE", done=True)
    assert "add_to_cart" in done["payload"]["chunk"]
    await page.close()


async def test_a_context_over_64_kib_is_refused(connect, api_key):
    page = await open_page(connect, api_key)
    error = await page.context(context={"blob": "x" * (64 * 1024)})
    assert error["payload"]["data"]["code"] == "context_too_large"
    await page.close()


async def test_an_unknown_risk_is_an_error_never_a_silent_none(connect, api_key):
    page = await open_page(connect, api_key)
    error = await page.context(tools=[dict(ADD_TO_CART, risk="medium")])
    assert error["payload"]["data"]["code"] == "invalid_tool"
    assert "risk" in error["payload"]["message"]
    await page.close()


async def test_invalid_frames_get_coded_errors_and_keep_the_connection(connect, api_key):
    page = await open_page(connect, api_key)
    await page.ws.send_to(text_data="{not json")
    assert (await page.recv())["payload"]["data"]["code"] == "invalid_json"
    await page.ws.send_to(text_data="[1,2]")
    assert (await page.recv())["payload"]["data"]["code"] == "invalid_message"
    await page.send("NOT_A_TYPE", {})
    assert (await page.recv())["payload"]["data"]["code"] == "unknown_type"
    await page.send("TOOL_CALL", {"callId": "x", "name": "y", "args": {}})
    assert (await page.recv())["payload"]["data"]["code"] == "wrong_direction"
    await page.send("TOOL_RESULT", {"status": "success"})
    assert (await page.recv())["payload"]["data"]["code"] == "invalid_message"
    # Still open: a valid message works.
    effective = await page.context()
    assert effective["payload"]["kind"] == "tools_effective"
    await page.close()


async def test_twenty_invalid_frames_in_a_row_close_the_connection(connect, api_key):
    page = await open_page(connect, api_key)
    for _ in range(19):
        await page.ws.send_to(text_data="nope")
        assert (await page.recv())["payload"]["data"]["code"] == "invalid_json"
    await page.ws.send_to(text_data="nope")
    error = await page.recv()
    assert error["payload"]["data"]["code"] == "too_many_invalid_frames"
    assert (await page.recv())["code"] == 1008


@override_settings(OWLLAYER_MAX_MESSAGE_BYTES=2048)
async def test_an_oversize_user_input_gets_a_readable_error_and_its_done_not_a_close(connect, api_key):
    page = await open_page(connect, api_key)
    await page.send("USER_INPUT", {"modality": "text", "content": "x" * 4096})
    error = await page.recv()
    assert error["payload"]["data"]["code"] == "too_large"
    assert (await page.recv())["payload"] == {"chunk": "", "done": True}
    assert (await page.context())["payload"]["kind"] == "tools_effective"
    await page.close()


async def test_a_second_user_input_during_a_turn_gets_turn_in_progress(connect, api_key):
    page = await open_page(connect, api_key, tools=[ADD_TO_CART])
    await page.send("USER_INPUT", {"modality": "text", "content": '/tool add_to_cart {"quantity": 1}'})
    call = await page.recv_until("TOOL_CALL")
    await page.send("USER_INPUT", {"modality": "text", "content": "again"})
    error = await page.recv_until("SYSTEM_EVENT", kind="error")
    assert error["payload"]["data"]["code"] == "turn_in_progress"
    await page.send("TOOL_RESULT", {"callId": call["payload"]["callId"], "status": "success",
                                    "result": {"added": True}})
    done = await page.recv_until("AGENT_RESPONSE", done=True)
    assert "add_to_cart" in done["payload"]["chunk"]
    await page.close()


async def test_text_over_8000_characters_is_refused(connect, api_key):
    page = await open_page(connect, api_key)
    await page.send("USER_INPUT", {"modality": "text", "content": "a" * 8001})
    error = await page.recv()
    assert error["payload"]["data"]["code"] == "input_too_long"
    await page.close()


async def test_audio_is_refused_when_voice_is_not_offered(connect, api_key, settings):
    settings.OWLLAYER_VOICE = False
    page = await open_page(connect, api_key)
    await page.send("AUDIO_STREAM", {"data": "AAAA", "mimeType": "audio/pcm;rate=16000"})
    assert (await page.recv())["payload"]["data"]["code"] == "voice_unavailable"
    await page.close()


async def test_revoking_a_key_closes_its_live_sessions(connect, api_key):
    # The first open reads the key; the next one joins the key's group
    # before its row is written, with what the process remembers of the key.
    pages = [await open_page(connect, api_key), await open_page(connect, api_key)]
    key = await ApiKey.objects.aget(pk=api_key.pk)
    await in_db(tenancy.key_revoke)(key=key)
    for page in pages:
        error = await page.recv()
        assert error["payload"]["data"]["code"] == "api_key_revoked"
        assert (await page.recv())["code"] == 1008


async def test_closing_records_the_end_of_the_session(connect, api_key):
    page = await connect()
    ack = await page.handshake(api_key.raw)
    await page.close()
    # The row is written by the consumer's teardown: wait for it, not for a time.
    deadline = asyncio.get_running_loop().time() + CONSUMER_PATIENCE
    while not await Session.objects.filter(id=ack["payload"]["sessionId"],
                                           ended_at__isnull=False).aexists():
        assert asyncio.get_running_loop().time() < deadline, "the session row was never closed"
        await asyncio.sleep(0.05)
    session = await Session.objects.aget(id=ack["payload"]["sessionId"])
    assert session.ended_at is not None and session.state == Session.State.ENDED


@override_settings(OWLLAYER_TOOL_TIMEOUT=3)
async def test_a_channel_layer_that_swallows_cancellation_cannot_keep_a_turn_alive(
    connect, api_key, monkeypatch
):
    """channels-redis' group_send can swallow a cancellation that lands inside
    it; watcher notifications are sent off the turn so a page that leaves
    still ends its turn at once."""
    import aitp.live

    async def swallowing_publish(*args, **kwargs):
        try:
            await asyncio.sleep(0.05)
        except asyncio.CancelledError:
            pass

    monkeypatch.setattr(aitp.live, "publish_frame", swallowing_publish)
    monkeypatch.setattr(aitp.live, "publish_session", swallowing_publish)
    page = await open_page(connect, api_key, tools=[ADD_TO_CART])
    await page.send("USER_INPUT", {"modality": "text", "content": '/tool add_to_cart {"quantity": 1}'})
    call = await page.recv_until("TOOL_CALL")
    # Patient, unlike the default: the app must end the turn by itself.
    await page.ws.disconnect(timeout=30)
    row = await ToolCall.objects.aget(call_id=call["payload"]["callId"])
    assert row.status == "disconnected"


async def test_a_database_outage_at_handshake_asks_the_client_to_retry_later(connect, api_key, monkeypatch):
    from django.db import OperationalError

    def down(**kwargs):
        raise OperationalError("connection refused")

    monkeypatch.setattr(store.current(), "session_open", down)
    page = await connect()
    error = await page.handshake(api_key.raw)
    assert error["payload"]["data"]["code"] == "temporarily_unavailable"
    # 1013: the deployed client reconnects after a delay (protocol.md §10).
    assert (await page.recv())["code"] == 1013


async def test_a_server_bug_while_handling_a_frame_keeps_the_connection(connect, api_key, monkeypatch):
    from agent.loop import Agent

    async def broken(self, payload):
        raise RuntimeError("bug")

    monkeypatch.setattr(Agent, "on_tool_result", broken)
    page = await open_page(connect, api_key)
    await page.send("TOOL_RESULT", {"callId": "tc_x", "status": "success", "result": None})
    error = await page.recv()
    assert error["payload"]["data"]["code"] == "internal_error"
    assert (await page.context())["payload"]["kind"] == "tools_effective"
    await page.close()


@override_settings(OWLLAYER_HEARTBEAT_INTERVAL=0.2)
async def test_a_revocation_whose_notice_never_arrives_closes_the_session_at_its_heartbeat(
    connect, api_key
):
    page = await open_page(connect, api_key)
    # Written straight to the database: no channel-layer notice is sent.
    await ApiKey.objects.filter(pk=api_key.pk).aupdate(status=ApiKey.Status.REVOKED)
    error = await page.recv()
    assert error["payload"]["data"]["code"] == "api_key_revoked"
    assert (await page.recv())["code"] == 1008
