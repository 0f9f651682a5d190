"""Floods are logged once per window, with a count, never a line per frame.

One flooding socket used to write a log line for nearly every frame it sent
(2,377 lines for 3,000 frames). Every refusal that comes in floods is now
counted per connection (per key for session opens) and logged as one line
per ``OWLLAYER_FLOOD_LOG_INTERVAL``, and what a window holds when its
connection ends is logged then: frames over the per-second limit, invalid
frames, approval requests over the per-call limit, user inputs over the
per-minute limit, audio too fast, session opens over a key's limit.
"""
from __future__ import annotations

import asyncio
import json
import logging
import re

import pytest
from django.test import override_settings

from aitp.limits import ConnectionLimits, SharedLimits
from aitp.session import Limits, SessionMachine
from aitp_client import AitpClient, AitpClosed
from runtime.flood_log import FloodLog
from tests.aitp.conftest import CONSUMER_PATIENCE, ORIGIN
from tests.aitp.test_limits import PAY, clock, quiet  # noqa: F401 (clock is a fixture)

FRAMES = 3_000
# A handful: what a flood may leave in the log, whatever its size.
HANDFUL = 5


class Lines(logging.Handler):
    """The application's log lines (every ``aitp`` logger), as they are written."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []
        self.written = asyncio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno >= logging.INFO:
            self.lines.append(record.getMessage())
            self.written.set()

    def about(self, session_id: str) -> list[str]:
        return [line for line in self.lines if session_id in line]


@pytest.fixture
def app_log():
    handler = Lines()
    logger = logging.getLogger("aitp")
    level, logger.level = logger.level, logging.DEBUG
    logger.addHandler(handler)
    yield handler
    logger.removeHandler(handler)
    logger.setLevel(level)


def frame(type_: str, payload: dict) -> str:
    return json.dumps({"id": "msg_flood", "type": type_, "timestamp": 1, "payload": payload})


def context(n: int) -> str:
    return frame("CONTEXT_UPDATE", {"url": f"/flood/{n}", "title": "Flood", "activeTools": [],
                                    "context": {}})


def counted(line: str) -> int:
    return int(re.search(r": ([\d,]+) ", line).group(1).replace(",", ""))


def without_seconds(line: str) -> str:
    """The line with its window's length (however long the machine took) as N."""
    return re.sub(r"in the last \d+ s", "in the last N s", line)


async def open_page(connect, api_key, tools=(), url="/"):
    """A page that shook hands and sent its context; ``page.session_id`` is set."""
    page = await connect()
    await page.send("HANDSHAKE_INIT", {"apiKey": api_key.raw, "userAgent": "pytest",
                                       "viewport": "1x1", "sdkVersion": "0.4.0",
                                       "protocolVersion": "1.0.0"})
    ack = await page.recv(CONSUMER_PATIENCE)  # the first open of a process checks its voice
    assert ack["type"] == "HANDSHAKE_ACK", ack
    page.session_id = ack["payload"]["sessionId"]
    assert (await page.context(url=url, tools=tools))["payload"]["kind"] == "tools_effective"
    return page


# --- the window ----------------------------------------------------------------------------


async def test_refusals_of_one_kind_are_one_line_with_their_count_when_their_connection_ends():
    logger, handler = logging.getLogger("test.flood"), Lines()
    logger.addHandler(handler)
    floods = FloodLog(logger, interval=3600)
    try:
        for _ in range(2_940):
            floods.count("frames", subject="session ses_a", what="frames dropped",
                         detail="over 30 a second")
        floods.count("inputs", subject="session ses_a", what="user inputs refused")
        assert handler.lines == []

        floods.close()
    finally:
        logger.removeHandler(handler)

    assert sorted(map(without_seconds, handler.lines)) == [
        "session ses_a: 1 user inputs refused in the last N s",
        "session ses_a: 2,940 frames dropped in the last N s (over 30 a second)",
    ]


