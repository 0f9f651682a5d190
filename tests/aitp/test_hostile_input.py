"""Hostile input against a live consumer and a real daphne: every input has an
answer, teardown always runs, and one connection's memory stays bounded.

The first part talks to the ASGI application in this process (Channels'
WebsocketCommunicator), on whichever database and channel layer the pass
uses; the second starts real daphne processes and talks raw sockets.
"""
from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import socket
import struct
import time

import pytest
import websockets
from asgiref.sync import async_to_sync
from django.conf import settings
from django.test import override_settings
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from aitp import consumer as consumer_module
from aitp import notify, store, tenancy
from aitp.models import Session, ToolCall
from aitp.session import SessionMachine
from connection import opening
from tests.aitp.conftest import ADD_TO_CART, ORIGIN, in_db
from tests.aitp.hostile import encode, hostile_answer, hostile_frame, random_hostile_frames
from tests.approvals.hostile_tools import (
    BODIES,
    PYTHON_TOOL,
    QUEUED,
    HostileReceiver,
    offer_hostile_tools,
)

pytestmark = [pytest.mark.django_db(transaction=True)]

# The per-connection rate limits answer floods on their own; these tests are
# about what a frame's content does, so they send at full speed.
NO_RATE_LIMITS = override_settings(
    OWLLAYER_FRAMES_PER_SECOND=0, OWLLAYER_USER_INPUTS_PER_MINUTE=0,
    OWLLAYER_SESSION_OPENS_PER_KEY_PER_MINUTE=0,
)
NO_RATE_LIMITS_ENV = {
    "OWLLAYER_FRAMES_PER_SECOND": "0", "OWLLAYER_USER_INPUTS_PER_MINUTE": "0",
    "OWLLAYER_SESSION_OPENS_PER_KEY_PER_MINUTE": "0",
}


@pytest.fixture(autouse=True)
def _no_rate_limits():
    with NO_RATE_LIMITS:
        yield


def frame(type_: str, payload: dict, id_: str = "msg_h") -> str:
    return json.dumps({"id": id_, "type": type_, "timestamp": 1, "payload": payload})


async def ended(session_id: str, *, within: float | None = None) -> Session:
    """The session row once it has ended; waits a bounded, settings-derived time."""
    deadline = time.monotonic() + (within or 3 * settings.OWLLAYER_HANDSHAKE_TIMEOUT)
    while True:
        row = await Session.objects.aget(id=session_id)
        if row.ended_at is not None or time.monotonic() > deadline:
            return row
        await asyncio.sleep(0.05)


async def recv_until_close(page) -> dict:
    while True:
        received = await page.recv()
        if received["type"] == "__close__":
            return received


async def finish_a_turn(page, text: str = "hello") -> dict:
    """Send a user message and return the done:true frame that ends a turn. A
    turn a hostile frame started first is waited out, then ours is sent again:
    it ends with done:true, or with "interrupted" when a hostile
    VOICE_INTERRUPT cut it (a barged-in turn sends no done frame)."""
    wait = 5 + 2 * settings.OWLLAYER_TOOL_TIMEOUT
    for _ in range(3):
        await page.send("USER_INPUT", {"modality": "text", "content": text})
        refused = False
        while True:
            received = await page.recv(timeout=wait)
            assert received["type"] != "__close__", received
            if (received["type"] == "SYSTEM_EVENT"
                    and received["payload"].get("data", {}).get("code") == "turn_in_progress"):
                refused = True
            elif received["type"] == "AGENT_RESPONSE" and received["payload"]["done"]:
                if not refused:
                    return received
                break
            elif (refused and received["type"] == "VOICE_STATE_EVENT"
                    and received["payload"].get("event") == "interrupted"):
                break
    raise AssertionError("no turn of ours ever ran")


async def open_session(connect, api_key, **context) -> tuple:
    """(page, session id) of a page past its handshake and first context update."""
    page = await connect()
    ack = await page.handshake(api_key.raw)
    assert ack["type"] == "HANDSHAKE_ACK", ack
    effective = await page.context(**context)
    assert effective["payload"]["kind"] == "tools_effective", effective
    return page, ack["payload"]["sessionId"]


# --- the facts found, one by one ------------------------------------------------------


