"""End to end: real daphne processes, real sockets, the project's AITP client.

Every frame the client receives is checked by its strict validator (the
deployed client's schema), so a wire mistake fails here as it would in a page.
"""
from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest
from channels.db import database_sync_to_async

from aitp import tenancy
from aitp.models import Session, ToolCall
from aitp_client import AitpClient, AitpRefused
from tests.aitp.conftest import ADD_TO_CART

pytestmark = [pytest.mark.django_db(transaction=True)]

ORIGIN = "http://page.example"
PROJECT_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def tenant_key(db):
    tenant = tenancy.tenant_create(slug="e2e", name="E2E")
    key, raw = tenancy.key_create(tenant=tenant, name="web", allowed_origins=[ORIGIN],
                                  max_sessions=2)
    return key, raw


def client(server, raw_key, origin=ORIGIN) -> AitpClient:
    return AitpClient(server.ws_url(), api_key=raw_key, origin=origin)


async def test_a_page_runs_a_tool_through_a_real_daphne_process(daphne_factory, tenant_key):
    key, raw = tenant_key
    server = daphne_factory()
    async with client(server, raw) as page:
        assert page.ack["maxActiveTools"] == 30
        await page.context_update("/product", "Headphones", [ADD_TO_CART], {"price": 149.99})
        await page.recv_until(lambda f: f["type"] == "SYSTEM_EVENT"
                              and f["payload"]["kind"] == "tools_effective")
        await page.user_input('/tool add_to_cart {"quantity": 2}')
        call = await page.recv_until(lambda f: f["type"] == "TOOL_CALL")
        assert call["payload"]["args"] == {"quantity": 2}
        await page.tool_result(call["payload"]["callId"], result={"cartTotal": 299.98})
        done = await page.recv_until(lambda f: f["type"] == "AGENT_RESPONSE" and f["payload"]["done"])
        assert "299.98" in done["payload"]["chunk"]
    row = await ToolCall.objects.aget(call_id=call["payload"]["callId"])
    assert row.status == "success" and row.result == {"cartTotal": 299.98}


async def test_a_frame_over_the_limit_gets_an_error_and_the_socket_stays_open(daphne_factory, tenant_key):
    key, raw = tenant_key
    server = daphne_factory(OWLLAYER_MAX_MESSAGE_BYTES=4096)
    async with client(server, raw) as page:
        await page.send("USER_INPUT", {"modality": "text", "content": "x" * 10_000})
        error = await page.recv_until(lambda f: f["type"] == "SYSTEM_EVENT")
        assert error["payload"]["data"]["code"] == "too_large"
        await page.context_update("/", "Home", [], {})
        effective = await page.recv_until(lambda f: f["type"] == "SYSTEM_EVENT")
        assert effective["payload"]["kind"] == "tools_effective"


async def test_a_wrong_origin_is_refused_with_an_error_frame_and_1008(daphne_factory, tenant_key):
    key, raw = tenant_key
    server = daphne_factory()
    page = client(server, raw, origin="http://evil.example")
    with pytest.raises(AitpRefused) as refused:
        await page.connect()
    assert refused.value.code == "origin_not_allowed"
    assert refused.value.close_code == 1008
    assert refused.value.close_reason == "origin not allowed"


@pytest.mark.redis
async def test_two_processes_share_the_session_cap_and_a_revocation(daphne_factory, tenant_key):
    key, raw = tenant_key
    worker_a, worker_b = daphne_factory(), daphne_factory()
    on_a, on_b = client(worker_a, raw), client(worker_b, raw)
    await on_a.connect()
    await on_b.connect()
    # The cap (2) counts the sessions of both processes.
    third = client(worker_a, raw)
    with pytest.raises(AitpRefused) as refused:
        await third.connect()
    assert refused.value.code == "session_limit"
    # Revoke from a third process (the management command); both close.
    env = {**os.environ, "DATABASE_URL": daphne_factory.base_env["DATABASE_URL"]}
    done = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "manage.py", "revokeapikey", key.prefix],
        cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 0, done.stderr
    for page in (on_a, on_b):
        error = await page.recv_until(lambda f: f["type"] == "SYSTEM_EVENT", timeout=5)
        assert error["payload"]["data"]["code"] == "api_key_revoked"
        code, _ = await page.wait_closed()
        assert code == 1008
    live = await database_sync_to_async(
        lambda: Session.objects.filter(api_key=key, ended_at__isnull=True).count()
    )()
    assert live == 0
