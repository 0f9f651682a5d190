"""A session open is admitted by one rule (``aitp.store.admission.refusal``)
over what each way of opening reads and counts under the key's and its
tenant's row locks: the plain store's ORM, the fast store's transaction of
statements (SQLite) and its one query (PostgreSQL). Each case here runs
through every way, and all must decide alike: the key's status and expiry,
its session cap, its tenant's ceiling over all its keys, which sessions
count (ended, silent, of a process known to be gone) and, when both limits
are reached, which refusal the page gets.

The one query exists on PostgreSQL only; on SQLite its cases are skipped.
"""
from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from aitp import services, store, tenancy
from aitp.models import ApiKey, ServerProcess, Session
from aitp.store import keys
from aitp.store.fast import FastStore
from aitp.store.plain import PlainStore
from tests.aitp.conftest import ORIGIN

pytestmark = pytest.mark.django_db

HEARTBEAT = 10.0


@dataclass(frozen=True)
class Case:
    key_cap: int
    ceiling: int | None  # the tenant's; None: no ceiling
    on_key: int = 0  # live sessions of the key that opens
    on_other_key: int = 0  # live sessions of another key of the same tenant
    silent: int = 0  # sessions of the key not seen for over three heartbeats
    ended: int = 0  # ended sessions of the key
    of_gone_process: int = 0  # live-looking sessions of the key, held by a stopped process
    status: str = ApiKey.Status.ACTIVE
    expired: bool = False
    other_tenant: int = 0  # live sessions of another tenant
    expected: str = "opened"
    extra: dict = field(default_factory=dict)


CASES = {
    "room-on-both": Case(key_cap=3, ceiling=5, on_key=1, on_other_key=1),
    "the-keys-last-slot": Case(key_cap=3, ceiling=10, on_key=2),
    "the-key-at-its-cap": Case(key_cap=3, ceiling=10, on_key=3, expected="session_limit"),
    "the-tenants-last-slot": Case(key_cap=10, ceiling=4, on_key=1, on_other_key=2),
    "the-tenant-at-its-ceiling-over-two-keys": Case(
        key_cap=10, ceiling=4, on_key=1, on_other_key=3, expected="tenant_session_limit"),
    "the-tenant-at-its-ceiling-by-another-key-alone": Case(
        key_cap=10, ceiling=2, on_other_key=2, expected="tenant_session_limit"),
    "both-at-their-limits-the-key-is-named": Case(
        key_cap=2, ceiling=3, on_key=2, on_other_key=1, expected="session_limit"),
    "no-ceiling-many-on-other-keys": Case(key_cap=2, ceiling=None, on_key=1, on_other_key=40),
    "another-tenants-sessions-do-not-count": Case(key_cap=5, ceiling=2, on_key=1, other_tenant=6),
    "silent-sessions-do-not-count": Case(key_cap=2, ceiling=2, on_key=1, silent=5),
    "ended-sessions-do-not-count": Case(key_cap=2, ceiling=2, on_key=1, ended=5),
    "sessions-of-a-gone-process-do-not-count-for-the-key": Case(
        key_cap=2, ceiling=10, on_key=1, of_gone_process=3),
    "sessions-of-a-gone-process-do-not-count-for-the-tenant": Case(
        key_cap=10, ceiling=2, on_key=1, of_gone_process=3),
    "a-revoked-key": Case(key_cap=5, ceiling=5, status=ApiKey.Status.REVOKED,
                          expected="api_key_revoked"),
    "a-disabled-key": Case(key_cap=5, ceiling=5, status=ApiKey.Status.DISABLED,
                           expected="api_key_disabled"),
    "an-expired-key": Case(key_cap=5, ceiling=5, expired=True, expected="api_key_expired"),
    "a-revoked-key-at-its-cap-is-refused-as-revoked": Case(
        key_cap=1, ceiling=1, on_key=1, status=ApiKey.Status.REVOKED, expected="api_key_revoked"),
}


