"""The monthly token quota holds request by request (``aitp.quota``).

Each model request of a tenant with a quota is reserved first and runs only
while the month's used tokens plus those reserved stay under the quota; its
real tokens are counted when it ends and the reservation released. The
promises, each pinned here on both backends:

- however many sessions and processes a tenant runs at once, it spends at
  most its quota plus one model request per live session;
- a turn looping through tool rounds stops between rounds once the quota is
  crossed, with the spec's words and then an empty done, every tool call
  keeping its one result;
- a request that fails, or a turn cancelled mid-request, releases its
  reservation; a process killed mid-request stops holding it once the sweep
  finds it gone (or it expires);
- a tenant without a quota reserves nothing: no query per request.

The model is the fake Messages API (tests/support/fake_anthropic.py) behind
the real SDK; the promises about several sessions and processes run on real
daphne processes.
"""
from __future__ import annotations

import asyncio
import secrets
import threading
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from aitp import processes, quota, tenancy
from aitp.llm import LlmRequest
from aitp.models import ConversationMessage, DailyUsage, ServerProcess, TokenReservation, ToolCall
from aitp.store import usage
from aitp_client import AitpClient
from llm import reset_backend
from llm.anthropic_backend import close_client
from tenants.models import Tenant
from tests.aitp.conftest import ADD_TO_CART, ORIGIN, in_db
from tests.support.fake_anthropic import (
    FakeAnthropicServer,
    StreamedMessage,
    TextBlock,
    error_response,
    text_response,
    tool_use_response,
)

API_KEY = "sk-ant-quota-tests"
# What each scripted model request uses (input + output).
REQUEST_TOKENS = 50
USAGE = {"input_tokens": 30, "output_tokens": 20}
PATIENCE = 60.0


def tool_round(body: dict):
    """A model that calls the page's tool every round it may, and answers in
    text when told to (the round limit)."""
    if (body.get("tool_choice") or {}).get("type") == "none":
        return text_response("All done.", usage=USAGE)
    return tool_use_response([("add_to_cart", {"quantity": 1})], usage=USAGE)


def tokens_this_month(tenant_id: int) -> int:
    used, _ = quota.used_and_reserved(tenant_id, now=timezone.now())
    return used


def new_tenant(*, monthly_quota: int | None, used: int = 0) -> Tenant:
    tenant = tenancy.tenant_create(slug=f"q{secrets.token_hex(4)}", monthly_token_quota=monthly_quota)
    if used:
        DailyUsage.objects.create(tenant=tenant, date=timezone.localdate(), input_tokens=used)
    return tenant


def new_key(tenant: Tenant, *, max_sessions: int = 50):
    key, raw = tenancy.key_create(tenant=tenant, allowed_origins=[ORIGIN],
                                  max_sessions=max_sessions)
    key.raw = raw
    return key


def request(*, max_tokens: int = 100, text: str = "") -> LlmRequest:
    return LlmRequest(model="m", system=[], messages=[{"role": "user", "content": text}], tools=[],
                      max_tokens=max_tokens)


# --- the reservation, in the database ---------------------------------------------------


@pytest.mark.django_db
def test_a_request_is_reserved_while_used_and_reserved_tokens_stay_under_the_quota():
    tenant = new_tenant(monthly_quota=1_000, used=500)

    first = quota.reserve(tenant_id=tenant.pk, tokens=400)  # 500 used + 0 reserved
    second = quota.reserve(tenant_id=tenant.pk, tokens=400)  # 500 + 400: room left
    third = quota.reserve(tenant_id=tenant.pk, tokens=1)  # 500 + 800: none

    assert first is not None and second is not None and third is None
    assert TokenReservation.objects.filter(tenant=tenant).count() == 2
    assert quota.used_and_reserved(tenant.pk, now=timezone.now()) == (500, 800)


