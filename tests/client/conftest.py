"""A scripted AITP peer on 127.0.0.1 for testing the client without Django."""
from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import pytest
from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import ConnectionClosed

from aitp_client import envelope

ACK = {
    "sessionId": "ses_test0001",
    "serverVersion": "0.4.0",
    "protocolVersion": "1.0.0",
    "capabilities": ["text", "tools"],
    "maxActiveTools": 30,
}


@dataclass
class Peer:
    """The server end of one connection, as a test script sees it."""

    ws: ServerConnection
    received: list[dict] = field(default_factory=list)

    @property
    def path(self) -> str:
        return self.ws.request.path

    @property
    def headers(self):
        return self.ws.request.headers

    async def send(self, frame_type: str, payload: dict) -> None:
        await self.ws.send(json.dumps(envelope(frame_type, payload)))

    async def recv(self) -> dict:
        frame = json.loads(await self.ws.recv())
        self.received.append(frame)
        return frame

    async def accept_handshake(self, ack: dict | None = None) -> dict:
        init = await self.recv()
        assert init["type"] == "HANDSHAKE_INIT"
        await self.send("HANDSHAKE_ACK", ack or ACK)
        return init


Script = Callable[[Peer], Awaitable[None]]


@dataclass
class FakeServer:
    url: str
    peers: list[Peer]


@pytest.fixture
async def fake_server() -> AsyncIterator[Callable[..., Awaitable[FakeServer]]]:
    """``server = await fake_server(script)`` runs ``script(peer)`` for each connection."""
    servers = []
    failures: list[BaseException] = []

    async def start(script: Script, **serve_options) -> FakeServer:
        peers: list[Peer] = []

        async def handler(ws: ServerConnection) -> None:
            peer = Peer(ws)
            peers.append(peer)
            try:
                await script(peer)
            except ConnectionClosed:
                pass  # the client left first: the test's own asserts judge that
            except Exception as exc:
                # websockets would only log it; the test must fail instead.
                failures.append(exc)
                raise

        server = await serve(handler, "127.0.0.1", 0, **serve_options)
        servers.append(server)
        port = server.sockets[0].getsockname()[1]
        return FakeServer(f"ws://127.0.0.1:{port}/owllayer", peers)

    yield start
    for server in servers:
        server.close()
        await server.wait_closed()
    if failures:
        raise AssertionError(f"the scripted server failed: {failures[0]!r}") from failures[0]
