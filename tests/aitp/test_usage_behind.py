"""The tenants' daily usage, written behind, and the key's session cap under
concurrent opens.

Every open and every turn of a tenant counts in the same ``DailyUsage`` row;
a process adds the counts up and writes them every
``OWLLAYER_USAGE_FLUSH_INTERVAL`` seconds and when it stops (the rest of the
suite runs with 0: every count written at once). A session open locks its
key's and its tenant's rows only for the counts: the key's cap and the
tenant's ceiling still admit exactly that many of many opens racing on their
own connections.
"""
from __future__ import annotations

import asyncio
import secrets
import signal
import threading

import pytest
from django.db import DatabaseError, connection, transaction
from django.utils import timezone

from aitp import processes, store, tenancy
from aitp.models import DailyUsage, Session
from aitp.store import usage
from aitp_client import AitpClient, AitpRefused

ORIGIN = "http://page.example"
# Longer than any test: nothing is written behind unless the test flushes.
NEVER = 3600.0
# The drain of the SIGTERM test, and how long past it the test waits for the exit.
DRAIN = 20.0
EXIT_MARGIN = 30.0
SOON = 15.0


def handshake() -> store.HandshakeInfo:
    return store.HandshakeInfo(
        session_id=f"ses_{secrets.token_hex(6)}", origin=ORIGIN, user_agent="pytest",
        viewport="1440x900", sdk_version="0.4.0", protocol_version="1.0.0",
        channel_name=f"test.{secrets.token_hex(4)}",
    )


@pytest.fixture
def behind(settings, monkeypatch):
    """This process writes usage behind, with a buffer of its own."""
    settings.OWLLAYER_USAGE_FLUSH_INTERVAL = NEVER
    buffer = usage.UsageBuffer()
    monkeypatch.setattr(usage, "_usage", buffer)
    return buffer


@pytest.fixture
def tenant(db):
    return tenancy.tenant_create(slug="usage", name="Usage")


def day_of(tenant) -> dict:
    row = DailyUsage.objects.filter(tenant=tenant, date=timezone.localdate()).first()
    if row is None:
        return {}
    return {name: getattr(row, name) for name in usage.USAGE_FIELDS}


def a_turn(session: Session, turn: int) -> None:
    store.current().turn_checkpoint(
        session_id=session.id, tenant_id=session.tenant_id, turn=turn,
        messages=[{"seq": turn, "role": "user", "content": [{"type": "text", "text": "hi"}]}],
        usage={"turns": 1, "input_tokens": 10, "output_tokens": 5, "cache_read_tokens": 2,
               "cache_write_tokens": 1},
    )


def test_opens_and_turns_are_counted_exactly_once_flushed(tenant, behind):
    _, raw = tenancy.key_create(tenant=tenant)
    sessions = [store.current().session_open(raw_key=raw, info=handshake())[0] for _ in range(3)]
    for turn, session in enumerate(sessions * 2, start=1):
        a_turn(session, turn)
    assert day_of(tenant) == {}  # nothing written yet: counted in the process

    assert store.current().usage_flush() == 1
    assert day_of(tenant) == {"sessions": 3, "turns": 6, "input_tokens": 60, "output_tokens": 30,
                              "cache_read_tokens": 12, "cache_write_tokens": 6}
    assert store.current().usage_pending() == {}
    assert store.current().usage_flush() == 0
    stored = Session.objects.get(id=sessions[0].id)
    assert (stored.turns, stored.input_tokens, stored.output_tokens) == (2, 20, 10)


def test_a_refused_open_counts_nothing(tenant, behind):
    _, raw = tenancy.key_create(tenant=tenant, max_sessions=1)
    assert store.current().session_open(raw_key=raw, info=handshake())[1] is None
    assert store.current().session_open(raw_key=raw, info=handshake())[1].code == "session_limit"
    store.current().usage_flush()
    assert day_of(tenant)["sessions"] == 1