async def test_a_flood_that_goes_on_is_one_line_per_window():
    logger, handler = logging.getLogger("test.flood"), Lines()
    logger.addHandler(handler)
    floods = FloodLog(logger, interval=0.05)
    try:
        for _ in range(500):
            floods.count("frames", subject="session ses_b", what="frames dropped")
        await asyncio.wait_for(handler.written.wait(), CONSUMER_PATIENCE)  # the window's end
        handler.written.clear()
        floods.count("frames", subject="session ses_b", what="frames dropped")
        await asyncio.wait_for(handler.written.wait(), CONSUMER_PATIENCE)
        floods.close()  # nothing left to write
    finally:
        logger.removeHandler(handler)

    assert [counted(line) for line in handler.lines] == [500, 1]


# --- each kind, on the real consumer ------------------------------------------------------------


async def flood(page, frames) -> None:
    for text in frames:
        await page.ws.send_to(text_data=text)


async def drain_until_closed(page) -> None:
    while (await page.recv(CONSUMER_PATIENCE))["type"] != "__close__":
        pass


@pytest.mark.django_db(transaction=True)
@override_settings(OWLLAYER_FRAMES_PER_SECOND=5, OWLLAYER_FLOOD_CLOSE_DROPS=100_000)
async def test_frames_over_the_per_second_limit_are_one_line_however_many(
        clock, connect, api_key, app_log):
    page = await open_page(connect, api_key)
    session_id = page.session_id

    await flood(page, (context(n) for n in range(FRAMES)))
    await page.close()

    lines = app_log.about(session_id)
    assert len(lines) <= HANDFUL, lines
    (dropped,) = [line for line in lines if "frames dropped" in line]
    assert counted(dropped) >= FRAMES - 5 and "(over 5 a second)" in dropped


@pytest.mark.django_db(transaction=True)
@override_settings(OWLLAYER_FRAMES_PER_SECOND=5, OWLLAYER_FLOOD_CLOSE_DROPS=100)
async def test_a_connection_closed_for_flooding_says_so_once(clock, connect, api_key, app_log):
    page = await open_page(connect, api_key)
    session_id = page.session_id

    await flood(page, (context(n) for n in range(FRAMES)))
    await drain_until_closed(page)
    await page.close()

    lines = app_log.about(session_id)
    assert len(lines) <= HANDFUL, lines
    assert sum("closed for flooding" in line for line in lines) == 1


@pytest.mark.django_db(transaction=True)
@override_settings(OWLLAYER_FRAMES_PER_SECOND=0)
async def test_invalid_frames_are_one_line_however_many(connect, api_key, app_log):
    page = await open_page(connect, api_key)
    session_id = page.session_id

    # A valid frame between each two invalid ones: never 20 in a row, so never closed.
    await flood(page, ("{not json" if n % 2 else context(n) for n in range(FRAMES)))
    for _ in range(FRAMES):
        await page.recv(CONSUMER_PATIENCE)  # an answer to each: all handled
    await page.close()

    lines = app_log.about(session_id)
    assert len(lines) <= HANDFUL, lines
    (refused,) = [line for line in lines if "invalid frames refused" in line]
    assert counted(refused) == FRAMES // 2


@pytest.mark.django_db(transaction=True)
@override_settings(OWLLAYER_FRAMES_PER_SECOND=0, OWLLAYER_APPROVAL_REQUESTS_PER_CALL=5)
async def test_approval_requests_over_the_per_call_limit_are_one_line_however_many(
        connect, api_key, app_log):
    page = await open_page(connect, api_key, tools=[PAY], url="/checkout")
    session_id = page.session_id
    await page.send("USER_INPUT", {"modality": "text", "content": '/tool pay {"amount": 42}'})
    call = await page.recv_until("TOOL_CALL", timeout=CONSUMER_PATIENCE)
    request = frame("APPROVAL_REQUEST", {
        "callId": call["payload"]["callId"], "toolName": "pay", "risk": "critical",
        "args": call["payload"]["args"], "message": "Pay 42?"})

    await flood(page, (request for _ in range(FRAMES)))
    for _ in range(FRAMES - 5):
        await page.recv(CONSUMER_PATIENCE)  # the refusals: all handled
    await page.close()

    lines = app_log.about(session_id)
    assert len(lines) <= HANDFUL, lines
    (refused,) = [line for line in lines if "approval requests refused" in line]
    assert counted(refused) == FRAMES - 5


