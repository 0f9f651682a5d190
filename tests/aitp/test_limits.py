"""Rate limits and the monthly token quota: what a page that asks too much gets.

The limiter's own counters are tested with its in-memory store under a
stopped clock (the window never moves unless the test moves it), so nothing
here depends on how fast the machine is. The wiring tests talk to the real
consumer through WebsocketCommunicator; the last test runs two daphne
processes on one Redis and counts one key's opens across both.
"""
from __future__ import annotations

import asyncio
import json
import logging
import secrets
import time
from dataclasses import replace
from datetime import timedelta

import pytest
from django.test import override_settings
from django.utils import timezone
from limits.util import WindowStats

from aitp import limits, quota, tenancy
from aitp.limits import ConnectionLimits, LimitSettings, SharedLimits
from aitp.models import DailyUsage, Session
from aitp.session import Limits, SessionMachine, State
from aitp_client import AitpClient, AitpRefused
from approvals.models import AuditEvent
from runtime.config import config
from tenants.models import Tenant
from tests.aitp.conftest import ADD_TO_CART, ORIGIN, Page, in_db, open_page
from tests.support.daphne import free_port

PAY = {
    "name": "pay",
    "description": "Pay with the saved card",
    "parameters": {"type": "OBJECT", "properties": {"amount": {"type": "NUMBER"}},
                   "required": ["amount"]},
    "risk": "critical",
}
# Generous bounds for a frame the server sends "now"; never a measured time.
SOON = 15.0


