"""Page tools in the turn: the TOOL_CALL goes out, the TOOL_RESULT comes in.

``run()`` sends one call to the page and waits for its answer until the
call's deadline (which an approval request moves later); ``on_tool_result()``
takes the page's answer from the connection (``connection.turns``) and resolves the
call the turn waits on. A risky call must be approved in the page first
(``agent.approvals``).
"""
from __future__ import annotations

import asyncio
import dataclasses

from agent.approvals import Approvals
from agent.parts import TurnParts, unknown_call
from aitp import protocol as p
from aitp.calls import CallEvent, CallStatus
from aitp.ledger import (
    DISCONNECTED,
    ERROR,
    EXPIRED,
    INVALID_ARGS,
    SUCCESS,
    TIMEOUT,
    UNAVAILABLE,
    USER_EXPIRED_MESSAGE,
    Outcome,
    PendingCall,
    wait_until_deadline,
)
from aitp.tools import Risk
from aitp.turn import TurnEvent
from runtime import tracing

# What the model is told of a call lost with its page's socket (see ``calls_lost``).
LOST_MESSAGE = ("The page's connection dropped after the call reached it, and no answer came: "
                "it may or may not have run.")


# The page tools an operator in charge of the chat may run from the admin:
# those nobody is asked to approve.
OPERATOR_RISKS = frozenset({Risk.NONE, Risk.LOW})
NOT_FOR_OPERATORS = "Only the page's tools of risk none or low can be run by an operator."


class _OutsideTurn:
    """The connection's port for a call no turn runs (an operator's): its
    frames go out; no turn phase is reported, as no turn is running."""

    def __init__(self, io) -> None:
        self._io = io

    async def send(self, item) -> None:
        if isinstance(item, p.Message):
            await self._io.send(item)

    def surface(self):
        return self._io.surface()

    def page(self):
        return self._io.page()


class PageTools:
    def __init__(self, parts: TurnParts, approvals: Approvals) -> None:
        self.parts = parts
        self.approvals = approvals

    async def run(self, call: PendingCall) -> Outcome:
        parts = self.parts
        loop = asyncio.get_running_loop()
        call.deadline = loop.time() + parts.config.tool_timeout
        parts.ledger.add(call)
        try:
            # Sent before the frame leaves: the page may answer at once.
            call.step(CallEvent.DISPATCHED)
            await parts.io.send(p.tool_call(call.call_id, call.name, call.args))
            # Shielded: the frame is out, so the row must say so even if the
            # turn is cancelled this very moment (the page left).
            await asyncio.shield(parts.store.mark_call(call, CallStatus.SENT.value, sent=True))
            await parts.io.send(TurnEvent.TOOL_DISPATCHED)
            outcome = await wait_until_deadline(call, call.future)
            if outcome is not None:
                return outcome
            if call.approval_id is not None:
                outcome = Outcome(EXPIRED, error=USER_EXPIRED_MESSAGE)
                await parts.store.approval_expire(call, outcome)
                await parts.io.send(
                    p.error_event("approval_expired", "The approval request expired.", callId=call.call_id)
                )
            else:
                outcome = Outcome(
                    TIMEOUT,
                    error=f"The page did not answer within {parts.config.tool_timeout:g} seconds.",
                )
                await parts.io.send(
                    p.error_event("tool_timeout", f"The tool {call.name} did not answer in time.",
                                  callId=call.call_id)
                )
            call.resolve(outcome)
            return outcome
        finally:
            parts.ledger.remove(call.call_id)
            if call.approval_asked_at is not None:
                # From the page's APPROVAL_REQUEST to its answer (or the call's end).
                tracing.record("approval_wait", since=call.approval_asked_at, asked_by="page")

    async def run_for_operator(self, call: PendingCall) -> Outcome:
        """A page tool the operator in charge runs: one of risk none or low
        the page offers now, with arguments its schema takes; sent and
        answered as a model's call is (the page cannot tell them apart)."""
        spec = call.spec
        if spec is None or spec.origin == "server":
            return Outcome(UNAVAILABLE, error=f"The tool {call.name} is not available on this page.")
        if spec.risk not in OPERATOR_RISKS:
            return Outcome(UNAVAILABLE, error=NOT_FOR_OPERATORS)
        problems = spec.argument_problems(call.args)
        if problems:
            return Outcome(INVALID_ARGS, error="Invalid arguments: " + "; ".join(problems[:10]))
        outside = dataclasses.replace(self.parts, io=_OutsideTurn(self.parts.io))
        return await PageTools(outside, self.approvals).run(call)

    async def on_tool_result(self, payload: p.ToolResult) -> p.Message | None:
        """Returns an error event to send back, or None when accepted."""
        call = self.parts.ledger.get(payload.callId)
        if call is None or call.origin == "server":
            return unknown_call(payload.callId)
        if payload.status == "pending_approval":
            # The same ask as an APPROVAL_REQUEST for the call's own arguments.
            return await self.approvals.asked(call, call.name, call.args, message="")
        if call.approval_id is not None:
            return p.error_event(
                "approval_pending",
                "This call is waiting for the user's decision; answer with APPROVAL_RESPONSE.",
                callId=payload.callId,
            )
        if call.risk.needs_approval:
            return await self.approvals.skipped(call, "tool_result")
        if payload.status == "success":
            call.resolve(Outcome(SUCCESS, result=payload.result))
        else:
            call.resolve(Outcome(ERROR, error=payload.error or "The tool failed in the page."))
        return None

    async def calls_lost(self, call_ids: list[str]) -> None:
        """Calls whose frame (TOOL_CALL, or a server tool's APPROVAL_REQUEST)
        the page handled on a socket that dropped, never answered: a page
        tool may have run, so none is sent again; each ends 'disconnected',
        with its approval, and the model is told (docs/protocol.md §3a)."""
        for call_id in call_ids:
            call = self.parts.ledger.get(call_id)
            if call is None or call.future.done() or call.decision.done():
                continue
            outcome = Outcome(DISCONNECTED, error=LOST_MESSAGE)
            if call.approval_id is not None:
                await self.parts.store.approval_close(call, DISCONNECTED, outcome)
            if call.origin == "server":
                call.decide(DISCONNECTED)
            else:
                call.resolve(outcome)