@pytest.mark.django_db
def test_a_settled_request_counts_its_real_tokens_and_releases_its_reservation():
    tenant = new_tenant(monthly_quota=1_000, used=100)
    reservation = quota.reserve(tenant_id=tenant.pk, tokens=900)
    assert quota.reserve(tenant_id=tenant.pk, tokens=1) is None  # 100 + 900: full

    quota.settle(reservation_id=reservation, tenant_id=tenant.pk, input_tokens=70, output_tokens=30)

    assert not TokenReservation.objects.filter(tenant=tenant).exists()
    assert quota.used_and_reserved(tenant.pk, now=timezone.now()) == (200, 0)
    assert quota.reserve(tenant_id=tenant.pk, tokens=1) is not None


@pytest.mark.django_db
def test_a_reservation_past_its_time_stops_counting(settings):
    settings.OWLLAYER_TOKEN_RESERVATION_SECONDS = 30
    tenant = new_tenant(monthly_quota=100)
    long_ago = timezone.now() - timedelta(seconds=31)
    assert quota.reserve(tenant_id=tenant.pk, tokens=5_000, now=long_ago) is not None

    assert quota.used_and_reserved(tenant.pk, now=timezone.now()) == (0, 0)
    assert quota.reserve(tenant_id=tenant.pk, tokens=10) is not None
    assert processes.sweep().reservations == 1  # and the sweep tidies it away
    assert TokenReservation.objects.filter(tenant=tenant).count() == 1


@pytest.mark.django_db
def test_the_sweep_releases_the_reservations_of_a_process_that_is_gone():
    tenant = new_tenant(monthly_quota=100)
    gone = ServerProcess.objects.create(id=f"elsewhere:1:{secrets.token_hex(4)}", hostname="elsewhere",
                                        pid=1, stopped_at=timezone.now())
    alive = ServerProcess.objects.create(id=f"elsewhere:2:{secrets.token_hex(4)}", hostname="elsewhere",
                                         pid=2)
    quota.reserve(tenant_id=tenant.pk, tokens=60, process=gone.id)
    kept = quota.reserve(tenant_id=tenant.pk, tokens=30, process=alive.id)

    result = processes.sweep()

    assert result.reservations == 1
    assert list(TokenReservation.objects.values_list("pk", flat=True)) == [kept]


@pytest.mark.django_db
def test_a_tenant_without_a_quota_always_gets_its_reservation():
    tenant = new_tenant(monthly_quota=None, used=10**9)
    assert quota.reserve(tenant_id=tenant.pk, tokens=10**6) is not None