def test_a_flush_the_database_refuses_keeps_its_counts_for_the_next(tenant, behind, monkeypatch):
    _, raw = tenancy.key_create(tenant=tenant)
    store.current().session_open(raw_key=raw, info=handshake())
    real = usage._usage_write

    def refused(*args, **kwargs):
        raise DatabaseError("the database is restarting")

    monkeypatch.setattr(usage, "_usage_write", refused)
    assert store.current().usage_flush_logged() == 0
    monkeypatch.setattr(usage, "_usage_write", real)
    store.current().session_open(raw_key=raw, info=handshake())
    store.current().usage_flush()
    assert day_of(tenant)["sessions"] == 2


def test_the_clean_stop_writes_what_the_process_counted(tenant, behind):
    _, raw = tenancy.key_create(tenant=tenant)
    for _ in range(2):
        store.current().session_open(raw_key=raw, info=handshake())
    processes.mark_stopped()
    assert day_of(tenant)["sessions"] == 2


@pytest.mark.django_db(transaction=True)
def test_the_counts_of_two_processes_add_up(settings):
    settings.OWLLAYER_USAGE_FLUSH_INTERVAL = NEVER
    tenant = tenancy.tenant_create(slug="two", name="Two")
    per_process, rounds = 25, 8
    start = threading.Barrier(2)
    errors: list[BaseException] = []

    def process() -> None:
        buffer = usage.UsageBuffer()
        try:
            start.wait()
            for _ in range(rounds):
                for _ in range(per_process):
                    buffer.add(tenant.pk, timezone.localdate(), {"turns": 1, "input_tokens": 3})
                buffer.flush()
        except BaseException as exc:  # reported by the test below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=process) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    counted = day_of(tenant)
    assert (counted["turns"], counted["input_tokens"]) == (2 * rounds * per_process,
                                                      3 * 2 * rounds * per_process)


