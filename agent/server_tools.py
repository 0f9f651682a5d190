"""Server tools in the turn: run on the server, after a person's approval
when the tool's risk needs one.

``run()`` opens the approval (the tool's policy says whose: the page's user,
an operator, or both), tells the page, waits for the decision
(``await_decision``: notifications, plus a periodic re-read of the row so a
lost notification delays the turn instead of expiring it), then runs the
tool. A tool's own failure becomes the model's error result, and so does
an answer the ledger or the conversation could not hold (``checked_answer``).
"""
from __future__ import annotations

import asyncio
import logging
import time

from agent.approvals import Approvals, declined_message
from agent.parts import TurnParts
from aitp import protocol as p
from aitp.calls import CallEvent, CallStatus, Party
from aitp.ledger import (
    CANCELLED,
    CANCELLED_MESSAGE,
    DENIED,
    DISCONNECTED,
    ERROR,
    EXPIRED,
    LEFT_MESSAGE,
    SERVER_EXPIRED_MESSAGE,
    UNAVAILABLE,
    Outcome,
    PendingCall,
    checked_answer,
    checked_error,
)
from aitp.ports import ServerTool
from aitp.tools import canonical_json
from aitp.turn import TurnEvent
from runtime import tracing

# The turn logs under one name, whichever piece of it writes the line.
logger = logging.getLogger("agent.loop")

# How often a turn waiting on a human re-reads the approval row, in case a
# channel-layer notification was lost.
DECISION_RECHECK_SECONDS = 3.0


class ServerTools:
    def __init__(self, parts: TurnParts, approvals: Approvals,
                 tools: dict[str, ServerTool] | None = None) -> None:
        self.parts = parts
        self.approvals = approvals
        self.tools = tools or {}

    async def run(self, call: PendingCall) -> Outcome:
        parts = self.parts
        runner = self.tools.get(call.name)
        if runner is None:
            return Outcome(UNAVAILABLE, error=f"The tool {call.name} is not available.")
        assert call.spec is not None
        loop = asyncio.get_running_loop()
        if call.spec.risk.needs_approval:
            call.deadline = loop.time() + parts.config.approval_timeout
            parts.ledger.add(call)
            try:
                message = f"Allow {call.name} with {canonical_json(call.args)[:300]}?"
                approval = await parts.store.approval_request_server(
                    call, runner, timeout=parts.config.approval_timeout, message=message
                )
                call.approval_id = approval.id
                call.step(CallEvent.APPROVAL_REQUESTED)
                await parts.io.send(TurnEvent.APPROVAL_ASKED)
                if approval.needs_user:
                    await parts.io.send(p.system_event("approval_required", message=message,
                                                               data={"callId": call.call_id}))
                    await parts.io.send(
                        p.approval_request(call.call_id, call.name, call.spec.risk.value, call.args, message)
                    )
                if approval.needs_operator:
                    await parts.io.send(p.system_event(
                        "waiting", message="Waiting for an operator to approve this action.",
                        data={"callId": call.call_id, "reason": "operator_approval"},
                    ))
                asked = time.monotonic()
                with tracing.span("approval_wait", asked_by="server") as traced:
                    decision = await self.await_decision(call)
                    traced.set(decision=decision or "expired")
                parts.clock.approval_decided(decision or "expired", asked_at=asked)
                if decision is None:
                    outcome = Outcome(EXPIRED, error=SERVER_EXPIRED_MESSAGE)
                    await parts.store.approval_expire(call, outcome)
                    await parts.io.send(
                        p.error_event("approval_expired", "The approval request expired.",
                                      callId=call.call_id)
                    )
                    return outcome
                if decision != "approved":
                    return not_approved(call, decision)
                call.step(CallEvent.APPROVED, by=Party.PERSON)
            finally:
                parts.ledger.remove(call.call_id)
        else:
            call.step(CallEvent.STARTED)
        await parts.store.mark_call(call, CallStatus.RUNNING.value)
        await parts.io.send(TurnEvent.ANSWERING)
        try:
            result = await runner.run(
                call.args, session_id=parts.session_id, tenant_id=parts.tenant_id, call_id=call.call_id
            )
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a tool's own failure becomes the model's error result
            error = checked_error(str(exc)) or "The tool failed."
            logger.info("session %s: server tool %s failed: %s", parts.session_id, call.name, error)
            outcome, refused = Outcome(ERROR, error=error), None
        else:
            # What a webhook or a Python handler answered gets the check a
            # page's answer gets in its frame: a value no later layer could
            # hold (the ledger's row, the conversation, the next model
            # request) ends the call as an error the model is told about.
            outcome, refused = checked_answer(result, max_depth=parts.config.max_json_depth)
            if refused is not None:
                logger.warning("session %s: server tool %s answered a value that cannot be used (%s)",
                               parts.session_id, call.name, refused)
        # The tool ran: its outcome is the call's now, and its audit is
        # written (with the call's end), whatever happens to the turn this
        # very moment.
        call.resolve(outcome)
        if call.approval_id is not None:
            await asyncio.shield(parts.store.approval_executed(call, outcome))
        return outcome

    async def await_decision(self, call: PendingCall) -> str | None:
        """The human decision on a server tool, or None past the deadline.

        Decisions arrive as notifications (the page's answer, or an operator's
        over the channel layer); the row is also re-read every few seconds so
        a lost notification delays the turn instead of expiring it."""
        loop = asyncio.get_running_loop()
        while not call.decision.done():
            remaining = call.deadline - loop.time()
            if remaining <= 0:
                return None
            await asyncio.wait({call.decision}, timeout=min(remaining, DECISION_RECHECK_SECONDS))
            if not call.decision.done():
                await self.approvals.apply_row(call)
        return call.decision.result()


def not_approved(call: PendingCall, decision: str) -> Outcome:
    """The outcome of a call whose approval ended other than approved: the
    status its approval ended the call's row with (``approvals.services``),
    and words for the model."""
    if decision == "expired":
        return Outcome(EXPIRED, error=SERVER_EXPIRED_MESSAGE)
    if decision == "cancelled":
        return Outcome(CANCELLED, error=CANCELLED_MESSAGE)
    if decision == "disconnected":
        return Outcome(DISCONNECTED, error=LEFT_MESSAGE)
    return Outcome(DENIED, error=declined_message(call))
