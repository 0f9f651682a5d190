"""Tidying up after a server process that died."""
from __future__ import annotations

import io
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.utils import timezone

from aitp import tenancy
from aitp.models import Session
from tests.support.people import make_session

pytestmark = pytest.mark.django_db


@pytest.fixture
def acme_tenant():
    return tenancy.tenant_create(slug="acme", name="Acme")


def test_sweep_closes_sessions_whose_process_stopped_refreshing_them(acme_tenant, settings):
    settings.OWLLAYER_HEARTBEAT_INTERVAL = 10
    lost = make_session(acme_tenant)
    alive = make_session(acme_tenant)
    Session.objects.filter(pk=lost.pk).update(last_seen_at=timezone.now() - timedelta(seconds=31))
    out = io.StringIO()
    call_command("sweep", stdout=out)
    lost.refresh_from_db()
    alive.refresh_from_db()
    assert lost.ended_at is not None and lost.close_code == 1006 and lost.state == "ended"
    assert alive.ended_at is None
    assert "closed 1 stale sessions" in out.getvalue()
