"""Fixtures for the live pages: two shops, their sessions, and the people watching.

Personas: Olivia operates Acme (staff, member of acme), Mallory operates
Globex (staff, member of globex only), Root is a superuser, Carl is a
customer account without staff status.
"""
from __future__ import annotations

import itertools
import json

import pytest

ORIGIN = "https://shop.example"
_ids = itertools.count(1)


def make_user(username: str, *, tenant=None, staff=True, superuser=False):
    from django.contrib.auth import get_user_model

    from aitp.models import TenantMembership

    # No password: tests sign in with force_login, and hashing one is slow.
    user = get_user_model().objects.create_user(
        username=username, password=None, is_staff=staff, is_superuser=superuser
    )
    if tenant is not None:
        TenantMembership.objects.create(tenant=tenant, user=user)
    return user


def make_session(tenant, session_id: str | None = None, **fields):
    from aitp import services
    from aitp.models import Session

    key, _raw = services.api_key_create(tenant=tenant, name="web")
    return Session.objects.create(
        id=session_id or f"ses_op{next(_ids):06d}", tenant=tenant, api_key=key, **fields
    )


def make_call(session, name="refund", args=None, risk="high", origin="server", **fields):
    from aitp.models import ToolCall

    n = next(_ids)
    return ToolCall.objects.create(
        session=session, call_id=f"tc_op{n:08x}", tool_use_id=f"toolu_op{n}", name=name,
        arguments={"order": "A1"} if args is None else args, risk=risk, origin=origin, **fields,
    )


def operator_approval(session, *, risk="high"):
    """A pending approval of a server tool that an operator must decide."""
    from approvals import services
    from approvals.models import ServerTool

    tool = ServerTool.objects.create(
        tenant=session.tenant, name="refund", description="Refund an order", risk=risk,
        kind=ServerTool.Kind.WEBHOOK, webhook_url="http://127.0.0.1:9/refund",
        approval_policy="operator",
    )
    call = make_call(session, name="refund", args={"order": "A1"}, risk=risk)
    return services.approval_request_server(
        tool_call=call, tool=tool, args={"order": "A1"}, session_id=session.id, timeout=120.0
    )


@pytest.fixture
def acme(db):
    from aitp import services

    return services.tenant_create(slug="acme", name="Acme Store")


@pytest.fixture
def globex(db):
    from aitp import services

    return services.tenant_create(slug="globex", name="Globex")


@pytest.fixture
def acme_session(acme):
    return make_session(acme, "ses_acme", current_url="/cart", title="Your cart")


@pytest.fixture
def globex_session(globex):
    return make_session(globex, "ses_globex", current_url="/orders", title="Orders")


@pytest.fixture
def olivia(acme):
    return make_user("olivia", tenant=acme)


@pytest.fixture
def mallory(globex):
    return make_user("mallory", tenant=globex)


@pytest.fixture
def root(db):
    return make_user("root", superuser=True)


@pytest.fixture
def carl(acme):
    return make_user("carl", tenant=acme, staff=False)


# --- the watch socket ----------------------------------------------------------


class Watcher:
    """A browser tab on the watch socket (Channels' WebsocketCommunicator)."""

    def __init__(self, communicator):
        self.ws = communicator

    async def send(self, **message) -> None:
        await self.ws.send_to(text_data=json.dumps(message))

    async def recv(self, timeout: float = 5) -> dict:
        output = await self.ws.receive_output(timeout)
        if output["type"] == "websocket.close":
            return {"type": "__close__", "code": output.get("code")}
        return json.loads(output["text"])

    async def recv_until(self, predicate, timeout: float = 5) -> dict:
        while True:
            message = await self.recv(timeout)
            if predicate(message):
                return message

    async def close(self) -> None:
        await self.ws.disconnect()


async def session_cookie(user) -> bytes:
    """The Cookie header of a browser signed in as ``user``."""
    from asgiref.sync import sync_to_async
    from django.conf import settings
    from django.test import Client

    client = Client()
    await sync_to_async(client.force_login)(user)
    value = client.cookies[settings.SESSION_COOKIE_NAME].value
    return f"{settings.SESSION_COOKIE_NAME}={value}".encode()


@pytest.fixture
def watch():
    """``watcher = await watch(user)``: a connected watch socket (user None: anonymous)."""

    async def _watch(user=None, *, origin: str | None = None, host: str = "testserver") -> Watcher:
        from channels.testing import WebsocketCommunicator

        from owllayer_site.asgi import application

        headers = [(b"host", host.encode())]
        if origin is not None:
            headers.append((b"origin", origin.encode()))
        if user is not None:
            headers.append((b"cookie", await session_cookie(user)))
        communicator = WebsocketCommunicator(application, "/ws/operators/", headers=headers)
        connected, _ = await communicator.connect()
        assert connected
        return Watcher(communicator)

    return _watch
