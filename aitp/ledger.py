"""The tool-call ledger of one connection: calls waiting for an answer.

Every ``tool_use`` the model emits becomes a ``PendingCall`` whose future is
resolved exactly once with an ``Outcome``; that outcome becomes the one
``tool_result`` the model receives. A call leaves the ledger as soon as it is
resolved, so a late or duplicate answer finds nothing (``unknown_call``).

Each call carries its state in the machine of ``aitp.calls``: ``step()`` moves
it by an event, ``resolve()`` ends it with the event its outcome's status
names; a move the table refuses raises there, never silently here.
"""
from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any, TypeVar

from aitp import calls
from aitp import protocol as p
from aitp.calls import CallEvent, CallStatus, Party
from aitp.tools import Risk, ToolSpec
from runtime import ids

T = TypeVar("T")

# Final statuses, as the Outcome and the ToolCall row carry them (plain
# strings; the states and their table are in aitp.calls).
SUCCESS = CallStatus.SUCCESS.value
ERROR = CallStatus.ERROR.value
TIMEOUT = CallStatus.TIMEOUT.value
INVALID_ARGS = CallStatus.INVALID_ARGS.value
UNAVAILABLE = CallStatus.UNAVAILABLE.value
DENIED = CallStatus.DENIED.value
EXPIRED = CallStatus.EXPIRED.value
DISCONNECTED = CallStatus.DISCONNECTED.value
CANCELLED = CallStatus.CANCELLED.value

# What the model (and the transcript) is told when a person refuses a call:
# the page's user, or an operator.
DECLINED_MESSAGE = "The user declined this action."
OPERATOR_DECLINED_MESSAGE = "An operator declined this action."


# What the model (and the call's row) is told when a call ends without
# running because its approval, or its turn, ended first.
USER_EXPIRED_MESSAGE = "The user did not decide in time; the action was not approved."
SERVER_EXPIRED_MESSAGE = "Nobody approved the action in time; it did not run."
CANCELLED_MESSAGE = "The turn was cancelled before the tool answered."
LEFT_MESSAGE = "The user left the page before the tool answered."


# What the model is told when a tool's answer cannot enter the ledger or the
# conversation (``checked_answer``), by the code the check refused it with;
# and when the arguments it wrote for a call cannot (``checked_arguments``).
UNUSABLE_ANSWER = "The tool ran, but its answer could not be used: it {why}."
UNUSABLE_ARGUMENTS = "Invalid arguments: the input {why}; the call did not run."
_UNUSABLE_WHY = {
    "invalid_text": "contains text that is not valid Unicode (a NUL character or a lone surrogate)",
    "invalid_number": "contains a number that is not finite or is too large",
    "too_deep": "is nested too deeply",
    "invalid_value": "contains a value that is not JSON data",
}
UNUSABLE_ERROR = "The tool failed, and its error message could not be used."


def unusable_answer(code: str) -> str:
    return UNUSABLE_ANSWER.format(why=_UNUSABLE_WHY.get(code, "is not JSON data"))


def unusable_arguments(code: str) -> str:
    return UNUSABLE_ARGUMENTS.format(why=_UNUSABLE_WHY.get(code, "is not JSON data"))


def checked_arguments(args: Any, *, max_depth: int | None) -> str | None:
    """Why the arguments the model wrote for a call cannot enter the ledger,
    the conversation or a TOOL_CALL frame (the code ``find_unstorable``
    refused them with), or None: the check a page's frame gets, at the
    depth the arguments have in their frame."""
    problem = p.find_unstorable_result(args, max_depth=max_depth)
    return None if problem is None else problem[0]


def checked_answer(result: Any, *, max_depth: int | None) -> tuple[Outcome, str | None]:
    """The successful answer of a tool that is not the page's (whose frames
    were checked as they arrived) as it may enter the ledger and the model's
    history: a success, or an error saying why it could not be used. The
    second item is the refusal's code (None when it was used)."""
    problem = p.find_unstorable_result(result, max_depth=max_depth)
    if problem is None:
        return Outcome(SUCCESS, result=result), None
    return Outcome(ERROR, error=unusable_answer(problem[0])), problem[0]


def checked_error(text: str) -> str:
    """A tool's own error message as the model (and the audit) may be told it."""
    return UNUSABLE_ERROR if p.text_problem(text) is not None else text


# The row of a call an operator ran (``Agent.operator_call``) carries this
# and its call id in place of a model's tool_use id.
OPERATOR_CALL = "operator_"


def new_call_id() -> str:
    # Unguessable: only the connection that got the call can answer it, and
    # nobody else can even name it.
    return "tc_" + ids.token_urlsafe(16)


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

    def tool_result_block(self, tool_use_id: str) -> dict[str, Any]:
        block: dict[str, Any] = {
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
    args: dict[str, Any]
    spec: ToolSpec | None
    deadline: float = 0.0
    approval_id: int | None = None
    future: asyncio.Future[Outcome] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )
    # For server tools awaiting a human: resolved with "approved" / "denied" / "expired".
    decision: asyncio.Future[str] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )
    state: CallStatus = CallStatus.PENDING
    # Who refused the call, when a person did: "user" or "operator".
    declined_by: str = ""
    # Whether the deadline was moved once already (``extend``).
    extended: bool = False
    # time.monotonic() when it began to run, and when the page asked for its approval.
    began: float = field(default_factory=time.monotonic)
    approval_asked_at: float | None = None

    @property
    def risk(self) -> Risk:
        return self.spec.risk if self.spec is not None else Risk.NONE

    @property
    def origin(self) -> str:
        return self.spec.origin if self.spec is not None else "client"

    def step(self, event: CallEvent, *, by: Party = Party.SERVER) -> CallStatus:
        """Move the call by ``event`` (``aitp.calls.TRANSITIONS``)."""
        self.state = calls.step(self.state, event, by=by)
        return self.state

    def resolve(self, outcome: Outcome) -> bool:
        """End the call with ``outcome``; False when it had ended already."""
        if self.future.done():
            return False
        self.finish(outcome)
        self.future.set_result(outcome)
        return True

    def finish(self, outcome: Outcome) -> None:
        """Move the call to its outcome's final state, once."""
        if not self.state.is_final:
            self.step(calls.ENDED_BY[CallStatus(outcome.status)])

    def decide(self, decision: str) -> bool:
        if self.decision.done():
            return False
        self.decision.set_result(decision)
        return True

    def extend(self, until: float) -> bool:
        """Move the deadline later, to ``until``, once in the call's life
        (the page asked its user; asking again gains no more time). True
        when it moved; the waiter re-checks when it wakes."""
        if self.extended or until <= self.deadline:
            return False
        self.deadline = until
        self.extended = True
        return True


async def wait_until_deadline(call: PendingCall, future: asyncio.Future[T]) -> T | None:
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