class StoppedClock:
    """Stands in for the ``time`` module inside limits' memory store."""

    def __init__(self) -> None:
        self.now = 1_900_000_000.0

    def time(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock(monkeypatch) -> StoppedClock:
    import limits.aio.storage.memory as memory_store

    stopped = StoppedClock()
    monkeypatch.setattr(memory_store, "time", stopped)
    monkeypatch.setattr(limits, "time", stopped)
    return stopped


def machine() -> SessionMachine:
    return SessionMachine(limits=Limits(), server_version="test")


def sent(m: SessionMachine) -> list[dict]:
    return [json.loads(frame) for frame in m.data_to_send()]


def error_codes(frames: list[dict]) -> list[str]:
    return [f["payload"]["data"]["code"] for f in frames
            if f["type"] == "SYSTEM_EVENT" and f["payload"]["kind"] == "error"]


def quiet(**overrides) -> LimitSettings:
    """Every limit off but the ones a test sets."""
    off = {"frames_per_second": 0, "flood_close_drops": 0, "user_inputs_per_minute": 0,
           "approval_requests_per_call": 0, "session_opens_per_key_per_minute": 0, "redis_url": ""}
    return replace(config().limits, **{**off, **overrides})


# --- the limiter, in memory ------------------------------------------------------------


async def test_frames_over_the_limit_are_dropped_and_answered_once_a_second(clock):
    limiter, m = ConnectionLimits(quiet(frames_per_second=5)), machine()

    allowed = [await limiter.allow_frame(m) for _ in range(30)]

    assert allowed == [True] * 5 + [False] * 25
    (notice,) = sent(m)
    assert notice["payload"]["data"]["code"] == "rate_limited"
    assert notice["payload"]["data"]["limit"] == "frames_per_second"
    assert m.close is None

    clock.advance(1.5)
    assert await limiter.allow_frame(m) is True


async def test_a_user_input_dropped_for_flooding_still_ends_its_turn_for_the_page(clock):
    limiter, m = ConnectionLimits(quiet(frames_per_second=1)), machine()
    m.receive_text(json.dumps({"id": "m1", "type": "HANDSHAKE_INIT", "timestamp": 1,
                               "payload": {"protocolVersion": "1.0.0", "apiKey": "k"}}))
    m.accept_handshake("ses_1")
    m.data_to_send()
    text = json.dumps({"id": "m2", "type": "USER_INPUT", "timestamp": 1,
                       "payload": {"modality": "text", "content": "hi"}})
    await limiter.allow_frame(m)  # the second's one frame

    assert await limiter.allow_frame(m) is False
    m.frame_dropped(text)

    notice, closing = sent(m)
    assert notice["payload"]["data"]["code"] == "rate_limited"
    assert (closing["type"], closing["payload"]) == ("AGENT_RESPONSE", {"chunk": "", "done": True})


async def test_other_frames_dropped_for_flooding_get_no_done(clock):
    m = machine()
    m.receive_text(json.dumps({"id": "m1", "type": "HANDSHAKE_INIT", "timestamp": 1,
                               "payload": {"protocolVersion": "1.0.0", "apiKey": "k"}}))
    m.accept_handshake("ses_1")
    m.data_to_send()

    m.frame_dropped(json.dumps({"id": "m2", "type": "CONTEXT_UPDATE", "timestamp": 1,
                                "payload": {"url": "/", "context": {"said": "USER_INPUT"}}}))
    m.frame_dropped(b"\xff\xfe not json")

    assert sent(m) == []


def test_a_user_input_dropped_while_a_turn_runs_is_ended_by_that_turns_own_done():
    m = machine()
    m.receive_text(json.dumps({"id": "m1", "type": "HANDSHAKE_INIT", "timestamp": 1,
                               "payload": {"protocolVersion": "1.0.0", "apiKey": "k"}}))
    m.accept_handshake("ses_1")
    text = json.dumps({"id": "m2", "type": "USER_INPUT", "timestamp": 1,
                       "payload": {"modality": "text", "content": "hi"}})
    m.receive_text(text)
    m.data_to_send()
    assert m.turn.busy

    m.frame_dropped(text)

    assert sent(m) == []


async def test_a_connection_that_keeps_flooding_is_closed_with_1008(clock):
    limiter, m = ConnectionLimits(quiet(frames_per_second=2, flood_close_drops=10)), machine()

    allowed = [await limiter.allow_frame(m) for _ in range(2 + 10 + 1)]

    assert allowed == [True, True] + [False] * 11
    assert error_codes(sent(m)) == ["rate_limited", "too_many_frames"]
    assert m.state is State.CLOSED and m.close.code == 1008


async def test_dropped_frames_under_the_flood_limit_never_close(clock):
    limiter, m = ConnectionLimits(quiet(frames_per_second=2, flood_close_drops=10)), machine()
    for _ in range(10):
        for _ in range(3):  # one over the limit each second: 10 drops a minute, not 11
            await limiter.allow_frame(m)
        clock.advance(1.0)
    assert m.close is None


async def test_approval_requests_past_the_per_call_limit_get_an_error_with_the_call(clock):
    limiter = ConnectionLimits(quiet(approval_requests_per_call=3))

    answers = [await limiter.check_approval_request("call_a") for _ in range(5)]
    other = await limiter.check_approval_request("call_b")

    assert answers[:3] == [None, None, None]
    for refused in answers[3:]:
        assert refused.payload.data == {"code": "rate_limited", "limit": "approval_requests_per_call",
                                        "callId": "call_a"}
    assert other is None


async def test_session_opens_per_key_are_counted_per_key_and_refused_with_1013(clock):
    shared = SharedLimits(quiet(session_opens_per_key_per_minute=2))
    limiter = ConnectionLimits(shared.config, shared)
    machines = [machine() for _ in range(3)]

    allowed = [await limiter.allow_session_open(m, "pk_live_one") for m in machines]

    assert allowed == [True, True, False]
    (refusal,) = sent(machines[2])
    assert refusal["payload"]["data"]["code"] == "rate_limited"
    assert refusal["payload"]["data"]["retryAfterMs"] > 0
    assert machines[2].close.code == 1013
    assert await limiter.allow_session_open(machine(), "pk_live_two") is True
    clock.advance(61)
    assert await limiter.allow_session_open(machine(), "pk_live_one") is True


class CountingStore:
    """A shared moving window that never moves, answering as a store does
    (on a later turn of the loop) and counting the calls made to it."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held: dict[tuple, int] = {}
        self.calls = 0

    async def hit(self, item, *identifiers: str, cost: int = 1) -> bool:
        self.calls += 1
        await asyncio.sleep(0)
        if self.held.get(identifiers, 0) + cost > self.limit:
            return False
        self.held[identifiers] = self.held.get(identifiers, 0) + cost
        return True

    async def get_window_stats(self, item, *identifiers: str):
        return WindowStats(reset_time=time.time() + 30, remaining=0)


async def test_opens_of_one_key_asked_together_are_counted_together_and_only_the_limit_goes():
    shared = SharedLimits(quiet(session_opens_per_key_per_minute=4,
                                redis_url=f"redis://127.0.0.1:{free_port()}/0"))
    shared.limiter = store = CountingStore(limit=4)

    waits = await asyncio.gather(*(shared.session_open_retry_after("pk_live_one")
                                   for _ in range(10)))
    other = await shared.session_open_retry_after("pk_live_two")

    assert waits[:4] == [None] * 4  # the first asked are the ones let through
    assert all(wait is not None and wait >= 1.0 for wait in waits[4:])
    assert other is None
    assert store.calls < 10


@pytest.mark.redis
async def test_opens_of_one_key_asked_together_on_redis_let_exactly_the_limit_through(
    redis_required,
):
    shared = SharedLimits(quiet(session_opens_per_key_per_minute=4, redis_url=redis_required,
                                prefix=f"owl-limits-test-{secrets.token_hex(6)}"))

    first = await asyncio.gather(*(shared.session_open_retry_after("pk_live_one")
                                   for _ in range(3)))
    more = await asyncio.gather(*(shared.session_open_retry_after("pk_live_one")
                                  for _ in range(5)))

    assert first == [None] * 3
    assert more[0] is None and all(wait is not None for wait in more[1:])


def test_a_processs_own_window_refuses_while_limit_opens_are_younger_than_a_minute(clock):
    window = limits.LocalMovingWindow(limit=2, period=60)
    assert window.hit("k") is None
    clock.advance(30)
    assert window.hit("k") is None
    clock.advance(29)
    assert window.hit("k") == pytest.approx(1)  # the first ages out in a second
    assert window.hit("other") is None
    clock.advance(1.5)
    assert window.hit("k") is None  # a moving window: one slot back, not all
    assert window.hit("k") == pytest.approx(29.5)  # then when the second one does


def test_a_processs_own_window_forgets_keys_without_a_recent_open(clock, monkeypatch):
    monkeypatch.setattr(limits.LocalMovingWindow, "PRUNE_ABOVE", 3)
    window = limits.LocalMovingWindow(limit=5, period=60)
    for key in ("a", "b", "c"):
        window.hit(key)
    clock.advance(61)
    window.hit("b")
    window.hit("d")
    assert sorted(window.hits) == ["b", "d"]


class Recorded(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@pytest.fixture
def limits_log():
    """What aitp.limits logs (attached to its logger: settings may reset the root's handlers)."""
    handler = Recorded()
    logger = logging.getLogger("aitp.limits")
    logger.addHandler(handler)
    yield handler.lines
    logger.removeHandler(handler)


async def test_a_counter_store_that_is_down_lets_sessions_open_with_a_log_line(limits_log):
    dead = f"redis://127.0.0.1:{free_port()}/0"
    shared = SharedLimits(quiet(session_opens_per_key_per_minute=1, redis_url=dead, redis_timeout=2))
    limiter, m = ConnectionLimits(shared.config, shared), machine()

    assert await limiter.allow_session_open(m, "pk_live_one") is True
    assert await limiter.allow_session_open(m, "pk_live_one") is True

    assert m.close is None and sent(m) == []
    assert any("counter store unavailable" in line for line in limits_log)


async def test_a_counter_store_that_never_answers_lets_sessions_open_with_a_log_line(limits_log):
    async def silent(reader, writer):
        await reader.read()  # takes every command, answers none

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        shared = SharedLimits(quiet(session_opens_per_key_per_minute=1,
                                    redis_url=f"redis://127.0.0.1:{port}/0", redis_timeout=0.2))
        limiter, m = ConnectionLimits(shared.config, shared), machine()
        assert await limiter.allow_session_open(m, "pk_live_one") is True
    finally:
        server.close()
    assert m.close is None and sent(m) == []
    assert any("counter store unavailable" in line for line in limits_log)


async def test_a_quota_the_database_cannot_check_lets_the_turn_start(monkeypatch, limits_log):
    from django.db import OperationalError

    async def database_down(tenant_id: int) -> bool:
        raise OperationalError("connection refused")

    monkeypatch.setattr(limits, "_quota_verdict", database_down)
    limiter, m = ConnectionLimits(quiet()), machine()

    assert await limiter.allow_user_input(m, tenant_id=1) is True
    assert sent(m) == []
    assert any("token quota not checked" in line for line in limits_log)


def test_the_quota_counts_this_months_input_and_output_tokens_only(db):
    tenant = tenancy.tenant_create(slug="quota", name="Quota")
    now = timezone.now()
    today = timezone.localdate(now)
    last_month = today.replace(day=1) - timedelta(days=1)
    DailyUsage.objects.create(tenant=tenant, date=today, input_tokens=300, output_tokens=200,
                              cache_read_tokens=10_000)
    DailyUsage.objects.create(tenant=tenant, date=last_month, input_tokens=9_000)

    unlimited = quota.tenant_quota_status(tenant, now=now)
    tenant.monthly_token_quota = 500
    used_up = quota.tenant_quota_status(tenant, now=now)
    tenant.monthly_token_quota = 2_000
    quarter = quota.tenant_quota_status(tenant, now=now)

    assert (unlimited.used, unlimited.unlimited, unlimited.used_up) == (500, True, False)
    assert (used_up.used_up, used_up.remaining) == (True, 0)
    assert (quarter.used_up, quarter.remaining, quarter.percent) == (False, 1_500, 25)


# --- wiring: the consumer ----------------------------------------------------------------


async def collect_until(page: Page, predicate, timeout: float = SOON) -> list[dict]:
    frames = []
    while True:
        frame = await page.recv(timeout)
        assert frame["type"] != "__close__", frames
        frames.append(frame)
        if predicate(frame):
            return frames


def is_tools_effective(frame: dict) -> bool:
    return frame["type"] == "SYSTEM_EVENT" and frame["payload"]["kind"] == "tools_effective"


def done(frame: dict) -> bool:
    return frame["type"] == "AGENT_RESPONSE" and frame["payload"]["done"] is True


def other_tenant_key(slug: str):
    tenant = tenancy.tenant_create(slug=slug, name=slug)
    key, raw = tenancy.key_create(tenant=tenant, name="web", allowed_origins=[ORIGIN])
    key.raw = raw
    return key


def context_update(url: str) -> dict:
    return {"url": url, "title": "Page", "activeTools": [], "context": {}}


async def frames_until_close(page: Page) -> tuple[list[dict], dict]:
    frames = []
    while True:
        frame = await page.recv(SOON)
        if frame["type"] == "__close__":
            return frames, frame
        frames.append(frame)


@pytest.mark.django_db(transaction=True)
@override_settings(OWLLAYER_FRAMES_PER_SECOND=5, OWLLAYER_FLOOD_CLOSE_DROPS=47)
async def test_a_flood_is_answered_with_rate_limited_and_another_tenants_page_is_unaffected(
    clock, connect, api_key
):
    flooder = await open_page(connect, api_key)  # handshake + context: 2 of the 5 frames
    other_key = await in_db(other_tenant_key)("bystander")
    bystander = await open_page(connect, other_key, tools=[ADD_TO_CART])

    # 3 more fit in the second; 47 are dropped; the 48th drop ends it.
    for n in range(3 + 47 + 1):
        await flooder.send("CONTEXT_UPDATE", context_update(f"/flood/{n}"))
    frames, close = await frames_until_close(flooder)

    assert sum(1 for f in frames if is_tools_effective(f)) == 3
    assert error_codes(frames) == ["rate_limited", "too_many_frames"]
    assert close["code"] == 1008
    await bystander.send("CONTEXT_UPDATE", context_update("/still-here"))
    assert is_tools_effective(await bystander.recv(SOON))
    await bystander.send("USER_INPUT", {"modality": "text", "content": "hello"})
    answer = await collect_until(bystander, done)
    assert error_codes(answer) == []
    assert (await Session.objects.aget(api_key=other_key)).ended_at is None
    await bystander.close()


@pytest.mark.django_db(transaction=True)
@override_settings(OWLLAYER_FRAMES_PER_SECOND=3)
async def test_a_user_input_over_the_frames_per_second_limit_is_ended_with_one_empty_done(
    clock, connect, api_key
):
    page = await open_page(connect, api_key)  # handshake + context: 2 of the 3 frames
    await page.send("CONTEXT_UPDATE", context_update("/third"))
    assert is_tools_effective(await page.recv(SOON))

    await page.send("USER_INPUT", {"modality": "text", "content": "hello"})
    refused = await collect_until(page, done)

    assert error_codes(refused) == ["rate_limited"]
    assert [f["payload"] for f in refused if f["type"] == "AGENT_RESPONSE"] == [{"chunk": "", "done": True}]
    clock.advance(1.5)
    await page.send("USER_INPUT", {"modality": "text", "content": "a second later"})
    answered = await collect_until(page, done)
    assert error_codes(answered) == [] and answered[-1]["payload"]["done"] is True
    await page.close()


@pytest.mark.django_db(transaction=True)
@override_settings(OWLLAYER_USER_INPUTS_PER_MINUTE=2)
async def test_user_inputs_past_the_per_minute_limit_end_at_once_with_rate_limited(
    clock, connect, api_key
):
    page = await open_page(connect, api_key)
    for _ in range(2):
        await page.send("USER_INPUT", {"modality": "text", "content": "hello"})
        assert error_codes(await collect_until(page, done)) == []

    await page.send("USER_INPUT", {"modality": "text", "content": "hello again"})
    refused = await collect_until(page, done)

    assert error_codes(refused) == ["rate_limited"]
    assert refused[0]["payload"]["data"]["limit"] == "user_inputs_per_minute"
    assert refused[-1]["payload"] == {"chunk": "", "done": True}
    clock.advance(61)
    await page.send("USER_INPUT", {"modality": "text", "content": "a minute later"})
    assert error_codes(await collect_until(page, done)) == []
    await page.close()


def use_tokens(tenant: Tenant, *, quota: int, used: int) -> None:
    Tenant.objects.filter(pk=tenant.pk).update(monthly_token_quota=quota)
    DailyUsage.objects.update_or_create(
        tenant=tenant, date=timezone.localdate(),
        defaults={"input_tokens": used // 2, "output_tokens": used - used // 2},
    )


@pytest.mark.django_db(transaction=True)
async def test_a_used_up_quota_refuses_new_sessions_with_the_specs_words_and_1008(
    connect, api_key, tenant
):
    await in_db(use_tokens)(tenant, quota=1_000, used=1_000)
    page = await connect()

    error = await page.handshake(api_key.raw)

    assert error["payload"]["kind"] == "error"
    assert error["payload"]["message"] == "API key usage limit exceeded."
    assert error["payload"]["data"]["code"] == "usage_limit_exceeded"
    assert (await page.recv())["code"] == 1008
    assert not await Session.objects.filter(api_key=api_key).aexists()


@pytest.mark.django_db(transaction=True)
async def test_a_quota_of_zero_is_unlimited(connect, api_key, tenant):
    await in_db(use_tokens)(tenant, quota=0, used=10**9)
    page = await open_page(connect, api_key)
    await page.send("USER_INPUT", {"modality": "text", "content": "hello"})
    assert error_codes(await collect_until(page, done)) == []
    await page.close()


@pytest.mark.django_db(transaction=True)
async def test_a_quota_used_up_during_a_session_refuses_the_next_turn_and_ends_it(
    connect, api_key, tenant
):
    await in_db(use_tokens)(tenant, quota=1_000, used=999)
    page = await open_page(connect, api_key)
    await in_db(use_tokens)(tenant, quota=1_000, used=1_001)

    await page.send("USER_INPUT", {"modality": "text", "content": "hello"})
    frames = await collect_until(page, done)

    (error,) = [f for f in frames if f["type"] == "SYSTEM_EVENT"]
    assert error["payload"]["message"] == "API key usage limit exceeded."
    assert error["payload"]["data"] == {"code": "usage_limit_exceeded"}
    assert frames[-1]["payload"] == {"chunk": "", "done": True}
    assert (await Session.objects.aget(api_key=api_key)).ended_at is None
    await page.close()


@pytest.mark.django_db(transaction=True)
@override_settings(OWLLAYER_APPROVAL_REQUESTS_PER_CALL=5, OWLLAYER_FRAMES_PER_SECOND=0)
async def test_one_audit_row_however_many_approval_requests_for_a_call(connect, api_key):
    page = await open_page(connect, api_key, tools=[PAY], url="/checkout")
    await page.send("USER_INPUT", {"modality": "text", "content": '/tool pay {"amount": 42}'})
    call = await page.recv_until("TOOL_CALL", timeout=SOON)
    call_id = call["payload"]["callId"]
    request = {"callId": call_id, "toolName": "pay", "risk": "critical",
               "args": call["payload"]["args"], "message": "Pay 42 USD with the saved card?"}

    for _ in range(60):
        await page.send("APPROVAL_REQUEST", request)
    refused = [await page.recv(SOON) for _ in range(60 - 5)]

    assert {json.dumps(f["payload"]["data"], sort_keys=True) for f in refused} == {json.dumps(
        {"code": "rate_limited", "limit": "approval_requests_per_call", "callId": call_id},
        sort_keys=True)}
    trail = [event.action async for event in AuditEvent.objects.filter(call_id=call_id)]
    assert trail == ["requested"]
    await page.send("APPROVAL_RESPONSE", {"callId": call_id, "approved": True,
                                          "result": {"paid": True}})
    assert error_codes(await collect_until(page, done)) == []
    await page.close()


@pytest.mark.django_db(transaction=True)
@override_settings(OWLLAYER_SESSION_OPENS_PER_KEY_PER_MINUTE=2)
async def test_opens_past_the_per_key_limit_are_refused_with_1013_and_other_keys_open(
    clock, connect, api_key
):
    for _ in range(2):
        page = await connect()
        assert (await page.handshake(api_key.raw))["type"] == "HANDSHAKE_ACK"
        await page.close()

    page = await connect()
    error = await page.handshake(api_key.raw)
    other_key = await in_db(other_tenant_key)("second")
    other = await connect()

    assert error["payload"]["data"]["code"] == "rate_limited"
    assert error["payload"]["data"]["limit"] == "session_opens_per_key_per_minute"
    assert (await page.recv())["code"] == 1013
    assert (await other.handshake(other_key.raw))["type"] == "HANDSHAKE_ACK"
    await other.close()


@pytest.mark.django_db(transaction=True)
@override_settings(OWLLAYER_SESSION_OPENS_PER_KEY_PER_MINUTE=1)
async def test_an_open_refused_for_the_per_key_limit_leaves_the_groups_it_joined(connect, api_key):
    from channels.layers import get_channel_layer

    from aitp import notify

    page = await connect()
    assert (await page.handshake(api_key.raw))["type"] == "HANDSHAKE_ACK"
    refused = await connect()  # joins the key's group while its open is counted
    assert (await refused.handshake(api_key.raw))["payload"]["data"]["code"] == "rate_limited"
    assert (await refused.recv())["code"] == 1013
    await page.close()

    layer, group = get_channel_layer(), notify.key_group(api_key.pk)
    deadline = asyncio.get_running_loop().time() + SOON
    while members := await group_members(layer, group):
        assert asyncio.get_running_loop().time() < deadline, f"still in the key's group: {members}"
        await asyncio.sleep(0.05)


async def group_members(layer, group: str) -> set:
    """The channels in a group, on the in-memory layer or on Redis."""
    groups = getattr(layer, "groups", None)
    if groups is not None:
        return set(groups.get(group, {}))
    connection = layer.connection(layer.consistent_hash(group))
    return set(await connection.zrange(layer._group_key(group), 0, -1))


@pytest.mark.django_db(transaction=True)
async def test_a_session_opens_while_the_counter_store_is_down(connect, api_key, limits_log):
    with override_settings(REDIS_URL=f"redis://127.0.0.1:{free_port()}/0",
                           OWLLAYER_SESSION_OPENS_PER_KEY_PER_MINUTE=1):
        for _ in range(2):
            page = await connect()
            assert (await page.handshake(api_key.raw))["type"] == "HANDSHAKE_ACK"
            await page.close()
    assert any("counter store unavailable" in line for line in limits_log)


# --- two processes, one Redis ----------------------------------------------------------


@pytest.mark.redis
@pytest.mark.django_db(transaction=True)
async def test_one_keys_opens_are_counted_across_two_processes_on_one_redis(
    daphne_factory, redis_required
):
    key = await in_db(other_tenant_key)("shared-count")
    other_key = await in_db(other_tenant_key)("shared-other")
    env = {"OWLLAYER_SESSION_OPENS_PER_KEY_PER_MINUTE": 3,
           "OWLLAYER_LIMITS_PREFIX": f"owl-limits-test-{secrets.token_hex(6)}"}
    first, second = daphne_factory(**env), daphne_factory(**env)
    pages = []
    try:
        for server in (first, second, first):
            page = AitpClient(server.ws_url(), api_key=key.raw, origin=ORIGIN)
            pages.append(page)
            await page.connect()

        late = AitpClient(second.ws_url(), api_key=key.raw, origin=ORIGIN)
        with pytest.raises(AitpRefused) as refused:
            await late.connect()
        other = AitpClient(second.ws_url(), api_key=other_key.raw, origin=ORIGIN)
        pages.append(other)
        await other.connect()
    finally:
        for page in pages:
            await page.close()

    assert (refused.value.code, refused.value.close_code) == ("rate_limited", 1013)
    assert other.session_id is not None


@pytest.mark.django_db(transaction=True)
async def test_a_tenants_quota_verdict_is_read_once_per_usage_flush_interval(settings, monkeypatch):
    settings.OWLLAYER_USAGE_FLUSH_INTERVAL = 60
    tenant = await in_db(lambda: Tenant.objects.create(slug=f"q{secrets.token_hex(4)}",
                                                       monthly_token_quota=1000))()
    reads = []
    real = limits.token_quota_used_up
    monkeypatch.setattr(limits, "token_quota_used_up",
                        lambda t, **kw: (reads.append(t.pk), real(t, **kw))[1])
    monkeypatch.setattr(limits, "_quota_verdicts",
                        limits.RecentAnswers(limits._usage_flush_interval))
    unused = limits.QuotaVerdict(quota=1000, used_up=False)
    assert await limits._quota_verdict(tenant.pk) == unused
    assert await limits._quota_verdict(tenant.pk) == unused
    assert reads == [tenant.pk]
    settings.OWLLAYER_USAGE_FLUSH_INTERVAL = 0
    assert await limits._quota_verdict(tenant.pk) == unused
    assert reads == [tenant.pk, tenant.pk]
