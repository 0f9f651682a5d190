"""Wiring: revoking a key in the console closes a page connected with it.

The page talks to the real ASGI application through Channels'
WebsocketCommunicator; the console request runs in another thread, so rows
must be committed (transaction=True).
"""
from __future__ import annotations

import pytest
from asgiref.sync import sync_to_async
from django.test import AsyncClient
from django.urls import reverse

from aitp import tenancy
from aitp.models import ApiKey, Session
from tenants.models import TenantMembership
from tests.aitp.conftest import ORIGIN, connect, open_page  # noqa: F401 (connect is a fixture)
from tests.support.pages import patient

pytestmark = [pytest.mark.django_db(transaction=True)]


def _setup(django_user_model):
    tenant = tenancy.tenant_create(slug="acme", name="Acme Store")
    key, raw = tenancy.key_create(tenant=tenant, name="web", allowed_origins=[ORIGIN])
    key.raw = raw
    owner = django_user_model.objects.create_user(username="olivia", password="x")
    TenantMembership.objects.create(tenant=tenant, user=owner, role=TenantMembership.Role.OWNER)
    return key, owner


async def test_revoking_a_key_in_the_console_closes_its_live_page(connect, django_user_model):
    key, owner = await sync_to_async(_setup)(django_user_model)
    page = await open_page(patient(connect), key)
    client = AsyncClient()
    await client.aforce_login(owner)

    response = await client.post(reverse("console:key_revoke", args=["acme", key.pk]))

    assert response.status_code == 302
    error = await page.recv()
    assert error["payload"]["data"]["code"] == "api_key_revoked"
    assert (await page.recv())["code"] == 1008
    assert (await ApiKey.objects.aget(pk=key.pk)).status == ApiKey.Status.REVOKED
    await page.close()  # returns once the consumer has finished its teardown
    assert await Session.objects.filter(api_key_id=key.pk, ended_at__isnull=True).acount() == 0
