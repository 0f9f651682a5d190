"""Scale-out: two daphne processes sharing PostgreSQL/SQLite and Redis.

A page talks to worker A; an operator signed in on worker B sees it live,
decides its approval and ends it. Nothing but the database and the channel
layer connects the two processes.
"""
from __future__ import annotations

import asyncio
import json

import httpx
import pytest
import websockets
from django.contrib.auth import get_user_model

from aitp import tenancy
from aitp_client import AitpClient
from approvals.models import Approval
from demo.models import DemoOrder
from demo.order_tools import demo_tools_install
from tenants.models import TenantMembership
from tests.support.people import admin_sign_in

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.redis]

PAGE_ORIGIN = "http://shop.example"


@pytest.fixture
def shop(db):
    tenant = tenancy.tenant_create(slug="shop", name="Shop")
    demo_tools_install(tenant=tenant, policy="operator")
    _, raw = tenancy.key_create(tenant=tenant, name="web", allowed_origins=[PAGE_ORIGIN])
    operator = get_user_model().objects.create_user("olga", password="pw-olga-123", is_staff=True)
    TenantMembership.objects.create(tenant=tenant, user=operator, role="owner")
    return tenant, raw


async def sign_in(http: httpx.AsyncClient) -> None:
    await admin_sign_in(http, "olga", "pw-olga-123")


async def post_form(http: httpx.AsyncClient, path: str, data: dict) -> httpx.Response:
    """A form POST as the admin page sends it (the CSRF cookie's token)."""
    token = http.cookies["csrftoken"]
    return await http.post(path, data={**data, "csrfmiddlewaretoken": token})


async def next_message(watch, predicate, timeout=10.0) -> dict:
    while True:
        message = json.loads(await asyncio.wait_for(watch.recv(), timeout))
        if predicate(message):
            return message


async def test_an_operator_on_another_worker_watches_decides_and_ends_a_session(daphne_factory, shop):
    tenant, raw = shop
    worker_a, worker_b = daphne_factory(), daphne_factory()
    async with httpx.AsyncClient(base_url=worker_b.http_url) as http:
        await sign_in(http)
        cookie = "; ".join(f"{name}={value}" for name, value in http.cookies.items())
        async with websockets.connect(
            f"ws://127.0.0.1:{worker_b.port}/ws/operators/",
            additional_headers={"Cookie": cookie}, proxy=None,
        ) as watch:
            async with AitpClient(worker_a.ws_url(), api_key=raw, origin=PAGE_ORIGIN) as page:
                # The operator's list shows the session opened on the other worker.
                row = await next_message(
                    watch, lambda m: m["type"] == "session" and m["session"]["id"] == page.session_id)
                assert row["session"]["live"]
                await watch.send(json.dumps({"type": "subscribe", "session_id": page.session_id}))
                await next_message(watch, lambda m: m["type"] == "subscribed")

                await page.context_update("/orders", "Orders", [], {})
                await page.user_input('/tool cancel_order {"number": "A1003"}')
                waiting = await page.recv_until(
                    lambda f: f["type"] == "SYSTEM_EVENT" and f["payload"]["kind"] == "waiting")
                assert "operator" in waiting["payload"]["message"]
                # The operator sees the page's frames as they pass.
                frame = await next_message(
                    watch, lambda m: m["type"] == "frame" and '"USER_INPUT"' in m["text"])
                assert "cancel_order" in frame["text"]

                approval = await Approval.objects.aget(tool_call__name="cancel_order")
                answer = await post_form(
                    http, f"/admin/live/{page.session_id}/approvals/{approval.id}/decide/",
                    {"decision": "approve", "note": "customer asked"},
                )
                assert answer.status_code == 302
                done = await page.recv_until(
                    lambda f: f["type"] == "AGENT_RESPONSE" and f["payload"]["done"], timeout=10)
                assert "cancel_order" in done["payload"]["chunk"]
                order = await DemoOrder.objects.aget(tenant=tenant, number="A1003")
                assert order.status == "cancelled"

                answer = await post_form(
                    http, f"/admin/live/{page.session_id}/command/",
                    {"command": "end", "message": "Closing this chat."},
                )
                assert answer.status_code == 302
                notice = await page.recv_until(
                    lambda f: f["type"] == "SYSTEM_EVENT" and f["payload"]["kind"] == "disconnect")
                assert notice["payload"]["message"] == "Closing this chat."
                code, reason = await page.wait_closed()
                assert code == 1008
            ended = await next_message(
                watch, lambda m: m["type"] == "session" and not m["session"]["live"])
            assert ended["session"]["close_code"] == 1008
