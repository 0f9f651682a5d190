"""Disabling a key, moving its expiry into the past and revoking it close its
live pages at once, from every place a key is changed: the console, the
admin's key form, the admin's bulk actions and the command line.

Each page is a real AITP client on a real daphne process. The change is made
over HTTP on that process (embedded pass) or on a second process (Redis
pass: the notice crosses processes). The processes re-check their keys only
every 600 s here, so only the change's own notice can close the page in time.
"""
from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys

import httpx
import pytest
from asgiref.sync import sync_to_async
from django.contrib.auth import get_user_model

from aitp import tenancy
from aitp.models import ApiKey, Session
from aitp_client import AitpClient
from tenants.models import TenantMembership
from tests.console.test_admin_writes import grant_admin_rights
from tests.support.daphne import PROJECT_ROOT
from tests.support.people import admin_sign_in

pytestmark = [pytest.mark.django_db(transaction=True)]

PAGE_ORIGIN = "http://shop.example"
PASSWORD = "pw-long-enough-123"
NO_RECHECK = 600
# Upper bound for a frame the server sends "now".
SOON = 15.0
CODES = {"disable": "api_key_disabled", "expiry": "api_key_expired", "revoke": "api_key_revoked",
         "origins": "origin_not_allowed"}


@pytest.fixture
def shop(db):
    tenant = tenancy.tenant_create(slug="acme", name="Acme Store")
    key, raw = tenancy.key_create(tenant=tenant, name="web", allowed_origins=[PAGE_ORIGIN])
    olga = get_user_model().objects.create_user("olga", password=PASSWORD, is_staff=True)
    TenantMembership.objects.create(tenant=tenant, user=olga, role="owner")
    grant_admin_rights(olga)
    return key, raw


@pytest.fixture
def servers(daphne_factory):
    """The process holding the page, and the one where the change is made."""
    holding = daphne_factory(OWLLAYER_HEARTBEAT_INTERVAL=NO_RECHECK)
    changing = daphne_factory(OWLLAYER_HEARTBEAT_INTERVAL=NO_RECHECK) if os.environ.get("REDIS_URL") else holding
    return holding, changing


async def console_sign_in(http: httpx.AsyncClient) -> None:
    form = await http.get("/console/login/")
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form.text).group(1)
    answer = await http.post("/console/login/", data={
        "username": "olga", "password": PASSWORD, "csrfmiddlewaretoken": token, "next": "/console/"})
    assert answer.status_code == 302, answer.text[:500]


async def post_form(http: httpx.AsyncClient, path: str, data: dict) -> None:
    answer = await http.post(path, data={**data, "csrfmiddlewaretoken": http.cookies["csrftoken"]})
    assert answer.status_code == 302, answer.text[:1500]


def key_form(key: ApiKey, **changes) -> dict:
    fields = {"name": key.name, "status": key.status, "allowed_origins": json.dumps(key.allowed_origins),
              "max_sessions": key.max_sessions, "expires_at_0": "", "expires_at_1": ""}
    return {**fields, **changes}


# --- the places a key is changed --------------------------------------------------------


async def in_the_console(server, key: ApiKey, change: str) -> None:
    assert change == "revoke"  # the console's only change of this kind
    async with httpx.AsyncClient(base_url=server.http_url) as http:
        await console_sign_in(http)
        await post_form(http, f"/console/t/acme/keys/{key.pk}/revoke/", {})


async def in_the_admin_form(server, key: ApiKey, change: str) -> None:
    form = {
        "disable": key_form(key, status="disabled"),
        "revoke": key_form(key, status="revoked"),
        "expiry": key_form(key, expires_at_0="2020-01-01", expires_at_1="00:00:00"),
        "origins": key_form(key, allowed_origins=json.dumps(["http://other-shop.example"])),
    }[change]
    async with httpx.AsyncClient(base_url=server.http_url) as http:
        await admin_sign_in(http, "olga", PASSWORD)
        await post_form(http, f"/admin/aitp/apikey/{key.pk}/change/", form)


