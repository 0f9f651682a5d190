"""A tool call's life, as one state machine, sans I/O.

Every ``tool_use`` the model emits is one call. Its states are the
``ToolCall.status`` values of the ledger table (the model's choices are built
from ``CallStatus``), its events are what happens to it, and ``TRANSITIONS``
below is the one table of what may happen in which state::

    pending --dispatched--> sent --approval_requested--> awaiting_approval
       |                     |                               |
       +--started------------)-------> running <--approved---+
       |                     |            |                  |
       v                     v            v                  v
    invalid_args  unavailable  success  error  timeout  denied  expired
                        (and from any open state: cancelled, disconnected)

A final state never changes again. The agent moves its in-memory calls with
``step()`` (``aitp.ledger.PendingCall``); the services write a row's status
only from the states ``sources()`` names, so a late write never undoes a
final one.

When an event is not allowed, who is at fault decides the error, as in the
session machine: the page answering a call that is over (or that waits for
something else) gets ``PageMistake`` -- an error frame with a stable code,
the connection goes on; the server making a move the table refuses is
``ServerMistake`` -- our bug, logged, the turn ends with ``internal_error``.
"""
from __future__ import annotations

import enum


class CallStatus(str, enum.Enum):
    """The states of a call; ``label`` is what people read."""

    PENDING = "pending"
    SENT = "sent"
    AWAITING_APPROVAL = "awaiting_approval"
    RUNNING = "running"
    SUCCESS = "success"
    ERROR = "error"
    TIMEOUT = "timeout"
    INVALID_ARGS = "invalid_args"
    UNAVAILABLE = "unavailable"
    DENIED = "denied"
    EXPIRED = "expired"
    DISCONNECTED = "disconnected"
    CANCELLED = "cancelled"

    @property
    def label(self) -> str:
        return _LABELS[self]

    @property
    def is_final(self) -> bool:
        return self in FINAL


_LABELS = {
    CallStatus.PENDING: "Pending",
    CallStatus.SENT: "Sent to page",
    CallStatus.AWAITING_APPROVAL: "Awaiting approval",
    CallStatus.RUNNING: "Running",
    CallStatus.SUCCESS: "Success",
    CallStatus.ERROR: "Error",
    CallStatus.TIMEOUT: "Timed out",
    CallStatus.INVALID_ARGS: "Invalid arguments",
    CallStatus.UNAVAILABLE: "Tool not available",
    CallStatus.DENIED: "Denied",
    CallStatus.EXPIRED: "Approval expired",
    CallStatus.DISCONNECTED: "Client disconnected",
    CallStatus.CANCELLED: "Cancelled",
}

OPEN = frozenset({CallStatus.PENDING, CallStatus.SENT, CallStatus.AWAITING_APPROVAL, CallStatus.RUNNING})
FINAL = frozenset(CallStatus) - OPEN


class Party(enum.Enum):
    """Who makes a move: the page (through its frames), a person deciding an
    approval, or the server itself."""

    PAGE = "page"
    PERSON = "person"
    SERVER = "server"


class CallEvent(enum.Enum):
    DISPATCHED = "dispatched"  # the TOOL_CALL frame went out to the page
    APPROVAL_REQUESTED = "approval_requested"  # a human decision is asked for
    APPROVED = "approved"  # the human decision allows a server tool to run
    STARTED = "started"  # a server tool runs (no approval needed)
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    ARGUMENTS_REFUSED = "arguments_refused"
    NOT_AVAILABLE = "not_available"
    TIMED_OUT = "timed_out"  # the page did not answer in time
    DENIED = "denied"  # declined, or answered without the approval it needed
    EXPIRED = "expired"  # nobody decided in time
    CANCELLED = "cancelled"  # the turn was cancelled, or skipped the call
    DISCONNECTED = "disconnected"  # the page left


S = CallStatus
E = CallEvent
_ANY_OPEN = OPEN

# (event) -> (states it may happen in, the state it leads to). The one table.
TRANSITIONS: dict[CallEvent, tuple[frozenset[CallStatus], CallStatus]] = {
    E.DISPATCHED: (frozenset({S.PENDING}), S.SENT),
    # Asked again while waiting: the same state, a later deadline.
    E.APPROVAL_REQUESTED: (frozenset({S.PENDING, S.SENT, S.AWAITING_APPROVAL}), S.AWAITING_APPROVAL),
    E.APPROVED: (frozenset({S.AWAITING_APPROVAL}), S.RUNNING),
    E.STARTED: (frozenset({S.PENDING}), S.RUNNING),
    E.SUCCEEDED: (frozenset({S.SENT, S.AWAITING_APPROVAL, S.RUNNING}), S.SUCCESS),
    E.FAILED: (_ANY_OPEN, S.ERROR),
    E.ARGUMENTS_REFUSED: (frozenset({S.PENDING}), S.INVALID_ARGS),
    E.NOT_AVAILABLE: (frozenset({S.PENDING}), S.UNAVAILABLE),
    E.TIMED_OUT: (frozenset({S.SENT}), S.TIMEOUT),
    E.DENIED: (frozenset({S.SENT, S.AWAITING_APPROVAL}), S.DENIED),
    E.EXPIRED: (frozenset({S.SENT, S.AWAITING_APPROVAL}), S.EXPIRED),
    E.CANCELLED: (_ANY_OPEN, S.CANCELLED),
    E.DISCONNECTED: (_ANY_OPEN, S.DISCONNECTED),
}

# The event that ends a call with each final status (an Outcome's status).
ENDED_BY: dict[CallStatus, CallEvent] = {
    target: event for event, (_, target) in TRANSITIONS.items() if target in FINAL
}

# What an approval row's status means for the call waiting on it.
APPROVAL_DECISIONS: dict[str, CallEvent] = {
    "approved": E.APPROVED,
    "denied": E.DENIED,
    "expired": E.EXPIRED,
    "cancelled": E.CANCELLED,
    "disconnected": E.DISCONNECTED,
}


class CallError(Exception):
    """An event the table does not allow in the call's state."""

    def __init__(self, state: CallStatus, event: CallEvent, by: Party) -> None:
        self.state, self.event, self.by = state, event, by
        super().__init__(f"{event.value} is not allowed in state {state.value} (by {by.value})")


class PageMistake(CallError):
    """The page's fault (or a person's): the call is over or waits for
    something else. Answered with ``code``; the connection goes on."""

    code = "unknown_call"


class ServerMistake(CallError):
    """Our fault: the server made a move the table refuses. A bug."""


def step(state: CallStatus | str, event: CallEvent, *, by: Party = Party.SERVER) -> CallStatus:
    """The state after ``event``; raises ``PageMistake`` or ``ServerMistake``."""
    state = CallStatus(state)
    sources, target = TRANSITIONS[event]
    if state in sources:
        return target
    if by is Party.SERVER:
        raise ServerMistake(state, event, by)
    raise PageMistake(state, event, by)


def allowed(state: CallStatus | str, event: CallEvent) -> bool:
    return CallStatus(state) in TRANSITIONS[event][0]


def sources(target: CallStatus | str) -> frozenset[CallStatus]:
    """Every state from which some event leads to ``target``."""
    target = CallStatus(target)
    found: set[CallStatus] = set()
    for states, leads_to in TRANSITIONS.values():
        if leads_to is target:
            found |= states
    return frozenset(found)


def choices() -> list[tuple[str, str]]:
    """(value, label) pairs for a database field."""
    return [(status.value, status.label) for status in CallStatus]