async def test_a_lone_surrogate_in_a_context_value_is_answered_and_the_session_goes_on(
        connect, api_key):
    page, session_id = await open_session(connect, api_key, tools=[ADD_TO_CART])
    await page.ws.send_to(text_data=frame("CONTEXT_UPDATE", {
        "url": "/p", "title": "Caf\\ud83d", "activeTools": [], "context": {"name": "x\ud800"}}))
    error = await page.recv()
    assert error["payload"]["data"] == {"code": "invalid_text", "messageId": "msg_h"}
    effective = await page.context(url="/next", tools=[ADD_TO_CART])
    assert effective["payload"]["kind"] == "tools_effective"
    await page.close()
    row = await ended(session_id)
    assert row.ended_at is not None


async def test_a_nul_in_a_user_message_is_answered_and_the_next_turn_still_ends(connect, api_key):
    page, _ = await open_session(connect, api_key)
    await page.send("USER_INPUT", {"modality": "text", "content": "hi\x00there"})
    error = await page.recv()
    assert error["payload"]["data"]["code"] == "invalid_text"
    done = await finish_a_turn(page)
    assert done["payload"]["done"] is True
    await page.close()


async def test_a_surrogate_in_handshake_init_is_answered_and_a_good_handshake_still_opens(
        connect, api_key):
    page = await connect()
    error = await page.handshake(api_key.raw, userAgent="Mozilla\ud800")
    assert error["payload"]["data"]["code"] == "invalid_text"
    ack = await page.handshake(api_key.raw)
    assert ack["type"] == "HANDSHAKE_ACK"
    await page.close()
    assert (await ended(ack["payload"]["sessionId"])).ended_at is not None


async def test_whatever_receive_raises_the_connection_closes_and_its_row_ends(
        connect, api_key, monkeypatch):
    errors = ErrorLog()
    monkeypatch.setattr(logging.getLogger("aitp.consumer"), "handlers",
                        [*logging.getLogger("aitp.consumer").handlers, errors])
    page, session_id = await open_session(connect, api_key)
    original = SessionMachine.receive_text

    def broken(self, data):
        if "boom" in str(data):
            raise UnicodeEncodeError("utf-8", "\ud800", 0, 1, "surrogates not allowed")
        return original(self, data)

    monkeypatch.setattr(SessionMachine, "receive_text", broken)
    await page.send("USER_INPUT", {"modality": "text", "content": "boom"})
    error = await page.recv()
    assert error["payload"]["data"]["code"] == "internal_error"
    close = await recv_until_close(page)
    assert close["code"] == 1011
    row = await ended(session_id)
    assert (row.ended_at is not None, row.close_code) == (True, 1011)
    assert any("handler failed" in r.getMessage() for r in errors.records)


async def test_a_failure_after_the_key_lookup_refuses_the_handshake_and_ends_the_row(
        connect, api_key, monkeypatch):
    async def broken(tenant_id):
        raise RuntimeError("server tools unavailable")

    monkeypatch.setattr(opening, "load_server_tools", broken)
    page = await connect()
    error = await page.handshake(api_key.raw)
    assert error["payload"]["data"]["code"] == "internal_error"
    close = await recv_until_close(page)
    assert close["code"] == 1011
    [row] = [r async for r in Session.objects.all()]
    row = await ended(row.id)
    assert row.ended_at is not None


async def test_a_handshake_whose_lookup_outlasts_the_deadline_times_out_and_its_row_ends(
        connect, api_key, monkeypatch):
    timeout = 0.5
    original = store.current().session_open

    def slow_open(**kw):
        time.sleep(3 * timeout)
        return original(**kw)

    monkeypatch.setattr(store.current(), "session_open", slow_open)
    with override_settings(OWLLAYER_HANDSHAKE_TIMEOUT=timeout):
        page = await connect()
        error = await page.handshake(api_key.raw)
        assert error["payload"]["data"]["code"] == "handshake_timeout"
        close = await page.recv(timeout=10 * timeout)
        assert close["code"] == 1008
        # The lookup finishes after the close: the row it opened must end too.
        deadline = time.monotonic() + 20 * timeout
        while not await Session.objects.aexists() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        [row] = [r async for r in Session.objects.all()]
        row = await ended(row.id, within=20 * timeout)
        assert row.ended_at is not None