async def by_an_admin_bulk_action(server, key: ApiKey, change: str) -> None:
    action = {"disable": "disable_keys", "revoke": "revoke_keys"}[change]
    async with httpx.AsyncClient(base_url=server.http_url) as http:
        await admin_sign_in(http, "olga", PASSWORD)
        await post_form(http, "/admin/aitp/apikey/", {
            "action": action, "_selected_action": [key.pk], "index": 0})


async def on_the_command_line(key: ApiKey, database_url: str) -> None:
    env = {**os.environ, "DATABASE_URL": database_url}
    done = await asyncio.to_thread(
        subprocess.run, [sys.executable, "manage.py", "revokeapikey", key.prefix],
        cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stderr


async def assert_closed_at_once(page: AitpClient, key: ApiKey, code: str, *, within: float = SOON) -> None:
    error = await page.recv_until(lambda f: f["type"] == "SYSTEM_EVENT", timeout=within)
    assert error["payload"]["kind"] == "error" and error["payload"]["data"]["code"] == code
    close_code, _reason = await page.wait_closed(timeout=within)
    assert close_code == 1008


async def live_rows(key: ApiKey) -> int:
    return await sync_to_async(
        lambda: Session.objects.filter(api_key=key, ended_at__isnull=True).count())()


@pytest.mark.parametrize("where, change", [
    (in_the_console, "revoke"),
    (in_the_admin_form, "disable"),
    (in_the_admin_form, "expiry"),
    (in_the_admin_form, "origins"),
    (in_the_admin_form, "revoke"),
    (by_an_admin_bulk_action, "disable"),
    (by_an_admin_bulk_action, "revoke"),
], ids=["console-revoke", "admin-form-disable", "admin-form-expiry", "admin-form-origins", "admin-form-revoke",
        "admin-action-disable", "admin-action-revoke"])
async def test_a_key_that_can_no_longer_be_used_closes_its_live_page_at_once(
    servers, shop, where, change
):
    key, raw = shop
    holding, changing = servers
    page = AitpClient(holding.ws_url(), api_key=raw, origin=PAGE_ORIGIN)
    await page.connect()

    await where(changing, key, change)

    await assert_closed_at_once(page, key, CODES[change])
    refreshed = await ApiKey.objects.aget(pk=key.pk)
    assert refreshed.status == {"disable": "disabled", "revoke": "revoked"}.get(change, "active")
    await asyncio.wait_for(_until_no_live_rows(key), SOON)


async def _until_no_live_rows(key: ApiKey) -> None:
    while await live_rows(key):
        await asyncio.sleep(0.05)


@pytest.mark.redis
async def test_a_key_revoked_on_the_command_line_closes_its_live_page_at_once(daphne_factory, shop):
    key, raw = shop
    server = daphne_factory(OWLLAYER_HEARTBEAT_INTERVAL=NO_RECHECK)
    page = AitpClient(server.ws_url(), api_key=raw, origin=PAGE_ORIGIN)
    await page.connect()

    await on_the_command_line(key, daphne_factory.base_env["DATABASE_URL"])

    await assert_closed_at_once(page, key, "api_key_revoked")


async def test_without_redis_a_key_revoked_on_the_command_line_closes_its_page_at_the_next_heartbeat(
    daphne_factory, shop, monkeypatch
):
    """Without a shared channel layer the command's notice reaches no server:
    the page's own re-check at its next heartbeat closes it."""
    key, raw = shop
    heartbeat = 1.0
    server = daphne_factory(OWLLAYER_HEARTBEAT_INTERVAL=heartbeat, REDIS_URL=None)
    page = AitpClient(server.ws_url(), api_key=raw, origin=PAGE_ORIGIN)
    await page.connect()
    monkeypatch.delenv("REDIS_URL", raising=False)

    await on_the_command_line(key, daphne_factory.base_env["DATABASE_URL"])

    await assert_closed_at_once(page, key, "api_key_revoked", within=SOON + heartbeat)
