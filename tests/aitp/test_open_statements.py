"""A session open's statements (``aitp.open_statements``) read and write the
rows the ORM would: the key with its tenant, the session's insert, the live
count, the close. Each is compared with the ORM's own reading of the same
rows, on whichever backend the pass runs."""
from __future__ import annotations

import secrets
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.utils import timezone

from aitp import store, tenancy
from aitp.models import ApiKey, Session
from aitp.store import open_statements
from tests.aitp.conftest import ORIGIN, queries_sent

pytestmark = pytest.mark.django_db


def handshake(session_id: str | None = None) -> store.HandshakeInfo:
    return store.HandshakeInfo(
        session_id=session_id or f"ses_{secrets.token_hex(6)}", origin=ORIGIN,
        user_agent="Mozilla/5.0 ünïcode", viewport="1440x900", sdk_version="0.4.0",
        protocol_version="1.0.0", channel_name=f"test.{secrets.token_hex(4)}", process="host:1:ab",
    )


def field_values(instance) -> dict:
    return {f.attname: getattr(instance, f.attname) for f in type(instance)._meta.concrete_fields}


def test_the_key_read_for_an_open_is_the_row_and_tenant_the_orm_reads(tenant):
    tenant.monthly_token_quota = 1_000_000
    tenant.save()
    key, _ = tenancy.key_create(
        tenant=tenant, name="shop", allowed_origins=[ORIGIN, "https://b.example"], max_sessions=7,
        expires_at=timezone.now() + timedelta(days=3),
    )
    ApiKey.objects.filter(pk=key.pk).update(last_used_at=timezone.now())

    read = open_statements.key_with_tenant(key.prefix)

    orm = ApiKey.objects.select_related("tenant").get(pk=key.pk)
    assert field_values(read) == field_values(orm)
    assert field_values(read.tenant) == field_values(orm.tenant)
    assert not read._state.adding and not read.tenant._state.adding


def test_the_key_read_under_the_lock_is_the_same_row(tenant):
    key, _ = tenancy.key_create(tenant=tenant, name="shop")
    with transaction.atomic():
        read = open_statements.key_with_tenant(key.prefix, for_update=True)
    assert field_values(read) == field_values(ApiKey.objects.get(pk=key.pk))


def test_an_unknown_prefix_reads_no_key(tenant):
    assert open_statements.key_with_tenant("pk_live_nothere") is None


def test_an_opened_session_row_holds_what_the_handshake_and_the_key_gave(api_key):
    info = handshake()

    session, refusal = store.current().session_open(raw_key=api_key.raw, info=info)

    assert refusal is None
    stored = Session.objects.get(pk=info.session_id)
    assert field_values(stored) == field_values(session)
    assert (stored.api_key_id, stored.tenant_id) == (api_key.pk, api_key.tenant_id)
    assert (stored.origin, stored.user_agent, stored.process) == (
        ORIGIN, "Mozilla/5.0 ünïcode", "host:1:ab")
    assert (stored.context, stored.tools, stored.page_history) == ({}, [], [])
    assert stored.ended_at is None and stored.state == Session.State.IDLE
    assert session.tenant.pk == api_key.tenant_id and session.api_key.pk == api_key.pk


def test_the_live_count_counts_open_rows_seen_since_the_time_given(api_key):
    now = timezone.now()
    for seen_ago in (0, 10, 100):
        session, _ = store.current().session_open(raw_key=api_key.raw, info=handshake())
        Session.objects.filter(pk=session.pk).update(last_seen_at=now - timedelta(seconds=seen_ago))
    ended, _ = store.current().session_open(raw_key=api_key.raw, info=handshake())
    store.current().session_close(session_id=ended.pk, code=1000)

    assert open_statements.live_session_count(api_key.pk, seen_since=now - timedelta(seconds=50)) == 2
    assert open_statements.live_session_count(api_key.pk, seen_since=now + timedelta(seconds=1)) == 0


def test_a_session_closes_once_and_keeps_its_first_close(api_key):
    session, _ = store.current().session_open(raw_key=api_key.raw, info=handshake())

    store.current().session_close(session_id=session.pk, code=1000, reason="client disconnected")
    first = Session.objects.get(pk=session.pk)
    store.current().session_close(session_id=session.pk, code=1011, reason="later")

    again = Session.objects.get(pk=session.pk)
    assert (again.close_code, again.close_reason, again.ended_at) == (
        1000, "client disconnected", first.ended_at)
    assert again.state == Session.State.ENDED and again.last_seen_at == first.ended_at


def test_an_open_on_postgresql_reads_the_key_then_admits_in_one_query(tenant):
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL only (the second test pass)")
    key, raw = tenancy.key_create(tenant=tenant, allowed_origins=[ORIGIN], max_sessions=1)
    ApiKey.objects.filter(pk=key.pk).update(last_used_at=timezone.now())
    with queries_sent() as sent:
        session, refusal = store.current().session_open(raw_key=raw, info=handshake())
        second, second_refusal = store.current().session_open(raw_key=raw, info=handshake())
    assert refusal is None and Session.objects.filter(pk=session.pk, ended_at=None).exists()
    assert second is None and second_refusal.code == "session_limit"
    # The tenant's day is counted apart (written behind; at once in the tests);
    # the refused open also counts the key's sessions again without gone processes.
    first_open = [sql for sql in sent if "aitp_dailyusage" not in sql][:2]
    assert "FOR NO KEY UPDATE" not in first_open[0]
    assert "INSERT" in first_open[1] and "FOR NO KEY UPDATE" in first_open[1]
    assert "COUNT(*)" in first_open[1]  # the counts go with them; the rule decides after
    assert Session.objects.filter(api_key=key).count() == 1
