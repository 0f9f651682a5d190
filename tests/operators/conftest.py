"""Fixtures for the live pages: two shops, their sessions, and the people watching.

Personas (tests.support.people): Olivia operates Acme (staff, owner of acme),
Mallory operates Globex (staff, owner of globex only), Root is a superuser;
Carl, only here, is a customer account of Acme without staff status.
"""
from __future__ import annotations

import json

import pytest

from aitp import notify

# Also helpers for the tests, which import them from here.
from tests.support.people import acme, globex, make_session, make_tool_call, make_user, mallory, olivia, root  # noqa: F401 (fixtures)

ORIGIN = "https://shop.example"
# How long a real consumer may take to accept or to tear down on a loaded
# machine; both return as soon as it is done.
CONSUMER_PATIENCE = 30


def make_call(session, name="refund", args=None, risk="high", origin="server", **fields):
    """A server tool's call: a refund, unless told otherwise."""
    return make_tool_call(
        session, name=name, arguments={"order": "A1"} if args is None else args, risk=risk,
        origin=origin, **fields,
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
def acme_session(acme):
    return make_session(acme, "ses_acme", current_url="/cart", title="Your cart")


@pytest.fixture
def globex_session(globex):
    return make_session(globex, "ses_globex", current_url="/orders", title="Orders")


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
        await self.ws.disconnect(timeout=CONSUMER_PATIENCE)


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
        connected, _ = await communicator.connect(timeout=CONSUMER_PATIENCE)
        assert connected
        return Watcher(communicator)

    return _watch


@pytest.fixture
def sent(monkeypatch) -> list[tuple]:
    """Session commands handed to the channel layer: (session_id, command, fields)."""
    calls: list[tuple] = []
    monkeypatch.setattr(notify, "session_command",
                        lambda session_id, command, **fields: calls.append((session_id, command, fields)))
    return calls
