"""The tool-call ledger's invariant over many seeded random turns.

Each turn the fake model emits a random mix of tool_use messages (one to three
tool_uses each; success, page error, timeout, invalid arguments, unknown tool,
duplicate answers), then ends with text, an upstream failure, a broken stream,
a tool round over the limit, or the page disconnecting at some point. After
every turn and at the end we check:

- every request the model received is well formed, and every tool_use id the
  model emitted appears exactly once as a tool_result in the session's next
  request;
- the stored conversation of every session answers every tool_use exactly once;
- every ToolCall row has its expected final status, one row per tool_use;
- no call id was sent to a page twice, and nothing is left running.
"""
from __future__ import annotations

import os
import random
import re
from collections import deque
from dataclasses import dataclass, field

import pytest

from aitp.models import Session, ToolCall
from tests.aitp.test_agent import (  # noqa: F401  (fake and llm are fixtures)
    ADD_TO_CART,
    GO_TO_CART,
    assert_failed_turn,
    assert_stored_conversation_valid,
    assert_well_formed,
    close,
    errors,
    fake,
    leftover_tasks,
    llm,
    nothing_scripted,
    open_shop,
    stored_messages,
    streamed,
)
from tests.support.fake_anthropic import broken_stream, error_response, text_response, tool_use_response

pytestmark = [pytest.mark.django_db(transaction=True)]

# LEDGER_SEED=<n> explores another sequence of turns.
SEED = int(os.environ.get("LEDGER_SEED", "20240611"))
TURNS = 40
MAX_ROUNDS = 2

# How the page (or the model) treats one tool_use, and the status it must end with.
EXPECTED_STATUS = {
    "success": "success",
    "error": "error",
    "timeout": "timeout",
    "invalid": "invalid_args",
    "unknown": "unavailable",
    "duplicate": "success",
    "disconnect": "disconnected",
}
KINDS = ["success"] * 5 + ["error"] * 2 + ["timeout", "invalid", "unknown", "duplicate"]
# Every ending once in the first turns, then at random.
EVERY_ENDING = ["text", "upstream_error", "broken", "round_limit", "disconnect_tool",
                "disconnect_stream", "disconnect_early"]
ENDINGS = ["text"] * 6 + EVERY_ENDING[1:]
TURN_TEXT = re.compile(r"^turn (\d+):")


@dataclass
class Plan:
    number: int
    ending: str
    responses: deque = field(default_factory=deque)
    rounds: list[list[str]] = field(default_factory=list)  # tool_use ids, per message
    kinds: dict[str, str] = field(default_factory=dict)

    def expected_statuses(self) -> dict[str, str]:
        """tool_use id -> final status, for every tool_use the model will have emitted."""
        expected: dict[str, str] = {}
        for index, ids in enumerate(self.rounds):
            if index == MAX_ROUNDS:
                # Past the round limit: recorded, never run.
                expected.update(dict.fromkeys(ids, "cancelled"))
                break
            gone = False
            for tool_use_id in ids:
                kind = self.kinds[tool_use_id]
                gone = gone or kind == "disconnect"
                expected[tool_use_id] = "disconnected" if gone else EXPECTED_STATUS[kind]
            if gone:
                break  # later messages are never requested
        return expected


def make_plan(rng: random.Random, number: int) -> Plan:
    ending = EVERY_ENDING[number - 1] if number <= len(EVERY_ENDING) else rng.choice(ENDINGS)
    plan = Plan(number, ending)
    if ending == "disconnect_early":
        # The page leaves while the model is still thinking.
        plan.responses.append(text_response("never seen", first_event_delay=2))
        return plan
    if ending == "round_limit":
        rounds = MAX_ROUNDS + 1
    else:
        rounds = rng.randint(1 if ending == "disconnect_tool" else 0, MAX_ROUNDS)
    for index in range(rounds):
        ids = []
        for position in range(rng.randint(1, 3)):
            tool_use_id = f"toolu_t{number}_r{index}_{position}"
            kind = rng.choice(KINDS)
            ids.append(tool_use_id)
            plan.kinds[tool_use_id] = kind
        plan.rounds.append(ids)
    if plan.ending == "disconnect_tool":
        index = rng.randrange(len(plan.rounds))
        plan.kinds[rng.choice(plan.rounds[index])] = "disconnect"
    for ids in plan.rounds:
        calls = [_call(tool_use_id, plan.kinds[tool_use_id]) for tool_use_id in ids]
        plan.responses.append(tool_use_response(calls))
    if ending == "round_limit":
        pass  # the skipped round ends the turn without another request
    elif plan.ending == "upstream_error":
        plan.responses.append(error_response(529))
    elif plan.ending == "broken":
        plan.responses.append(broken_stream(5, response=text_response("a b c d e f", chunks=6)))
    elif plan.ending == "disconnect_stream":
        plan.responses.append(text_response("slowly " * 12, chunks=12, event_delay=0.02))
    else:
        plan.responses.append(text_response(f"Answer {number}.", chunks=2))
    return plan