@pytest.mark.django_db(transaction=True)
def test_reservations_racing_on_their_own_connections_take_exactly_the_room_left():
    # As processes do: each thread has its own database connection.
    tenant = new_tenant(monthly_quota=1_000)
    racers = 12
    start = threading.Barrier(racers)
    outcomes: list = []

    def reserve_one() -> None:
        try:
            start.wait()
            outcomes.append(quota.reserve(tenant_id=tenant.pk, tokens=300) is not None)
        except BaseException as exc:  # reported below
            outcomes.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=reserve_one) for _ in range(racers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    # Admitted while used + reserved < 1,000: at 0, 300, 600 and 900 reserved.
    assert sorted(outcomes, key=str) == [False] * (racers - 4) + [True] * 4
    assert TokenReservation.objects.filter(tenant=tenant).count() == 4


@pytest.mark.django_db(transaction=True)
def test_a_reservation_waits_for_its_tenants_row_lock():
    """What makes the count exact across processes on PostgreSQL: the
    reservations of a tenant are counted under its row lock, held by
    another reservation (or session open) until it commits."""
    if connection.vendor != "postgresql":
        pytest.skip("row locks are PostgreSQL's; SQLite runs one write transaction at a time")
    from django.db import OperationalError, transaction

    tenant = new_tenant(monthly_quota=1_000)
    held, release = threading.Event(), threading.Event()

    def another_reservation() -> None:
        try:
            with transaction.atomic():
                Tenant.objects.select_for_update(no_key=True).get(pk=tenant.pk)
                held.set()
                release.wait(PATIENCE)
        finally:
            connection.close()

    holder = threading.Thread(target=another_reservation)
    holder.start()
    try:
        assert held.wait(PATIENCE)
        with connection.cursor() as cursor:
            cursor.execute("SET lock_timeout = '200ms'")
        with pytest.raises(OperationalError, match="lock timeout"):
            quota.reserve(tenant_id=tenant.pk, tokens=10)
    finally:
        release.set()
        holder.join()
        with connection.cursor() as cursor:
            cursor.execute("SET lock_timeout = 0")
    assert not TokenReservation.objects.filter(tenant=tenant).exists()


def test_a_requests_estimate_is_its_max_tokens_and_its_input_at_four_characters_a_token():
    short = request(max_tokens=100, text="")
    longer = request(max_tokens=100, text="x" * 400)
    assert quota.estimate_tokens(longer) - quota.estimate_tokens(short) == 100
    assert quota.estimate_tokens(request(max_tokens=7)) == 7 + quota.estimate_tokens(short) - 100


# --- a turn, in one process (the real consumer and agent, the real SDK) ----------------------


@pytest.fixture
def fake():
    with FakeAnthropicServer(api_key=API_KEY) as server:
        yield server


@pytest.fixture
async def llm(fake, settings):
    settings.OWLLAYER_LLM = "anthropic"
    settings.ANTHROPIC_API_KEY = API_KEY
    settings.ANTHROPIC_BASE_URL = fake.base_url
    settings.OWLLAYER_MODEL = "claude-test-model"
    settings.OWLLAYER_LLM_MAX_RETRIES = 0
    settings.OWLLAYER_LLM_TIMEOUT = 10.0
    settings.OWLLAYER_TOOL_TIMEOUT = 10.0
    settings.OWLLAYER_STREAM_INTERVAL = 0.005
    reset_backend()
    yield fake
    await close_client()
    reset_backend()


async def open_shop(connect, key):
    page = await connect()
    await page.send("HANDSHAKE_INIT", {"apiKey": key.raw, "userAgent": "pytest", "viewport": "1x1",
                                       "sdkVersion": "0.4.0", "protocolVersion": "1.0.0"})
    ack = await page.recv(PATIENCE)  # the first open of a process checks its voice
    assert ack["type"] == "HANDSHAKE_ACK", ack
    page.session_id = ack["payload"]["sessionId"]
    await page.send("CONTEXT_UPDATE", {"url": "/product", "title": "Product",
                                       "activeTools": [ADD_TO_CART], "context": {}})
    effective = await page.recv(PATIENCE)
    assert effective["payload"]["kind"] == "tools_effective", effective
    return page


async def a_turn(page, text: str = "buy it") -> list[dict]:
    """Send a message, answer every TOOL_CALL, return the frames up to done."""
    await page.send("USER_INPUT", {"modality": "text", "content": text})
    frames = []
    while True:
        frame = await page.recv(PATIENCE)
        assert frame["type"] != "__close__", frames
        frames.append(frame)
        if frame["type"] == "TOOL_CALL":
            await page.send("TOOL_RESULT", {"callId": frame["payload"]["callId"], "status": "success",
                                            "result": {"added": True}})
        if frame["type"] == "AGENT_RESPONSE" and frame["payload"]["done"]:
            return frames


def error_codes(frames: list[dict]) -> list[str]:
    return [f["payload"]["data"]["code"] for f in frames
            if f["type"] == "SYSTEM_EVENT" and f["payload"]["kind"] == "error"]


@pytest.mark.django_db(transaction=True)
async def test_a_looping_tool_turn_stops_between_rounds_once_over_its_quota(llm, connect):
    llm.responder = tool_round
    tenant = await in_db(new_tenant)(monthly_quota=2 * REQUEST_TOKENS - 1)
    key = await in_db(new_key)(tenant)
    page = await open_shop(connect, key)

    frames = await a_turn(page)

    # Round 1 at 0 tokens, round 2 at 50 (under 99): both run; round 3 at 100 does not.
    assert len(llm.requests) == 2
    assert [f["type"] for f in frames].count("TOOL_CALL") == 2
    (error,) = [f for f in frames if f["type"] == "SYSTEM_EVENT"]
    assert error["payload"]["message"] == "API key usage limit exceeded."
    assert error["payload"]["data"] == {"code": "usage_limit_exceeded"}
    assert frames[-2] is error and frames[-1]["payload"] == {"chunk": "", "done": True}
    calls = [c async for c in ToolCall.objects.filter(session_id=page.session_id)]
    assert [c.status for c in calls] == ["success", "success"]
    stored = [m async for m in ConversationMessage.objects.filter(session_id=page.session_id)]
    results = [b["tool_use_id"] for m in stored for b in m.content if b.get("type") == "tool_result"]
    assert sorted(results) == sorted(c.tool_use_id for c in calls)
    assert await in_db(tokens_this_month)(tenant.pk) == 2 * REQUEST_TOKENS  # counted once
    assert not await TokenReservation.objects.filter(tenant=tenant).aexists()
    await page.close()


@pytest.mark.django_db(transaction=True)
async def test_a_request_that_fails_upstream_releases_its_reservation(llm, connect):
    llm.enqueue(error_response(500), text_response("Fine now.", usage=USAGE))
    tenant = await in_db(new_tenant)(monthly_quota=10 * REQUEST_TOKENS)
    key = await in_db(new_key)(tenant)
    page = await open_shop(connect, key)

    failed = await a_turn(page)

    assert error_codes(failed) == ["upstream_error"]
    assert failed[-1]["payload"] == {"chunk": "", "done": True}
    assert not await TokenReservation.objects.filter(tenant=tenant).aexists()
    assert error_codes(await a_turn(page, "again")) == []
    assert await in_db(tokens_this_month)(tenant.pk) == REQUEST_TOKENS
    assert not await TokenReservation.objects.filter(tenant=tenant).aexists()
    await page.close()


@pytest.mark.django_db(transaction=True)
async def test_a_turn_cancelled_mid_request_releases_its_reservation(llm, connect):
    hold = threading.Event()
    llm.enqueue(StreamedMessage(blocks=[TextBlock(["Still ", "thinking"])], usage=USAGE,
                                hold=hold, hold_after_events=1))
    tenant = await in_db(new_tenant)(monthly_quota=10 * REQUEST_TOKENS)
    key = await in_db(new_key)(tenant)
    page = await open_shop(connect, key)
    try:
        await page.send("USER_INPUT", {"modality": "text", "content": "slowly"})
        # The request reaches the model only once its tokens are reserved.
        assert await asyncio.to_thread(llm.wait_for, lambda requests: len(requests) == 1, PATIENCE)
        assert await TokenReservation.objects.filter(tenant=tenant).acount() == 1

        await page.close()  # the page leaves: the turn is cancelled, its teardown awaited
    finally:
        hold.set()

    assert not await TokenReservation.objects.filter(tenant=tenant).aexists()
    assert await in_db(tokens_this_month)(tenant.pk) == 0


@pytest.mark.django_db(transaction=True)
async def test_a_tenant_without_a_quota_reserves_nothing_for_its_requests(llm, connect, monkeypatch):
    llm.responder = tool_round
    asked = []
    monkeypatch.setattr(quota, "reserve", lambda **kw: asked.append(kw))
    monkeypatch.setattr(quota, "settle", lambda **kw: asked.append(kw))
    monkeypatch.setattr(usage, "usage_write_now", lambda *a, **kw: asked.append(kw))
    tenant = await in_db(new_tenant)(monthly_quota=None)
    key = await in_db(new_key)(tenant)
    page = await open_shop(connect, key)

    frames = await a_turn(page)

    assert error_codes(frames) == []
    assert len(llm.requests) > 2  # several rounds, not one reserved
    assert asked == []
    await page.close()


# --- many sessions, several processes, real daphne ---------------------------------------------


def daphne_env(fake, **more) -> dict:
    return {
        "OWLLAYER_LLM": "anthropic", "ANTHROPIC_API_KEY": API_KEY,
        "ANTHROPIC_BASE_URL": fake.base_url, "OWLLAYER_MODEL": "claude-test-model",
        "OWLLAYER_LLM_MAX_RETRIES": 0, "OWLLAYER_LLM_TIMEOUT": 30, "OWLLAYER_TOOL_TIMEOUT": 30,
        "OWLLAYER_HANDSHAKE_TIMEOUT": 60, **more,
    }


async def shop_client(server, key) -> AitpClient:
    client = AitpClient(server.ws_url(), api_key=key.raw, origin=ORIGIN)
    await client.connect(timeout=PATIENCE)
    await client.context_update("/product", "Product", tools=[ADD_TO_CART])
    await client.recv_until(lambda f: f["type"] == "SYSTEM_EVENT"
                            and f["payload"]["kind"] == "tools_effective", timeout=PATIENCE)
    return client


@pytest.mark.django_db(transaction=True)
async def test_forty_sessions_at_once_spend_at_most_the_quota_and_one_request_per_live_session(
        daphne_factory, fake):
    fake.responder = tool_round
    sessions, monthly_quota = 40, 4 * REQUEST_TOKENS
    tenant = await in_db(new_tenant)(monthly_quota=monthly_quota)
    key = await in_db(new_key)(tenant, max_sessions=sessions)
    # Two processes sharing the database (and Redis on the second pass);
    # each turn would run four requests if nothing held it.
    env = daphne_env(fake, OWLLAYER_MAX_TOOL_ROUNDS=3)
    servers = [daphne_factory(**env), daphne_factory(**env)]
    pages = [await shop_client(servers[n % 2], key) for n in range(sessions)]
    try:
        turns = await asyncio.gather(*(page.say("buy", timeout=PATIENCE * 2,
                                                on_tool_call=lambda name, args: {"added": True})
                                       for page in pages))
    finally:
        for page in pages:
            await page.close()

    assert all(frames[-1]["payload"]["done"] for frames in turns)
    spent = REQUEST_TOKENS * sum(1 for r in fake.requests if r.outcome == "complete")
    assert spent <= monthly_quota + REQUEST_TOKENS * sessions
    # Every estimate is above what a request uses: over by one request at most, in all.
    assert spent < monthly_quota + REQUEST_TOKENS
    refused = [frames for frames in turns if "usage_limit_exceeded" in error_codes(frames)]
    assert refused and all(frames[-1]["payload"] == {"chunk": "", "done": True} for frames in refused)
    assert await in_db(tokens_this_month)(tenant.pk) == spent  # each request counted once
    assert not await TokenReservation.objects.filter(tenant=tenant).aexists()


@pytest.mark.django_db(transaction=True)
async def test_a_process_killed_mid_request_stops_holding_its_reservation_once_swept(
        daphne_factory, fake):
    hold = threading.Event()
    fake.enqueue(StreamedMessage(blocks=[TextBlock(["Never ", "finished"])], usage=USAGE, hold=hold,
                                 hold_after_events=1))
    tenant = await in_db(new_tenant)(monthly_quota=10 * REQUEST_TOKENS)
    key = await in_db(new_key)(tenant)
    server = daphne_factory(**daphne_env(fake))
    page = await shop_client(server, key)
    try:
        await page.user_input("then die")
        assert await asyncio.to_thread(fake.wait_for, lambda requests: len(requests) == 1, PATIENCE)
        (held,) = [r async for r in TokenReservation.objects.filter(tenant=tenant)]
        assert held.process and held.tokens > 10 * REQUEST_TOKENS  # it alone fills the quota
        assert await in_db(quota.reserve)(tenant_id=tenant.pk, tokens=1) is None

        server.process.kill()  # kill -9: nothing of the process runs again
        await asyncio.to_thread(server.process.wait, PATIENCE)
        result = await in_db(processes.sweep)()
    finally:
        hold.set()
        await page.close()

    assert result.processes >= 1 and result.reservations == 1
    assert not await TokenReservation.objects.filter(pk=held.pk).aexists()
    assert await in_db(quota.reserve)(tenant_id=tenant.pk, tokens=1) is not None