@pytest.mark.django_db(transaction=True)
@override_settings(OWLLAYER_FRAMES_PER_SECOND=0, OWLLAYER_USER_INPUTS_PER_MINUTE=2)
async def test_user_inputs_over_the_per_minute_limit_are_one_line_however_many(
        clock, connect, api_key, app_log):
    page = await open_page(connect, api_key)
    session_id = page.session_id
    for _ in range(2):  # the two the minute allows, each a turn
        await page.send("USER_INPUT", {"modality": "text", "content": "hello"})
        await page.recv_until("AGENT_RESPONSE", timeout=CONSUMER_PATIENCE, done=True)

    inputs = frame("USER_INPUT", {"modality": "text", "content": "again"})
    await flood(page, (inputs for _ in range(FRAMES)))
    for _ in range(FRAMES):
        await page.recv_until("AGENT_RESPONSE", timeout=CONSUMER_PATIENCE, done=True)
    await page.close()

    lines = app_log.about(session_id)
    assert len(lines) <= HANDFUL, lines
    (refused,) = [line for line in lines if "user inputs refused" in line]
    assert counted(refused) == FRAMES


async def test_audio_too_fast_is_one_line_however_many(clock, app_log):
    limits, machine = ConnectionLimits(quiet()), SessionMachine(limits=Limits(), server_version="t")
    machine.session_id = "ses_loud"
    await limits.allow_frame(machine)
    for _ in range(FRAMES):
        limits.audio_refused(machine)
    limits.close()

    assert list(map(without_seconds, app_log.about("ses_loud"))) == [
        "session ses_loud: 3,000 audio chunks dropped in the last N s "
        "(microphone audio faster than allowed)"]


async def test_session_opens_over_a_keys_limit_are_one_line_however_many(clock, app_log):
    shared = SharedLimits(quiet(session_opens_per_key_per_minute=2))
    limits = ConnectionLimits(shared.config, shared)
    machines = [SessionMachine(limits=Limits(), server_version="t") for _ in range(FRAMES)]
    key = "pk_live_abcdefgh" + "s" * 24

    allowed = [await limits.allow_session_open(m, key) for m in machines]
    shared.refusals.close()

    assert allowed.count(True) == 2
    (line,) = [line for line in app_log.lines if "session opens refused" in line]
    assert without_seconds(line) == (
        "key 'pk_live_abcdefgh': 2,998 session opens refused in the last N s (over 2 a minute)")
    assert key not in "\n".join(app_log.lines)  # never the whole key


# --- one flooding socket against a real daphne ---------------------------------------------------


@pytest.mark.django_db(transaction=True)
async def test_a_socket_flooding_a_real_server_leaves_a_handful_of_log_lines(
        daphne_factory, api_key):
    server = daphne_factory(OWLLAYER_LOG_LEVEL="INFO")  # the default limits
    page = AitpClient(server.ws_url(), api_key=api_key.raw, origin=ORIGIN)
    await page.connect()
    session_id = page.session_id
    before = len(server.logs().splitlines())
    sent = 0
    try:
        for n in range(FRAMES):
            await page.send_raw(context(n))
            sent += 1
        await page.wait_closed(timeout=CONSUMER_PATIENCE)
    except AitpClosed:
        pass  # closed for flooding while still sending, as it should be
    await page.close()
    # The session's last line is its close; then nothing more comes.
    await asyncio.to_thread(wait_for_line, server, f"session {session_id}: closed")

    lines = server.logs().splitlines()[before:]
    assert sent >= 600  # far past the limits: 30 a second, 600 drops to the close
    assert len(lines) <= 2 * HANDFUL, "\n".join(lines)  # daphne's own access lines included
    assert len([line for line in lines if session_id in line]) <= 3, "\n".join(lines)


def wait_for_line(server, text: str) -> None:
    import time

    deadline = time.monotonic() + CONSUMER_PATIENCE
    while text not in server.logs():
        assert time.monotonic() < deadline, server.logs()[-3000:]
        time.sleep(0.05)