def _call(tool_use_id: str, kind: str) -> tuple[str, str, dict]:
    # "ref" lets the page find the plan's kind from the TOOL_CALL it receives
    # (extra properties are allowed by the schema).
    if kind == "unknown":
        return tool_use_id, "vanished_tool", {"ref": tool_use_id}
    if kind == "invalid":
        return tool_use_id, "add_to_cart", {"quantity": "many", "ref": tool_use_id}
    return tool_use_id, "add_to_cart", {"quantity": 1, "ref": tool_use_id}


def turn_of(body: dict) -> int | None:
    """The turn a request belongs to: the last "turn N:" user text in it."""
    number = None
    for message in body.get("messages", []):
        if message["role"] != "user":
            continue
        for block in message["content"]:
            match = TURN_TEXT.match(block.get("text", "")) if block["type"] == "text" else None
            if match:
                number = int(match.group(1))
    return number


class World:
    """The plans, the pages and what they saw, for one seeded run."""

    def __init__(self, fake, connect, api_key) -> None:
        self.fake = fake
        self.connect = connect
        self.api_key = api_key
        self.plans: dict[int, Plan] = {}
        self.session_of_turn: dict[int, str] = {}
        self.sent_call_ids: list[str] = []
        self.page = None
        fake.responder = self.respond

    def respond(self, body):
        plan = self.plans.get(turn_of(body))
        if plan is None or not plan.responses:
            return nothing_scripted(body)
        response = plan.responses.popleft()
        body.served = response  # which answer this request got, for the checks
        return response

    async def play(self, rng: random.Random, plan: Plan) -> None:
        if self.page is None:
            self.page = await open_shop(self.connect, self.api_key, tools=[ADD_TO_CART, GO_TO_CART])
        page = self.page
        self.plans[plan.number] = plan
        self.session_of_turn[plan.number] = page.session_id
        await page.send("USER_INPUT", {"modality": "text", "content": f"turn {plan.number}: go"})
        if plan.ending == "disconnect_early":
            return await self.leave()
        frames: list[dict] = []
        refused: set[str] = set()  # call ids whose answer must get unknown_call
        while True:
            frame = await page.recv(10)
            assert frame["type"] != "__close__", frames
            frames.append(frame)
            if frame["type"] == "TOOL_CALL":
                payload = frame["payload"]
                self.sent_call_ids.append(payload["callId"])
                kind = plan.kinds[payload["args"]["ref"]]
                if kind == "disconnect":
                    return await self.leave()
                await self.answer(page, payload["callId"], kind, refused)
                if rng.random() < 0.15:
                    bogus = f"tc_bogus_{rng.getrandbits(32)}"
                    await page.send("TOOL_RESULT", {"callId": bogus, "status": "success",
                                                    "result": None})
                    refused.add(bogus)
            elif frame["type"] == "AGENT_RESPONSE":
                if frame["payload"]["done"]:
                    break
                if plan.ending == "disconnect_stream":
                    return await self.leave()
        self.check_frames(plan, frames, refused)

    async def answer(self, page, call_id: str, kind: str, refused: set[str]) -> None:
        if kind == "timeout":
            return
        if kind == "error":
            await page.send("TOOL_RESULT", {"callId": call_id, "status": "error", "result": None,
                                            "error": "the page failed"})
            return
        await page.send("TOOL_RESULT", {"callId": call_id, "status": "success",
                                        "result": {"callId": call_id}})
        if kind == "duplicate":
            await page.send("TOOL_RESULT", {"callId": call_id, "status": "error", "result": None,
                                            "error": "second answer"})
            refused.add(call_id)

    async def leave(self) -> None:
        await close(self.page)
        self.page = None

    def check_frames(self, plan: Plan, frames: list[dict], refused: set[str]) -> None:
        codes = [e["data"]["code"] for e in errors(frames)]
        unknown = {e["data"]["callId"] for e in errors(frames) if e["data"]["code"] == "unknown_call"}
        # Every refused answer was refused, and no legitimate one was.
        assert unknown == refused, (plan, codes)
        assert "bad_request" not in codes, (plan, codes)
        if plan.ending == "upstream_error":
            assert_failed_turn(frames, "overloaded")
        elif plan.ending == "broken":
            assert_failed_turn(frames, "stream_interrupted")
        else:
            deltas, final = streamed(frames)
            assert deltas == final
            expected = "" if plan.ending == "round_limit" else f"Answer {plan.number}."
            assert final == expected, (plan, frames[-1])
            assert [c for c in codes if c not in ("unknown_call", "tool_timeout")] == []

    async def finish(self) -> None:
        if self.page is not None:
            await self.leave()


