"""What the pieces of the agent turn share: its settings, the page it acts
in, the one port back to the connection (``TurnIO``: its ``send``), and
``TurnParts``.

The turn is split by concern (``agent.loop`` the model loop,
``agent.page_tools``, ``agent.server_tools``,
``agent.approvals``); each piece holds the same ``TurnParts`` and knows
nothing of the consumer but ``TurnIO``.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Protocol

from agent.store import AgentStore
from aitp import protocol as p
from aitp.ledger import Ledger
from aitp.pricing import PriceRow
from aitp.tools import ToolSurface
from aitp.turn import TurnEvent
from runtime import metrics


@dataclass(frozen=True)
class AgentConfig:
    model: str
    max_tokens: int = 1024
    tool_timeout: float = 10.0
    approval_timeout: float = 120.0
    max_tool_rounds: int = 8
    history_messages: int = 40
    stream_interval: float = 0.04
    # A server tool's answer may nest as deep as a page's result in its frame.
    max_json_depth: int = p.DEFAULT_MAX_DEPTH
    # What the model's tokens cost (aitp.pricing).
    prices: tuple[PriceRow, ...] = ()


@dataclass(frozen=True)
class PageSnapshot:
    url: str
    title: str
    context: dict

    def describe(self) -> str:
        context = json.dumps(self.context, ensure_ascii=False, sort_keys=True)
        return f"[page]\nurl: {self.url}\ntitle: {self.title}\ncontext: {context}"


@dataclass(frozen=True)
class TurnOver:
    """The turn's last word: it is over, and the page gets ``done`` (None
    when the turn was cancelled)."""

    done: p.Message | None


class TurnIO(Protocol):
    """The one port from the turn back to the connection that owns it."""

    async def send(self, item: p.Message | TurnEvent | TurnOver) -> None:
        """A frame for the page, or where the turn is now (``aitp.turn``):
        the connection records it for the session row and its watchers, and
        ends the turn on ``TurnOver`` before the done frame goes out."""

    def surface(self) -> ToolSurface:
        """The tools the page offers right now (server tools included)."""

    def page(self) -> PageSnapshot: ...


# The name the tests and the consumer know the port by.
AgentIO = TurnIO


class ApprovalLimits(Protocol):
    async def check_approval_request(self, call_id: str) -> p.Message | None: ...


@dataclass
class TurnParts:
    """One connection's turn state that every piece of the turn uses."""

    session_id: str
    tenant_id: int
    config: AgentConfig
    io: TurnIO
    store: AgentStore
    ledger: Ledger
    limits: ApprovalLimits | None = None
    # Where the running turn's time goes (a new one each turn).
    clock: TurnClock = field(default_factory=lambda: TurnClock())


@dataclass
class TurnClock:
    """Where one turn's time went: seconds waiting for the model, running
    tools (their approval waits apart) and waiting for a person's approval."""

    started: float = field(default_factory=time.monotonic)
    model: float = 0.0
    tools: float = 0.0
    approval: float = 0.0

    def approval_decided(self, decision: str, *, asked_at: float) -> None:
        """A person's wait since ``asked_at`` (``time.monotonic()``) ended with ``decision``."""
        waited = time.monotonic() - asked_at
        self.approval += waited
        metrics.approval_waited(decision, waited)


def unknown_call(call_id: str) -> p.Message:
    return p.error_event("unknown_call", "No pending tool call has this id.", callId=call_id)