@pytest.fixture(autouse=True)
def heartbeat(settings):
    settings.OWLLAYER_HEARTBEAT_INTERVAL = HEARTBEAT


def handshake() -> store.HandshakeInfo:
    return store.HandshakeInfo(
        session_id=f"ses_{secrets.token_hex(6)}", origin=ORIGIN, user_agent="pytest",
        viewport="1x1", sdk_version="0.4.0", protocol_version="1.0.0",
        channel_name=f"test.{secrets.token_hex(4)}",
    )


def rows(key: ApiKey, count: int, **fields) -> None:
    for _ in range(count):
        Session.objects.create(id=f"ses_{secrets.token_hex(6)}", tenant_id=key.tenant_id,
                               api_key=key, **fields)


def arrange(case: Case) -> tuple[ApiKey, str]:
    now = timezone.now()
    tenant = tenancy.tenant_create(slug=f"t{secrets.token_hex(4)}")
    tenant.max_sessions, tenant.max_keys = case.ceiling, None
    tenant.save(update_fields=["max_sessions", "max_keys"])
    key, raw = tenancy.key_create(tenant=tenant, allowed_origins=[ORIGIN],
                                  max_sessions=case.key_cap)
    other, _ = tenancy.key_create(tenant=tenant, max_sessions=1000)
    rows(key, case.on_key)
    rows(other, case.on_other_key)
    rows(key, case.silent, last_seen_at=now - timedelta(seconds=10 * HEARTBEAT))
    rows(key, case.ended, ended_at=now)
    if case.of_gone_process:
        gone = ServerProcess.objects.create(id=f"gone:{secrets.token_hex(4)}", hostname="elsewhere",
                                            pid=1, stopped_at=now)
        rows(key, case.of_gone_process, process=gone.id)
    if case.other_tenant:
        stranger = tenancy.tenant_create(slug=f"s{secrets.token_hex(4)}")
        stranger_key, _ = tenancy.key_create(tenant=stranger, max_sessions=1000)
        rows(stranger_key, case.other_tenant)
    ApiKey.objects.filter(pk=key.pk).update(
        status=case.status, expires_at=now - timedelta(seconds=1) if case.expired else None)
    return key, raw


def open_by(path: str, raw: str) -> tuple[Session | None, services.Refusal | None]:
    now = timezone.now()
    key = keys.api_key_lookup(raw)  # the first, unlocked read, as session_open makes it
    info = handshake()
    if path == "plain":
        return PlainStore().session_open(raw_key=raw, info=info)
    if path == "statements":
        return FastStore()._open_locked(key, raw, info, now)
    return FastStore()._open_in_one_query(key, raw, info, now)


@pytest.fixture(params=["plain", "statements", "one query"])
def path(request) -> str:
    if request.param == "one query" and connection.vendor != "postgresql":
        pytest.skip("the one-query admission is PostgreSQL's (the second test pass)")
    return request.param


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_every_way_of_opening_decides_each_case_alike(path, case):
    key, raw = arrange(case)
    before = Session.objects.filter(api_key=key).count()

    session, refusal = open_by(path, raw)

    outcome = "opened" if refusal is None else refusal.code
    assert outcome == case.expected
    after = Session.objects.filter(api_key=key).count()
    if case.expected == "opened":
        assert session is not None and after == before + 1
        assert Session.objects.get(pk=session.pk).ended_at is None
    else:
        assert session is None and after == before


def test_the_tenants_ceiling_refuses_in_its_own_words(tenant):
    tenant.max_sessions = 1
    tenant.save(update_fields=["max_sessions"])
    _, first = tenancy.key_create(tenant=tenant)
    _, second = tenancy.key_create(tenant=tenant)
    assert store.current().session_open(raw_key=first, info=handshake())[1] is None

    session, refusal = store.current().session_open(raw_key=second, info=handshake())

    assert session is None
    assert refusal == services.Refusal(
        "tenant_session_limit", "Too many concurrent sessions for this tenant.",
        "tenant session limit reached")