def check_requests(world: World, requests: list) -> int:
    """Every request is well formed; each emitted tool_use is answered exactly
    once in the session's next request. Returns how many ids were checked."""
    by_session: dict[str, list] = {}
    for request in requests:
        if not request and request.outcome == "client_disconnected":
            # The page left while the request was still being sent: the fake
            # API never read a body, so nothing was served or emitted.
            continue
        number = turn_of(request)
        assert number is not None, "a request without its turn's text"
        by_session.setdefault(world.session_of_turn[number], []).append(request)
    checked = 0
    for session_requests in by_session.values():
        for request, following in zip(session_requests, [*session_requests[1:], None], strict=True):
            assert_well_formed(request)
            served = getattr(request, "served", None)
            emitted = [b.id for b in getattr(served, "blocks", []) if hasattr(b, "input")]
            if not emitted or following is None:
                continue
            answered = [b["tool_use_id"] for m in following["messages"] for b in m["content"]
                        if b["type"] == "tool_result"]
            for tool_use_id in emitted:
                assert answered.count(tool_use_id) == 1, (tool_use_id, following["messages"])
                checked += 1
    return checked


async def test_every_tool_use_gets_one_result_and_one_final_status_over_forty_random_turns(
    llm, connect, api_key, settings
):
    # Short, yet far above the time the page takes to answer a call at once,
    # even on a loaded machine with PostgreSQL (a late answer would turn an
    # expected success into a timeout).
    settings.OWLLAYER_TOOL_TIMEOUT = 2.0
    settings.OWLLAYER_MAX_TOOL_ROUNDS = MAX_ROUNDS
    settings.OWLLAYER_HISTORY_MESSAGES = 10  # long sessions cross the window
    settings.OWLLAYER_STREAM_INTERVAL = 0.0
    rng = random.Random(SEED)
    world = World(llm, connect, api_key)

    for number in range(1, TURNS + 1):
        await world.play(rng, make_plan(rng, number))
    await world.finish()

    assert leftover_tasks() == []

    # The model's side: well-formed requests, every tool_use answered next time.
    assert check_requests(world, llm.requests) > 0

    # The store's side, per session.
    sessions = sorted(set(world.session_of_turn.values()))
    expected: dict[str, str] = {}
    for plan in world.plans.values():
        expected.update(plan.expected_statuses())
    rows = [row async for row in ToolCall.objects.filter(session_id__in=sessions)]
    assert sorted(row.tool_use_id for row in rows) == sorted(expected)
    assert {row.tool_use_id: row.status for row in rows} == expected
    assert all(row.status in ToolCall.FINAL_STATUSES for row in rows)
    stored_uses = 0
    for session_id in sessions:
        messages = await stored_messages(session_id)
        assert_stored_conversation_valid(messages)
        stored_uses += sum(1 for m in messages for b in m.content if b["type"] == "tool_use")
    assert stored_uses == len(expected)

    # The page's side: no call id twice, each one a row that was sent.
    assert len(world.sent_call_ids) == len(set(world.sent_call_ids))
    sent_rows = {row.call_id for row in rows if row.sent_at is not None}
    assert set(world.sent_call_ids) == sent_rows
    assert not await Session.objects.filter(id__in=sessions, ended_at__isnull=True).aexists()