async def test_a_channel_layer_handler_that_raises_closes_and_tears_down(
        connect, api_key, monkeypatch):
    async def broken(self, event):
        raise RuntimeError("handler bug")

    monkeypatch.setattr(consumer_module.AitpConsumer, "key_changed", broken)
    page, session_id = await open_session(connect, api_key)
    await notify.asend(notify.key_group(api_key.id), "key.changed", key_id=api_key.id)
    close = await recv_until_close(page)
    assert close["code"] == 1011
    assert (await ended(session_id)).ended_at is not None


# --- any sequence of frames, any values ----------------------------------------------


class ErrorLog(logging.Handler):
    """Every record at ERROR or above: a server traceback is one."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


WEBHOOK_TOOL = "hostile_webhook_answer"
FINAL_STATUSES = sorted(str(status) for status in ToolCall.FINAL_STATUSES)


@pytest.fixture
def hostile_server_tools(api_key, settings):
    """The key's tenant offers two server tools that answer whatever a test
    asks: a Python tool (any value, ``QUEUED``) and a webhook on 127.0.0.1
    (any body of ``BODIES``)."""
    import ipaddress

    settings.OWLLAYER_WEBHOOK_ALLOWED_NETWORKS = (ipaddress.ip_network("127.0.0.1/32"),)
    with HostileReceiver() as receiver:
        offer_hostile_tools(api_key.tenant, receiver.url, webhook_name=WEBHOOK_TOOL)
        yield
    QUEUED.clear()


def tool_answer() -> st.SearchStrategy:
    """One server tool call: the Python tool returning any value, or the
    webhook answering any of the hostile bodies."""
    return st.one_of(st.tuples(st.just(PYTHON_TOOL), hostile_answer()),
                     st.tuples(st.just(WEBHOOK_TOOL), st.sampled_from(sorted(BODIES))))


@hypothesis_settings(max_examples=25, deadline=None,
                     suppress_health_check=[HealthCheck.function_scoped_fixture,
                                            HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.lists(hostile_frame().map(encode), min_size=1, max_size=8),
       st.lists(tool_answer(), max_size=3))
def test_any_frames_leave_no_traceback_no_1011_no_stuck_turn_no_open_row_and_no_other_session_changed(
        connect, api_key, hostile_server_tools, texts, answers):
    """... and whatever the session's server tools answer, every call ends
    final and the session goes on."""
    errors = ErrorLog()
    logging.getLogger().addHandler(errors)
    try:
        async_to_sync(_play_hostile_frames)(connect, api_key, texts, answers)
    finally:
        logging.getLogger().removeHandler(errors)
    assert [r.getMessage() for r in errors.records] == []


async def _call_server_tools(page, answers) -> None:
    """One turn per answer: the offline agent calls the tool it is told to."""
    for tool, answer in answers:
        if tool == PYTHON_TOOL:
            QUEUED.append(answer)
            kind = "next"
        else:
            kind = answer
        await page.send("USER_INPUT", {"modality": "text",
                                       "content": f'/tool {tool} {json.dumps({"kind": kind})}'})
        while True:
            received = await page.recv(timeout=30)
            assert received["type"] != "__close__", received
            if received["type"] == "AGENT_RESPONSE" and received["payload"]["done"]:
                break


async def _play_hostile_frames(connect, api_key, texts, answers=()) -> None:
    bystander, bystander_id = await open_session(connect, api_key, url="/bystander",
                                                 context={"mine": 1})
    page, page_id = await open_session(connect, api_key, tools=[ADD_TO_CART])
    await _call_server_tools(page, answers)
    for text in texts:
        await page.ws.send_to(text_data=text)
    # Still alive and answering: a good update is applied...
    await page.send("CONTEXT_UPDATE", {"url": "/after", "title": "After", "context": {},
                                       "activeTools": [dict(ADD_TO_CART, name="sentinel")]})
    while True:
        received = await page.recv(timeout=5)
        assert received["type"] != "__close__", received
        if (received["type"] == "SYSTEM_EVENT" and received["payload"]["kind"] == "tools_effective"
                and any(t["name"] == "sentinel" for t in received["payload"]["data"]["clientTools"])):
            break
    # ...and a turn still ends with done:true.
    await finish_a_turn(page)
    await page.close()
    assert (await ended(page_id)).ended_at is not None
    # Every call the server tools answered has its one final status.
    called = [(c.name, c.status) async for c in ToolCall.objects.filter(
        session_id=page_id, name__in=[PYTHON_TOOL, WEBHOOK_TOOL]).order_by("created_at", "id")]
    assert [name for name, _ in called] == [tool for tool, _ in answers]
    assert all(status in FINAL_STATUSES for _, status in called), called
    assert not await ToolCall.objects.filter(session_id=page_id).exclude(
        status__in=FINAL_STATUSES).aexists()
    # The other session saw none of it: still open, its page unchanged.
    effective = await bystander.context(url="/bystander", context={"mine": 1})
    assert effective["payload"]["kind"] == "tools_effective"
    await bystander.close()
    row = await ended(bystander_id)
    assert (row.ended_at is not None, row.close_code, row.current_url, row.context) == (
        True, 1000, "/bystander", {"mine": 1})


# --- real daphne, raw sockets ------------------------------------------------------


def raw_connect(port: int, key: str, *, rcvbuf: int | None = None) -> socket.socket:
    """A WebSocket opened by hand, so that the test decides when (if ever) it reads."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.settimeout(60)
    sock.connect(("127.0.0.1", port))
    nonce = base64.b64encode(os.urandom(16)).decode()
    sock.sendall((f"GET /owllayer?apiKey={key} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                  f"Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: {nonce}\r\n"
                  f"Sec-WebSocket-Version: 13\r\nOrigin: {ORIGIN}\r\n\r\n").encode())
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = sock.recv(1)
        assert chunk, "server closed during the upgrade"
        head += chunk
    assert head.startswith(b"HTTP/1.1 101"), head
    return sock


