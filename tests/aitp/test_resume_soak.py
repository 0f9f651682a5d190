"""A thousand drops on one conversation: the page's socket drops (1001 as a
reload, 1006 as a lost network) after a random number of frames -- mid-answer,
just after a TOOL_CALL it ran but did not answer yet, between turns -- and
the frames still on their way are lost with it. Each time the page comes
back with its token and the number of the last frame it handled.

What the page handled, compared with what the model produced: every frame
exactly once and in order (the numbers run 1, 2, 3... across every socket),
each turn's text as the model wrote it, every TOOL_CALL run once, every
tool_use of the conversation with exactly one tool_result, every call of
the ledger final, and one session throughout."""
from __future__ import annotations

import random
from collections import Counter

import pytest

from agent.conversation import Conversation
from aitp.models import ConversationMessage, Session, ToolCall, TurnRecord
from tests.aitp.conftest import ADD_TO_CART, ORIGIN

pytestmark = [pytest.mark.django_db(transaction=True)]

DROPS = 1000
PATIENCE = 15
ASKS = ('/tool add_to_cart {"quantity": 1}', "What is in my cart?")


class Visitor:
    """The page's side: what it handled, and what it ran."""

    def __init__(self, chance: random.Random) -> None:
        self.chance = chance
        self.offer: dict = {}
        self.session_id: str | None = None
        self.handled: list[dict] = []
        self.runs: Counter[str] = Counter()
        self.sockets = 0
        self.turn_running = False
        self.turns_asked = 0

    async def comes_back(self, connect, raw_key: str):
        page = await connect(origin=ORIGIN)
        answer = await page.handshake(raw_key, resume=self.offer)
        assert answer["type"] == "HANDSHAKE_ACK", answer
        ack = answer["payload"]
        if self.session_id is not None:
            assert ack["sessionId"] == self.session_id and ack["resumed"] is True, answer
            assert answer["meta"]["seq"] == self.handled[-1]["meta"]["seq"], answer
        self.session_id, self.token = ack["sessionId"], ack["resumeToken"]
        self.sockets += 1
        await page.send("CONTEXT_UPDATE", {"url": "/products/headphones", "title": "Pro Headphones",
                                           "activeTools": [ADD_TO_CART], "context": {}})
        return page

    async def handles(self, page, frames: int) -> bool:
        """Up to ``frames`` frames; False when the page drops right after running a call."""
        for _ in range(frames):
            if not self.turn_running:
                await page.send("USER_INPUT", {"modality": "text",
                                               "content": ASKS[self.turns_asked % len(ASKS)]})
                self.turns_asked += 1
                self.turn_running = True
            frame = await page.recv(PATIENCE)
            assert frame["type"] != "__close__", frame
            self.handled.append(frame)
            if frame["type"] == "TOOL_CALL":
                call_id = frame["payload"]["callId"]
                self.runs[call_id] += 1
                if self.chance.random() < 0.25:
                    return False  # ran it; the network dropped before the answer left
                await page.send("TOOL_RESULT", {"callId": call_id, "status": "success", "result": {"cart": 1}})
            elif frame["type"] == "AGENT_RESPONSE" and frame["payload"]["done"]:
                self.turn_running = False
        return True

    async def drops(self, page) -> None:
        await page.ws.disconnect(code=self.chance.choice((1001, 1006)), timeout=PATIENCE)
        self.offer = {"token": self.token, "lastSeq": page.last_seq}


@pytest.fixture(autouse=True)
def as_fast_as_the_machine_goes(settings):
    """A visitor here is many times faster than a person: the rate limits
    (tested on their own) would stop it long before its thousandth drop."""
    settings.OWLLAYER_FRAMES_PER_SECOND = 100_000
    settings.OWLLAYER_USER_INPUTS_PER_MINUTE = 100_000
    settings.OWLLAYER_SESSION_OPENS_PER_KEY_PER_MINUTE = 100_000


def turns_shown(frames: list[dict]) -> list[str]:
    """Each turn's text as the page showed it: its deltas, up to its done frame."""
    turns, text = [], ""
    for frame in frames:
        if frame["type"] != "AGENT_RESPONSE":
            continue
        if frame["payload"]["done"]:
            turns.append(text)
            text = ""
        else:
            text += frame["payload"]["chunk"]
    return turns


def turns_written(messages: list[dict]) -> list[str]:
    by_turn: dict[int, str] = {}
    for message in messages:
        if message["role"] == "assistant":
            text = "".join(b["text"] for b in message["content"] if b["type"] == "text")
            by_turn[message["turn"]] = by_turn.get(message["turn"], "") + text
    return [by_turn.get(n, "") for n in range(1, max(by_turn, default=0) + 1)]


async def test_a_thousand_drops_mid_stream_deliver_every_frame_once_in_order_and_run_every_call_once(
        connect, api_key):
    visitor = Visitor(random.Random(28))
    for _ in range(DROPS):
        page = await visitor.comes_back(connect, api_key.raw)
        await visitor.handles(page, visitor.chance.randint(0, 8))
        await visitor.drops(page)
    # The last socket reads the running turn to its end.
    page = await visitor.comes_back(connect, api_key.raw)
    while visitor.turn_running:
        assert await visitor.handles(page, 1) or True
    await page.ws.disconnect(code=1000, timeout=PATIENCE)

    numbers = [frame["meta"]["seq"] for frame in visitor.handled]
    assert numbers == list(range(1, len(numbers) + 1))
    assert set(visitor.runs.values()) == {1}
    stored = [{"seq": m.seq, "role": m.role, "content": m.content, "turn": m.turn} async for m in
              ConversationMessage.objects.filter(session_id=visitor.session_id).order_by("seq")]
    assert turns_shown(visitor.handled) == turns_written(stored)
    assert await TurnRecord.objects.filter(session_id=visitor.session_id).acount() == visitor.turns_asked
    history = Conversation.restored(stored).history
    uses = [b["id"] for m in history if m["role"] == "assistant" for b in m["content"] if b["type"] == "tool_use"]
    results = [b["tool_use_id"] for m in history if m["role"] == "user" for b in m["content"]
               if b["type"] == "tool_result"]
    assert sorted(uses) == sorted(results) and len(set(uses)) == len(uses) == len(visitor.runs)
    calls = {c.call_id: c.status async for c in ToolCall.objects.filter(session_id=visitor.session_id)}
    assert set(calls) == set(visitor.runs) and all(s in ToolCall.FINAL_STATUSES for s in calls.values())
    row = await Session.objects.aget(id=visitor.session_id)
    assert row.resumes == visitor.sockets - 1 and len(row.sockets) == visitor.sockets
    print(f"{DROPS} drops: {len(numbers)} frames handled once and in order, {visitor.turns_asked} turns, "
          f"{len(visitor.runs)} calls run once ({Counter(calls.values())})")
