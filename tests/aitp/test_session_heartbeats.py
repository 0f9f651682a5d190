"""The heartbeats of a process's sessions (aitp.processes.session_heartbeat):
gathered into one database call, each session told whether it must end."""
from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest
from asgiref.sync import sync_to_async
from django.utils import timezone

from aitp import processes, tenancy
from aitp.models import Session
from tests.support.people import make_session

pytestmark = pytest.mark.django_db(transaction=True)

# A bound against a hang only.
PATIENCE = 30


@pytest.fixture
def tenant():
    return tenancy.tenant_create(slug="beat", name="Beat")


@pytest.fixture
def counted_batches(monkeypatch):
    """The real sessions_heartbeat, counting the calls made (unit test only)."""
    batches: list[list[str]] = []
    real = processes.sessions_heartbeat

    def counting(session_ids):
        batches.append(list(session_ids))
        return real(session_ids)

    monkeypatch.setattr(processes, "sessions_heartbeat", counting)
    return batches


async def test_the_heartbeats_of_many_sessions_are_one_database_call(tenant, counted_batches):
    long_ago = timezone.now() - timedelta(hours=1)
    rows = [await sync_to_async(make_session)(tenant, last_seen_at=long_ago) for _ in range(20)]
    answers = await asyncio.wait_for(
        asyncio.gather(*(processes.session_heartbeat(row.id) for row in rows)), PATIENCE)
    assert answers == [None] * 20
    assert len(counted_batches) == 1 and sorted(counted_batches[0]) == sorted(r.id for r in rows)
    seen = await sync_to_async(list)(
        Session.objects.filter(id__in=[r.id for r in rows]).values_list("last_seen_at", flat=True))
    assert all(at > long_ago for at in seen)


async def test_a_session_whose_key_was_revoked_is_told_at_its_heartbeat(tenant):
    kept = await sync_to_async(make_session)(tenant)
    revoked = await sync_to_async(make_session)(tenant)
    await sync_to_async(tenancy.key_revoke)(key=revoked.api_key)
    answers = await asyncio.wait_for(asyncio.gather(
        processes.session_heartbeat(kept.id), processes.session_heartbeat(revoked.id),
        processes.session_heartbeat("ses_unknown")), PATIENCE)
    assert answers[0] is None
    assert answers[1].code == "api_key_revoked"
    assert answers[2].code == "session_ended"


async def test_an_ended_session_is_not_marked_seen(tenant):
    ended_at = timezone.now() - timedelta(hours=1)
    row = await sync_to_async(make_session)(tenant, ended_at=ended_at, last_seen_at=ended_at)
    await asyncio.wait_for(processes.session_heartbeat(row.id), PATIENCE)
    await sync_to_async(row.refresh_from_db)()
    assert row.last_seen_at == ended_at
