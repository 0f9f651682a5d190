"""Asking for a person: the built-in server tool ``ask_for_a_person`` that a
key offers its sessions' agent (``ApiKey.handoff``), and the wait for an
operator that it starts.

The model calls it when the page user asks for a person, or when it cannot
help. The session then waits for an operator (``Session.handoff_requested_at``:
the admin counts and lists it, the tenant's alert goes out), the page is told
(``SYSTEM_EVENT waiting``, a sentence every client shows), and the model is
told what to say next; the turn goes on as any other. An operator who takes
the chat over (``operators.handover``) ends the wait; when none has within
``OWLLAYER_HANDOFF_WAIT_SECONDS``, the page is told none is free, the model is
told so in the conversation, and the agent simply goes on answering.
"""
from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from agent.conversation import NO_OPERATOR, human_block
from aitp import alerts, services
from aitp import protocol as p
from aitp.tools import ToolSpec, parse_tool
from runtime.config import config
from runtime.db import db_call

if TYPE_CHECKING:
    from connection.turns import TurnOwner

logger = logging.getLogger(__name__)

ASK_FOR_A_PERSON = "ask_for_a_person"
SPEC: ToolSpec = parse_tool({
    "name": ASK_FOR_A_PERSON,
    "description": ("Ask a human operator to join this chat: when the user asks for a person, or when you "
                    "cannot help them. The page user is told an operator is asked; tell them what happens next."),
    "parameters": {"type": "OBJECT", "properties": {
        "reason": {"type": "STRING", "description": "Why a person is needed, in a few words"}},
        "required": ["reason"]},
    "risk": "none",
}, origin="server", path=ASK_FOR_A_PERSON)

WAITING = "An operator has been asked to join this chat and will answer you here as soon as one is free."
NONE_FREE = "No operator is free to join right now; the assistant goes on helping you."
# What the page's SYSTEM_EVENT waiting says it waits for.
REASON = "operator_handoff"
MAX_REASON_CHARS = 500


def offered(server_tools: list, key, turns: TurnOwner) -> list:
    """The session's server tools, with ``ask_for_a_person`` when its key
    offers it (in place of a tenant's own tool of that name)."""
    if not key.handoff:
        return server_tools
    turns.handoff = AskForAPerson(turns)
    return [*(tool for tool in server_tools if tool.spec.name != ASK_FOR_A_PERSON), turns.handoff]


class AskForAPerson:
    """The tool, as the agent's server tools run it (``aitp.ports.ServerTool``)."""

    spec = SPEC
    policy = "user"  # never asked: its risk is none

    def __init__(self, turns: TurnOwner) -> None:
        self._turns = turns
        self._timer: asyncio.TimerHandle | None = None
        self._waiting_task: asyncio.Task | None = None

    async def run(self, args: dict, *, session_id: str, tenant_id: int, call_id: str = "") -> Any:
        turns = self._turns
        if turns.operator is not None:
            return {"status": "operator_in_charge", "instruction": "A person is in charge of this chat already."}
        reason = str(args.get("reason") or "")[:MAX_REASON_CHARS]
        wait = config().protocol.handoff_wait
        if await db_call(services.session_handoff_requested, session_id=session_id, reason=reason):
            alerts.send_in_background(alerts.handoff_requested, session_id)
            self._start_wait(session_id, wait)
        await turns.send(p.system_event("waiting", message=WAITING, data={"reason": REASON}))
        return {
            "status": "operator_asked",
            "waitSeconds": int(wait),
            "instruction": ("Tell the user a person has been asked to join and will answer here; until one "
                            "does, go on helping them yourself."),
        }

    def _start_wait(self, session_id: str, wait: float) -> None:
        self.stop()
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(wait, self._wait_over, session_id)

    def _wait_over(self, session_id: str) -> None:
        self._timer = None
        self._waiting_task = asyncio.create_task(self._none_came(session_id))

    async def _none_came(self, session_id: str) -> None:
        try:
            if not await db_call(services.session_handoff_unanswered, session_id=session_id):
                return  # an operator took the chat over meanwhile
            turns = self._turns
            if turns.agent is None or turns.operator is not None:
                return
            await turns.human(human_block(NO_OPERATOR))
            await turns.send(p.system_event("waiting", message=NONE_FREE, data={"reason": REASON, "over": True}))
        except Exception:
            logger.exception("session %s: the end of the wait for an operator failed", session_id)

    def stop(self) -> None:
        """No operator is waited for any more (one took over, or the page left)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._waiting_task is not None and not self._waiting_task.done():
            self._waiting_task.cancel()
        self._waiting_task = None
