"""The tool-call ledger of one connection: calls waiting for an answer.

Every ``tool_use`` the model emits becomes a ``PendingCall`` whose future is
resolved exactly once with an ``Outcome``; that outcome becomes the one
``tool_result`` the model receives. A call leaves the ledger as soon as it is
resolved, so a late or duplicate answer finds nothing (``unknown_call``).
"""
from __future__ import annotations

import asyncio
import json
import secrets
from dataclasses import dataclass, field
from typing import Any

from aitp.tools import Risk, ToolSpec

# ToolCall.Status values (kept as plain strings so this module needs no ORM).
SUCCESS = "success"
ERROR = "error"
TIMEOUT = "timeout"
INVALID_ARGS = "invalid_args"
UNAVAILABLE = "unavailable"
DENIED = "denied"
EXPIRED = "expired"
DISCONNECTED = "disconnected"
CANCELLED = "cancelled"

DECLINED_MESSAGE = "The user declined this action."


def new_call_id() -> str:
    # Unguessable: only the connection that got the call can answer it, and
    # nobody else can even name it.
    return "tc_" + secrets.token_urlsafe(16)


@dataclass(frozen=True)
class Outcome:
    status: str
    result: Any = None
    error: str = ""

    @property
    def is_error(self) -> bool:
        return self.status != SUCCESS

    def content_for_model(self) -> str:
        if self.status == SUCCESS:
            if self.result is None:
                return "The tool ran successfully and returned no data."
            return json.dumps(self.result, ensure_ascii=False, separators=(",", ":"))
        return self.error or f"The tool call ended with status {self.status}."

    def tool_result_block(self, tool_use_id: str) -> dict:
        block = {
            "type": "tool_result",
            "tool_use_id": tool_use_id,
            "content": self.content_for_model(),
        }
        if self.is_error:
            block["is_error"] = True
        return block


@dataclass
class PendingCall:
    call_id: str
    tool_use_id: str
    name: str
    args: dict
    spec: ToolSpec | None
    deadline: float = 0.0
    approval_id: int | None = None
    future: asyncio.Future = field(default_factory=lambda: asyncio.get_running_loop().create_future())
    # For server tools awaiting a human: resolved with "approved" / "denied" / "expired".
    decision: asyncio.Future = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )

    @property
    def risk(self) -> Risk:
        return self.spec.risk if self.spec is not None else Risk.NONE

    @property
    def origin(self) -> str:
        return self.spec.origin if self.spec is not None else "client"

    def resolve(self, outcome: Outcome) -> bool:
        if self.future.done():
            return False
        self.future.set_result(outcome)
        return True

    def decide(self, decision: str) -> bool:
        if self.decision.done():
            return False
        self.decision.set_result(decision)
        return True

    def extend(self, until: float) -> None:
        # Deadlines only ever move later; the waiter re-checks when it wakes.
        self.deadline = max(self.deadline, until)


async def wait_until_deadline(call: PendingCall, future: asyncio.Future):
    """The future's result, or None once the call's (extendable) deadline passed."""
    loop = asyncio.get_running_loop()
    while not future.done():
        remaining = call.deadline - loop.time()
        if remaining <= 0:
            return None
        await asyncio.wait({future}, timeout=remaining)
    return future.result()


class Ledger:
    """Calls of this connection that may still be answered."""

    def __init__(self) -> None:
        self._calls: dict[str, PendingCall] = {}

    def add(self, call: PendingCall) -> None:
        self._calls[call.call_id] = call

    def get(self, call_id: str) -> PendingCall | None:
        call = self._calls.get(call_id)
        if call is None or call.future.done():
            return None
        return call

    def by_approval(self, approval_id: int) -> PendingCall | None:
        for call in self.open_calls():
            if call.approval_id == approval_id:
                return call
        return None

    def remove(self, call_id: str) -> None:
        self._calls.pop(call_id, None)

    def open_calls(self) -> list[PendingCall]:
        return [call for call in self._calls.values() if not call.future.done()]