def ws_frame(text: str) -> bytes:
    data = text.encode("utf-8")
    mask = os.urandom(4)
    size = len(data)
    if size < 126:
        head = bytes([0x81, 0x80 | size])
    elif size < 65536:
        head = bytes([0x81, 0x80 | 126]) + struct.pack("!H", size)
    else:
        head = bytes([0x81, 0x80 | 127]) + struct.pack("!Q", size)
    repeated = (mask * (size // 4 + 1))[:size]
    masked = (int.from_bytes(data, "big") ^ int.from_bytes(repeated, "big")).to_bytes(size, "big")
    return head + mask + masked


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


def flood(sock: socket.socket, frame_bytes: bytes, count: int) -> tuple[int, str | None]:
    """Send frame_bytes count times without reading; (frames sent, how it stopped)."""
    for sent in range(count):
        try:
            sock.sendall(frame_bytes)
        except OSError as exc:  # reset or broken pipe: the server closed it
            return sent, type(exc).__name__
    return count, None


@pytest.fixture
def open_key(db):
    tenant = tenancy.tenant_create(slug="hostile", name="Hostile")
    key, raw = tenancy.key_create(tenant=tenant, name="web", allowed_origins=[ORIGIN],
                                  max_sessions=50)
    return key, raw


async def test_a_frame_over_the_ceiling_closes_with_1009(daphne_factory, open_key):
    _, raw = open_key
    server = daphne_factory(OWLLAYER_MAX_MESSAGE_BYTES=1024, OWLLAYER_WS_FRAME_CEILING_BYTES=4096)
    async with websockets.connect(server.ws_url(api_key=raw), origin=ORIGIN) as ws:
        await ws.send(frame("HANDSHAKE_INIT", {"protocolVersion": "1.0.0", "apiKey": raw}))
        assert json.loads(await ws.recv())["type"] == "HANDSHAKE_ACK"
        await ws.send("x" * 10_000)
        with pytest.raises(websockets.ConnectionClosed) as closed:
            while True:
                await ws.recv()
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1009


def read_to_end(sock: socket.socket) -> bytes:
    """Everything the server sent until it closed; a reset raises."""
    received = b""
    while chunk := sock.recv(65536):
        received += chunk
    return received


def close_code_in(stream: bytes) -> int | None:
    """The code of the first close frame in an unmasked server stream."""
    at = 0
    while at + 2 <= len(stream):
        opcode, size = stream[at] & 0x0F, stream[at + 1] & 0x7F
        at += 2
        if size == 126:
            size, at = struct.unpack("!H", stream[at:at + 2])[0], at + 2
        elif size == 127:
            size, at = struct.unpack("!Q", stream[at:at + 8])[0], at + 8
        if opcode == 0x8:
            return struct.unpack("!H", stream[at:at + 2])[0]
        at += size
    return None


async def test_a_refused_page_slow_to_answer_the_close_still_reads_its_1008(daphne_factory, open_key):
    # The server waits a second for the page to answer its close frame, then
    # drops the connection: with a reset, the page's kernel threw away the
    # close frame still unread, the page saw 1006 and reconnected.
    server = daphne_factory()
    sock = raw_connect(server.port, "pk_live_not_a_key")
    sock.sendall(ws_frame(frame("HANDSHAKE_INIT", {"protocolVersion": "1.0.0",
                                                   "apiKey": "pk_live_not_a_key"})))
    await asyncio.sleep(3)  # the page is busy: it reads after the server gave up waiting

    received = await asyncio.to_thread(read_to_end, sock)
    sock.close()
    assert b"invalid_api_key" in received
    assert close_code_in(received) == 1008


async def test_a_client_that_never_reads_is_closed_1013_and_its_session_ends(daphne_factory, open_key):
    _, raw = open_key
    limit = 64 * 1024
    server = daphne_factory(OWLLAYER_MAX_OUTBOUND_BYTES=limit, **NO_RATE_LIMITS_ENV)
    sock = raw_connect(server.port, raw, rcvbuf=4096)
    sock.sendall(ws_frame(frame("HANDSHAKE_INIT", {"protocolVersion": "1.0.0", "apiKey": raw})))
    assert b"HANDSHAKE_ACK" in sock.recv(4096)
    # Each update is answered with its tools twice over (tools_effective): ~60 KB out per frame.
    tools = [{"name": f"tool_{i}", "description": "d" * 1000, "risk": "low"} for i in range(30)]
    update = ws_frame(frame("CONTEXT_UPDATE", {"url": "/", "title": "t", "context": {},
                                               "activeTools": tools}))
    before = rss_kib(server.process.pid)
    attempts = 3000  # ~180 MB of answers if nothing stopped them
    sent, stopped = await asyncio.to_thread(flood, sock, update, attempts)
    sock.close()
    assert stopped is not None, f"the server took {sent} frames without closing"
    assert "closing a connection with 1013" in server.logs()
    growth_mib = (rss_kib(server.process.pid) - before) / 1024
    assert growth_mib < 64, f"server grew {growth_mib:.0f} MiB"
    [row] = [r async for r in Session.objects.all()]
    assert (await ended(row.id)).ended_at is not None


async def test_a_flood_of_large_updates_waits_for_the_server_instead_of_filling_its_memory(
        daphne_factory, open_key):
    _, raw = open_key
    server = daphne_factory(OWLLAYER_MAX_INBOUND_BYTES=1024 * 1024, **NO_RATE_LIMITS_ENV)
    sock = raw_connect(server.port, raw)
    sock.sendall(ws_frame(frame("HANDSHAKE_INIT", {"protocolVersion": "1.0.0", "apiKey": raw})))
    assert b"HANDSHAKE_ACK" in sock.recv(4096)
    update = ws_frame(frame("CONTEXT_UPDATE", {"url": "/", "title": "t",
                                               "context": {"blob": "y" * 60_000}}))
    before = rss_kib(server.process.pid)
    count = 1500  # 90 MB of context
    sent, stopped = await asyncio.to_thread(flood, sock, update, count)
    assert (sent, stopped) == (count, None)
    growth_mib = (rss_kib(server.process.pid) - before) / 1024
    sock.close()
    # Unbounded, the frames waiting for the consumer held most of the 90 MB.
    assert growth_mib < 40, f"server grew {growth_mib:.0f} MiB for 90 MB sent"
    [row] = [r async for r in Session.objects.all()]
    assert (await ended(row.id, within=60)).ended_at is not None


# --- the fuzz run -----------------------------------------------------------------


FUZZ_SOCKETS = 4
FUZZ_FRAMES_PER_SOCKET = 750


# What the fuzz run's webhook tool is asked to answer: every body of the table.
FUZZ_TOOL_COMMANDS = tuple(f'/tool {WEBHOOK_TOOL} {json.dumps({"kind": kind})}'
                           for kind in sorted(BODIES))


async def _fuzz_one(server, raw: str, seed: int, close_codes: list[int]) -> int:
    """Send this socket's hostile frames, reading everything; reconnect after a close."""
    frames = random_hostile_frames(seed, FUZZ_FRAMES_PER_SOCKET, tool_commands=FUZZ_TOOL_COMMANDS)
    handshake = frame("HANDSHAKE_INIT", {"protocolVersion": "1.0.0", "apiKey": raw})
    sent = 0
    while sent < len(frames):
        async with websockets.connect(server.ws_url(api_key=raw), origin=ORIGIN,
                                      max_size=None) as ws:
            await ws.send(handshake)

            async def read() -> None:
                with SuppressClosed():
                    async for _ in ws:
                        pass

            reader = asyncio.create_task(read())
            try:
                while sent < len(frames):
                    await ws.send(frames[sent])
                    sent += 1
            except websockets.ConnectionClosed:
                pass
            finally:
                if sent >= len(frames):
                    await ws.close()
                await reader
        if ws.protocol.close_rcvd is not None:
            close_codes.append(ws.protocol.close_rcvd.code)
    return sent


class SuppressClosed:
    """The server may close at any frame: that ends this reader, nothing else."""

    def __enter__(self):
        return self

    def __exit__(self, kind, value, tb):
        return kind is not None and issubclass(kind, websockets.ConnectionClosed)


async def test_a_fuzz_run_of_thousands_of_hostile_frames_leaves_no_traceback_and_no_1011(
        daphne_factory, open_key):
    """... with a server tool answering hostile bodies: every call is final."""
    key, raw = open_key
    with HostileReceiver() as receiver:
        await in_db(offer_hostile_tools)(key.tenant, receiver.url, webhook_name=WEBHOOK_TOOL)
        server = daphne_factory(OWLLAYER_WEBHOOK_ALLOWED_NETWORKS="127.0.0.1/32",
                                **NO_RATE_LIMITS_ENV)
        close_codes: list[int] = []
        sent = await asyncio.gather(*[
            _fuzz_one(server, raw, seed, close_codes) for seed in range(FUZZ_SOCKETS)
        ])
    assert sum(sent) == FUZZ_SOCKETS * FUZZ_FRAMES_PER_SOCKET
    # The server still serves a whole turn afterwards.
    async with websockets.connect(server.ws_url(api_key=raw), origin=ORIGIN) as ws:
        await ws.send(frame("HANDSHAKE_INIT", {"protocolVersion": "1.0.0", "apiKey": raw}))
        assert json.loads(await ws.recv())["type"] == "HANDSHAKE_ACK"
        await ws.send(frame("USER_INPUT", {"modality": "text", "content": "still there?"}))
        while True:
            answer = json.loads(await asyncio.wait_for(ws.recv(), 30))
            if answer["type"] == "AGENT_RESPONSE" and answer["payload"]["done"]:
                break
    deadline = time.monotonic() + 30
    while await Session.objects.filter(ended_at__isnull=True).aexists():
        assert time.monotonic() < deadline, "a session row was left open"
        await asyncio.sleep(0.1)
    server.stop()
    logs = server.logs()
    assert "Traceback" not in logs
    assert 1011 not in close_codes
    assert all(code in (1000, 1008) for code in close_codes), close_codes
    # The webhook was called, its hostile answers refused, and no call was left open.
    calls = [(c.status, c.error) async for c in ToolCall.objects.filter(name=WEBHOOK_TOOL)]
    assert any(error.startswith("The tool ran, but its answer could not be used") for _, error in calls)
    open_calls = [(c.name, c.status, c.error, c.session_id) async for c in
                  ToolCall.objects.exclude(status__in=FINAL_STATUSES)]
    assert open_calls == []


# --- pages that show what a page sent ------------------------------------------------


def test_a_deeply_nested_context_does_not_break_its_admin_page(admin_client, api_key):
    from tests.aitp.hostile import deep

    # Stored as a client could before the depth limit: far deeper than any page shows.
    session = Session.objects.create(
        id="ses_deep", tenant=api_key.tenant, api_key=api_key, context=deep(900, "bottom"),
        tools=[deep(40)], page_history=[{"url": "/", "context": deep(300, as_dict=True)}],
    )
    response = admin_client.get(f"/admin/aitp/session/{session.pk}/change/")
    assert response.status_code == 200
    assert b"more levels" in response.content or b"nested too deeply to show" in response.content
    from aitp.transcript import pretty_json

    assert "more levels" in pretty_json(deep(5000, "x", as_dict=True))