@pytest.mark.django_db(transaction=True)
def test_concurrent_opens_take_exactly_the_keys_cap():
    tenant = tenancy.tenant_create(slug="race", name="Race")
    cap, racers = 3, 12
    key, raw = tenancy.key_create(tenant=tenant, max_sessions=cap)
    start = threading.Barrier(racers)
    outcomes: list = []

    def open_one() -> None:
        try:
            start.wait()
            session, refusal = store.current().session_open(raw_key=raw, info=handshake())
            outcomes.append("opened" if session is not None else refusal.code)
        except BaseException as exc:  # reported by the test below
            outcomes.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=open_one) for _ in range(racers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(outcomes, key=str) == ["opened"] * cap + ["session_limit"] * (racers - cap)
    assert Session.objects.filter(api_key=key).count() == cap


@pytest.mark.django_db(transaction=True)
def test_concurrent_opens_over_several_keys_take_exactly_the_tenants_ceiling():
    tenant = tenancy.tenant_create(slug="ceiling-race", name="Ceiling race")
    ceiling, racers = 4, 16
    tenant.max_sessions = ceiling
    tenant.save(update_fields=["max_sessions"])
    # Each key alone would take every racer: only the tenant's ceiling refuses.
    KEYS = 4
    raws = [tenancy.key_create(tenant=tenant, max_sessions=racers)[1] for _ in range(KEYS)]
    start = threading.Barrier(racers)
    outcomes: list = []

    def open_one(raw: str) -> None:
        try:
            start.wait()
            session, refusal = store.current().session_open(raw_key=raw, info=handshake())
            outcomes.append("opened" if session is not None else refusal.code)
        except BaseException as exc:  # reported by the test below
            outcomes.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=open_one, args=(raws[n % KEYS],)) for n in range(racers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(outcomes, key=str) == ["opened"] * ceiling + ["tenant_session_limit"] * (
        racers - ceiling)
    assert Session.objects.filter(tenant=tenant, ended_at=None).count() == ceiling


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("path", ["one query", "several statements"])
def test_an_open_waits_for_its_tenants_row_lock_whichever_key_it_uses(path, monkeypatch):
    """What makes the ceiling exact across keys and processes: an open
    counts the tenant's sessions under the tenant's row lock, held by
    another open (of any key) until it commits."""
    if connection.vendor != "postgresql":
        pytest.skip("row locks are PostgreSQL's; SQLite runs one write transaction at a time")
    from django.db import OperationalError

    from aitp.store import statements
    from tenants.models import Tenant

    if path == "several statements":
        monkeypatch.setattr(statements, "one_query_transactions", lambda: False)
    tenant = tenancy.tenant_create(slug="locked", name="Locked")
    _, raw = tenancy.key_create(tenant=tenant)
    held, release = threading.Event(), threading.Event()

    def another_open_of_the_tenant() -> None:
        try:
            with transaction.atomic():
                Tenant.objects.select_for_update(no_key=True).get(pk=tenant.pk)
                held.set()
                release.wait(SOON)
        finally:
            connection.close()

    holder = threading.Thread(target=another_open_of_the_tenant)
    holder.start()
    try:
        assert held.wait(SOON)
        with connection.cursor() as cursor:
            cursor.execute("SET lock_timeout = '200ms'")
        with pytest.raises(OperationalError, match="lock timeout"):
            store.current().session_open(raw_key=raw, info=handshake())
    finally:
        release.set()
        holder.join()
        with connection.cursor() as cursor:
            cursor.execute("SET lock_timeout = 0")
    assert not Session.objects.filter(tenant=tenant).exists()


@pytest.mark.e2e
@pytest.mark.django_db(transaction=True)
async def test_two_processes_admit_exactly_the_tenants_ceiling_over_two_keys(daphne_factory):
    def arrange():
        tenant = tenancy.tenant_create(slug="ceiling-two", name="Two", max_sessions=3)
        return [tenancy.key_create(tenant=tenant, allowed_origins=[ORIGIN], max_sessions=10)[1]
                for _ in range(2)]

    raws = await asyncio.to_thread(arrange)
    servers = [daphne_factory(), daphne_factory()]
    pages = [AitpClient(servers[n % 2].ws_url(), api_key=raws[n // 2 % 2], origin=ORIGIN)
             for n in range(8)]

    async def open_one(page: AitpClient) -> str:
        try:
            await page.connect()
        except AitpRefused as refused:
            return f"{refused.code} {refused.close_code}"
        return "opened"

    try:
        outcomes = await asyncio.gather(*(open_one(page) for page in pages))
    finally:
        for page in pages:
            await page.close()
    assert sorted(outcomes) == ["opened"] * 3 + ["tenant_session_limit 1008"] * 5


@pytest.mark.e2e
@pytest.mark.django_db(transaction=True)
async def test_sigterm_writes_the_usage_counted_behind(daphne_factory):
    tenant = await asyncio.to_thread(lambda: tenancy.tenant_create(slug="stop", name="Stop"))
    _, raw = await asyncio.to_thread(
        lambda: tenancy.key_create(tenant=tenant, allowed_origins=[ORIGIN]))
    server = daphne_factory(OWLLAYER_USAGE_FLUSH_INTERVAL=NEVER, OWLLAYER_SHUTDOWN_DRAIN=DRAIN)
    pages = [AitpClient(server.ws_url(), api_key=raw, origin=ORIGIN) for _ in range(2)]
    for page in pages:
        await page.connect()
        await page.user_input("hello")
        await page.recv_until(lambda f: f["type"] == "AGENT_RESPONSE" and f["payload"]["done"],
                              timeout=SOON)
    counted = await asyncio.to_thread(lambda: day_of(tenant))
    assert counted == {}  # counted in the process, not written yet

    server.process.send_signal(signal.SIGTERM)
    exit_code = await asyncio.to_thread(server.process.wait, DRAIN + EXIT_MARGIN)
    assert exit_code == 0, server.logs()
    counted = await asyncio.to_thread(lambda: day_of(tenant))
    assert (counted["sessions"], counted["turns"]) == (2, 2)
