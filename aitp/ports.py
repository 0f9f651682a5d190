"""What the protocol app needs from the apps built on it, declared here.

``aitp`` is the ground floor: every other app imports it, and it imports
none of them. Where a turn needs something an upper app owns (human
approvals of risky calls, the tenant's server tools), this module declares
the interface as a ``Protocol`` and the upper app registers its
implementation at start-up, in its ``AppConfig.ready()``::

    from aitp import ports
    ports.provide(approvals=ApprovalsProvider())

The turn asks ``ports.approvals()``; a port nobody provided raises
``PortMissing`` naming it, never a bare ``AttributeError`` half way through a
turn. Every method of ``ApprovalDesk`` except ``load_server_tools`` is
synchronous ORM work: callers run it on the database threads (``db_call``).
"""
from __future__ import annotations

from datetime import datetime
from typing import Any, Protocol, runtime_checkable

from aitp.tools import ToolSpec


class ApprovalError(Exception):
    """A request the caller may not make; ``code`` is stable, ``message`` is for people."""

    MESSAGES = {
        "unknown_call": "no such pending call",
        "approval_mismatch": "approval does not match the call's arguments",
        "already_decided": "approval already decided",
        "not_allowed": "not allowed to decide this approval",
        "session_ended": "the page's session has ended; the call can no longer run",
    }

    def __init__(self, code: str, message: str = "") -> None:
        self.code = code
        self.message = message or self.MESSAGES.get(code, code)
        super().__init__(self.message)


class PortMissing(RuntimeError):
    """No app provided the named port (its app is not installed or not ready)."""


@runtime_checkable
class ServerTool(Protocol):
    """A tool that runs on the server, as the turn runs it."""

    spec: ToolSpec  # origin "server"
    policy: str  # who approves it: user / operator / user_and_operator

    async def run(self, args: dict, *, session_id: str, tenant_id: int, call_id: str = "") -> Any:
        """The tool's result; raises with a message fit for the model."""


class ApprovalTicket(Protocol):
    """One request for a human decision, as the turn sees it."""

    id: int
    status: str
    needs_user: bool
    needs_operator: bool


class ApprovalDesk(Protocol):
    """Human approvals of risky calls and the tenant's server tools.

    Each write names the ToolCall row by its ``call_id``; refusals raise
    ``ApprovalError`` with a stable code."""

    def request_client(self, *, call_id: str, tool_name: str, args: dict, risk: str,
                       message: str, session_id: str, timeout: float) -> ApprovalTicket: ...

    def request_server(self, *, call_id: str, tool: ServerTool, args: dict, session_id: str,
                       timeout: float, message: str) -> ApprovalTicket: ...

    def record_violation(self, *, call_id: str, session_id: str, risk: str,
                         reason: str) -> ApprovalTicket: ...

    def decide_user(self, *, approval_id: int, session_id: str, approved: bool,
                    error: str | None) -> ApprovalTicket: ...

    def decision(self, approval_id: int) -> tuple[str, str] | None:
        """(status, who declined: "user", "operator" or ""), None when no such row."""

    # The endings of a call that has an approval: each writes the call's final
    # status in the transaction of the approval's event, and answers whether
    # the call's row is final (so the turn does not write it again).

    def expire(self, *, approval_id: int, error: str | None = None) -> bool:
        """Nobody decided in time: the approval, and its call, expire."""

    def close(self, *, approval_id: int, status: str, call_status: str | None = None,
              error: str | None = None) -> bool:
        """The turn was cancelled (``status`` cancelled) or the page left
        (disconnected): the approval closes, its call ends as ``call_status``."""

    def record_execution(self, *, approval_id: int, ok: bool, error: str = "",
                         result: Any = None) -> bool:
        """The approved call ran: executed (success, ``result``) or failed (``error``)."""

    def close_of_ended_sessions(self) -> int: ...

    def end_with_sessions(self, *, session_ids: list[str], now: datetime, reason: str) -> int:
        """In the caller's transaction ending these sessions' rows: end the
        calls that have an approval, each with its event, before the caller
        disconnects the others. Returns how many approvals closed."""

    def expire_overdue(self) -> int: ...

    async def load_server_tools(self, tenant_id: int) -> list[ServerTool]: ...


class TenantWebhooks(Protocol):
    """Notices to a url a tenant chose, sent as its server tools' calls are:
    signed, to a checked address only (the approvals app owns that)."""

    def post_notice(self, *, url: str, secret: str, payload: dict) -> None:
        """POST ``payload`` as JSON, blocking until it is answered; raises
        (with a message fit for the operator's log) when it was not taken."""


# The ports a turn may use; another joins in the same shape: a Protocol above,
# a slot below, a getter. Speech engines and LLM backends need none: the turn
# never reaches them from here. They implement interfaces of this app
# (aitp.voice.base, aitp.llm), are chosen by settings, and the agent, a
# floor above, uses them.
_provided: dict[str, Any] = {}
PORTS = ("approvals", "webhooks")


def provide(**implementations: Any) -> None:
    """Register implementations by port name (``AppConfig.ready()``)."""
    for name, implementation in implementations.items():
        if name not in PORTS:
            raise ValueError(f"unknown port {name!r}; known: {', '.join(PORTS)}")
        _provided[name] = implementation


def _get(name: str) -> Any:
    try:
        return _provided[name]
    except KeyError:
        raise PortMissing(f"no app provides the {name!r} port") from None


def approvals() -> ApprovalDesk:
    return _get("approvals")


def webhooks() -> TenantWebhooks:
    return _get("webhooks")
