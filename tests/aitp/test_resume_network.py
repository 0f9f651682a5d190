"""Drops on a real network: a page talks to a daphne process through a TCP
relay that cuts both ends of the connection at random points (RST on each
side, the bytes still in flight lost), as a phone losing its network or a
load balancer dropping a connection would. The page comes back with its
token and the last frame it handled each time.

Every frame the server numbered reaches the page once and in order, every
TOOL_CALL is run once, every call ends, every question gets one turn (a
USER_INPUT lost in flight is sent again, as it was, when the HANDSHAKE_ACK
names an older one as the last the session took), and the conversation is
one session."""
from __future__ import annotations

import asyncio
import contextlib
import json
import random
from collections import Counter

import pytest

from aitp import tenancy
from aitp.models import Session, ToolCall, TurnRecord
from aitp_client import AitpClient
from aitp_client.frames import envelope
from tests.aitp.conftest import ADD_TO_CART

pytestmark = pytest.mark.django_db(transaction=True)

ORIGIN = "http://page.example"
CUTS = 200
PATIENCE = 30.0
ASKS = ('/tool add_to_cart {"quantity": 1}', "What is in my cart?")
FAST = {"OWLLAYER_FRAMES_PER_SECOND": "100000", "OWLLAYER_USER_INPUTS_PER_MINUTE": "100000",
        "OWLLAYER_SESSION_OPENS_PER_KEY_PER_MINUTE": "100000"}


class Relay:
    """127.0.0.1:port -> the server; ``cut()`` resets every connection it carries."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.transports: list[asyncio.Transport] = []
        self.server: asyncio.AbstractServer | None = None

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._carry, "127.0.0.1", 0)
        return self.server.sockets[0].getsockname()[1]

    async def _carry(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        self.transports += [writer.transport, up_writer.transport]

        async def pump(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
            with contextlib.suppress(Exception):
                while data := await source.read(65536):
                    sink.write(data)
                    await sink.drain()
            with contextlib.suppress(Exception):
                sink.close()

        await asyncio.gather(pump(reader, up_writer), pump(up_reader, writer))

    def cut(self) -> None:
        transports, self.transports = self.transports, []
        for transport in transports:
            transport.abort()

    async def aclose(self) -> None:
        self.cut()
        self.server.close()
        await self.server.wait_closed()


async def test_two_hundred_network_cuts_deliver_every_frame_once_in_order_and_run_every_call_once(
        daphne_factory, db):
    tenant = await asyncio.to_thread(tenancy.tenant_create, slug="cuts", name="Cuts")
    _, raw_key = await asyncio.to_thread(tenancy.key_create, tenant=tenant, name="web",
                                         allowed_origins=[ORIGIN])
    server = daphne_factory(FAST)
    relay = Relay(server.port)
    url = f"ws://127.0.0.1:{await relay.start()}/owllayer"
    chance = random.Random(31)
    offer: dict = {}
    handled: list[dict] = []
    runs: Counter[str] = Counter()
    # The USER_INPUT whose turn has not ended (None: none), and how many went again.
    state: dict = {"asked": 0, "pending": None, "sent_again": 0}

    async def handle(page: AitpClient) -> None:
        if state["pending"] is None:
            state["pending"] = await page.user_input(ASKS[state["asked"] % len(ASKS)])
            state["asked"] += 1
        frame = await page.recv(PATIENCE)
        handled.append(frame)
        if frame["type"] == "TOOL_CALL":
            runs[frame["payload"]["callId"]] += 1
            await page.tool_result(frame["payload"]["callId"], result={"cart": 1})
        elif frame["type"] == "AGENT_RESPONSE" and frame["payload"]["done"]:
            state["pending"] = None

    session_id = None
    for cut in range(CUTS + 1):
        page = AitpClient(url, api_key=raw_key, origin=ORIGIN, resume=offer)
        ack = await page.connect(timeout=PATIENCE)
        assert session_id in (None, ack["sessionId"]) and (not offer or ack["resumed"]), ack
        session_id = ack["sessionId"]
        took = next(f for f in page.history if f["type"] == "HANDSHAKE_ACK")["meta"].get("lastInput")
        if state["pending"] is not None and took != state["pending"]["id"]:
            # Lost with the network before the server read it: sent again, as it was.
            await page.send_raw(json.dumps(state["pending"]))
            state["sent_again"] += 1
        await page.send("CONTEXT_UPDATE", {"url": "/", "title": "Home", "activeTools": [ADD_TO_CART],
                                           "context": {}})
        if cut == CUTS:  # the last socket reads the running turn to its end
            while state["pending"] is not None:
                await handle(page)
            await page.close()
            break
        for _ in range(chance.randint(0, 8)):
            await handle(page)
        if chance.random() < 0.2 and state["pending"] is None:
            # A question the network loses on its way: asked, never arrived.
            state["pending"] = envelope("USER_INPUT", {"modality": "text",
                                                       "content": ASKS[state["asked"] % len(ASKS)]})
            state["asked"] += 1
        relay.cut()
        await page.wait_closed(timeout=PATIENCE)  # what it reads meanwhile is lost with the page
        offer = {"token": page.next_resume()["token"], "lastSeq": handled[-1]["meta"]["seq"] if handled else 0}
    await relay.aclose()

    numbers = [f["meta"]["seq"] for f in handled]
    assert numbers == list(range(1, len(numbers) + 1))
    assert set(runs.values()) == {1}
    calls = {c.call_id: c.status async for c in ToolCall.objects.filter(session_id=session_id)}
    assert set(calls) == set(runs) and all(s in ToolCall.FINAL_STATUSES for s in calls.values())
    row = await Session.objects.aget(id=session_id)
    assert row.resumes == CUTS
    turns = await TurnRecord.objects.filter(session_id=session_id).acount()
    assert turns == state["asked"]
    print(f"{CUTS} cuts: {len(numbers)} frames once and in order, {turns} turns for {state['asked']} "
          f"questions ({state['sent_again']} sent again), {len(runs)} calls run once "
          f"({Counter(calls.values())})")
