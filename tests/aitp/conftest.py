"""Fixtures for the protocol app: a tenant, its keys, and a connected page."""
from __future__ import annotations

import json
import uuid
from contextlib import contextmanager

import pytest

from aitp import store

ORIGIN = "https://shop.example"

# How long a real consumer may take to accept, or to tear down after the page
# leaves (rows written, turn ended), on a loaded machine with PostgreSQL.
# Both return as soon as the consumer is done; the bound only stops a hang.
CONSUMER_PATIENCE = 30

# The page tool most tests declare.
ADD_TO_CART = {
    "name": "add_to_cart",
    "description": "Add the product to the cart",
    "parameters": {
        "type": "OBJECT",
        "properties": {"quantity": {"type": "NUMBER", "description": "How many"}},
        "required": ["quantity"],
    },
    "risk": "low",
}


@pytest.fixture
def tenant(db):
    from aitp import tenancy

    return tenancy.tenant_create(slug="acme", name="Acme Store")


@pytest.fixture
def api_key(tenant):
    """A key for the shop's origin; ``api_key.raw`` is the plaintext."""
    from aitp import tenancy

    key, raw = tenancy.key_create(tenant=tenant, name="web", allowed_origins=[ORIGIN])
    key.raw = raw
    return key


def application():
    from owllayer_site.asgi import application as app

    return app


class Page:
    """A page talking to the consumer through Channels' WebsocketCommunicator."""

    def __init__(self, communicator):
        self.ws = communicator
        # The ``meta.seq`` of the last numbered frame received (a page that offered ``resume``).
        self.last_seq: int | None = None

    async def send(self, type_: str, payload: dict, **envelope) -> dict:
        """Send a frame; returns it, as the page sent it."""
        frame = {"id": f"msg_{uuid.uuid4()}", "type": type_, "timestamp": 1, "payload": payload, **envelope}
        await self.ws.send_to(text_data=json.dumps(frame))
        return frame

    async def recv(self, timeout: float = 5) -> dict:
        output = await self.ws.receive_output(timeout)
        if output["type"] == "websocket.close":
            return {"type": "__close__", "code": output.get("code"), "reason": output.get("reason")}
        text = output["text"]
        from tests.wire import assert_client_accepts

        assert_client_accepts(text)
        frame = json.loads(text)
        seq = (frame.get("meta") or {}).get("seq")
        if seq is not None:
            self.last_seq = seq
        return frame

    async def recv_until(self, type_: str, timeout: float = 5, **payload_match) -> dict:
        while True:
            frame = await self.recv(timeout)
            if frame["type"] == type_ and all(
                frame.get("payload", {}).get(k) == v for k, v in payload_match.items()
            ):
                return frame

    async def handshake(self, key: str | None, **overrides) -> dict:
        payload = {
            "apiKey": key,
            "userAgent": "pytest",
            "viewport": "1440x900",
            "sdkVersion": "0.4.0",
            "protocolVersion": "1.0.0",
            **overrides,
        }
        await self.send("HANDSHAKE_INIT", {k: v for k, v in payload.items() if v is not None})
        # A process's first HANDSHAKE_ACK waits for its speech check.
        return await self.recv(CONSUMER_PATIENCE)

    async def context(self, url="/", title="Home", tools=(), context=None) -> dict:
        await self.send(
            "CONTEXT_UPDATE",
            {"url": url, "title": title, "activeTools": list(tools), "context": context or {}},
        )
        return await self.recv()

    async def close(self) -> None:
        await self.ws.disconnect(timeout=CONSUMER_PATIENCE)


@pytest.fixture
def connect():
    """``page = await connect(query="apiKey=...", origin=...)``; all closed at the end."""
    pages: list[Page] = []

    async def _connect(query: str = "", origin: str | None = ORIGIN) -> Page:
        from channels.testing import WebsocketCommunicator

        headers = [(b"origin", origin.encode())] if origin else []
        path = "/owllayer" + (f"?{query}" if query else "")
        communicator = WebsocketCommunicator(application(), path, headers=headers)
        connected, _ = await communicator.connect(timeout=CONSUMER_PATIENCE)
        assert connected
        page = Page(communicator)
        pages.append(page)
        return page

    # Communicators are closed by each test (they need the running loop).
    return _connect


async def open_page(connect, api_key, tools=(), url="/", context=None) -> Page:
    page = await connect()
    ack = await page.handshake(api_key.raw)
    assert ack["type"] == "HANDSHAKE_ACK", ack
    effective = await page.context(url=url, tools=tools, context=context)
    assert effective["payload"]["kind"] == "tools_effective", effective
    return page


def in_db(fn):
    from channels.db import database_sync_to_async

    return database_sync_to_async(fn)


def open_session_row():
    """A new tenant and key, and a session opened with it (call from a
    database thread or a sync test)."""
    import secrets

    from aitp import tenancy

    tenant = tenancy.tenant_create(slug=f"t{secrets.token_hex(4)}")
    _, raw = tenancy.key_create(tenant=tenant, allowed_origins=[ORIGIN])
    session, refusal = store.current().session_open(raw_key=raw, info=store.HandshakeInfo(
        session_id=f"ses_{secrets.token_hex(6)}", origin=ORIGIN, user_agent="pytest",
        viewport="1x1", sdk_version="0.4.0", protocol_version="1.0.0", channel_name="test.x",
    ))
    assert refusal is None
    return session


@contextmanager
def queries_sent():
    """The queries this thread's connection sends to the database, as a list."""
    from django.db import connection

    sent: list[str] = []

    def wrapper(execute, sql, params, many, context):
        sent.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(wrapper):
        yield sent
