"""The approvals side of the turn: a person decides on a risky call.

A page's call (interface tool) is approved in the page: its APPROVAL_REQUEST
opens an approval row, its APPROVAL_RESPONSE carries the user's decision and
the tool's result. A server tool's call is approved by the page's user, an
operator or both (``agent.server_tools`` waits; this module applies the
decisions as they arrive). A risky page call answered without asking is
refused and audited as a violation. The rows belong to the approvals app,
reached through ``aitp.ports`` by the ``AgentStore``.
"""
from __future__ import annotations

import asyncio
import time

from agent.parts import TurnParts, unknown_call
from aitp import protocol as p
from aitp.calls import APPROVAL_DECISIONS, CallEvent, Party
from aitp.ledger import DECLINED_MESSAGE, DENIED, ERROR, OPERATOR_DECLINED_MESSAGE, SUCCESS, Outcome, PendingCall
from aitp.ports import ApprovalError
from aitp.turn import TurnEvent

MISMATCH_MESSAGE = (
    "The action was not approved: the page asked its user about different arguments than this "
    "call's, so the call was refused."
)
NOT_APPROVED_MESSAGE = (
    "The action was not approved: the page answered without asking the user's approval, "
    "so the result was refused."
)


def declined_message(call: PendingCall) -> str:
    """What the model is told of a refusal: an operator's, or the user's."""
    return OPERATOR_DECLINED_MESSAGE if call.declined_by == "operator" else DECLINED_MESSAGE


class Approvals:
    def __init__(self, parts: TurnParts) -> None:
        self.parts = parts

    async def on_approval_request(self, payload: p.ApprovalRequest) -> p.Message | None:
        call = self.parts.ledger.get(payload.callId)
        if call is None or call.origin == "server":
            return unknown_call(payload.callId)
        return await self.asked(call, payload.toolName, payload.args, payload.message)

    async def asked(
        self, call: PendingCall, tool_name: str, args: dict, message: str
    ) -> p.Message | None:
        """The page asks its user about a call it holds: an APPROVAL_REQUEST,
        or a TOOL_RESULT with status pending_approval (the spec's two ways of
        asking). Both count against the call's one limit of asks; a repeat of
        what was asked already changes nothing -- no audit row, no later
        deadline -- and only an ask for something else goes on (to be
        refused as a mismatch)."""
        if self.parts.limits is not None:
            refused = await self.parts.limits.check_approval_request(call.call_id)
            if refused is not None:
                return refused
        if call.approval_id is not None and (tool_name, args) == (call.name, call.args):
            return None
        return await self.opened(call, tool_name, args, message)

    async def opened(
        self, call: PendingCall, tool_name: str, args: dict, message: str
    ) -> p.Message | None:
        """Open the call's approval row (its first ask, through ``asked``)."""
        parts = self.parts
        asked_at = time.monotonic()  # the page asked: the person's wait starts
        try:
            approval = await parts.store.approval_request_client(
                call, tool_name=tool_name, args=args, message=message,
                timeout=parts.config.approval_timeout,
            )
        except ApprovalError as exc:
            if exc.code == "approval_mismatch":
                # The page wants approval for something other than what the
                # model asked: refuse, and tell the model the call did not
                # happen. An approval asked before for the call's own
                # arguments ends with it (the call's end with its event).
                outcome = Outcome(DENIED, error=MISMATCH_MESSAGE)
                try:
                    if call.approval_id is not None:
                        await parts.store.approval_close(call, "cancelled", outcome)
                finally:
                    call.resolve(outcome)
            return p.error_event(exc.code, exc.message, callId=call.call_id)
        call.approval_id = approval.id
        call.approval_asked_at = asked_at
        call.step(CallEvent.APPROVAL_REQUESTED, by=Party.PAGE)
        call.extend(asyncio.get_running_loop().time() + parts.config.approval_timeout)
        await parts.io.send(TurnEvent.APPROVAL_ASKED)
        return None

    async def on_approval_response(self, payload: p.ApprovalResponse) -> p.Message | None:
        parts = self.parts
        call = parts.ledger.get(payload.callId)
        if call is None:
            return unknown_call(payload.callId)
        if call.approval_id is not None:
            try:
                approval = await parts.store.approval_decide_user(
                    call.approval_id, approved=payload.approved, error=payload.error
                )
            except ApprovalError as exc:
                if call.origin == "server":
                    await self.apply_row(call)
                return p.error_event(exc.code, exc.message, callId=call.call_id)
        elif call.origin == "server":
            return unknown_call(payload.callId)
        elif call.risk.needs_approval:
            return await self.skipped(call, "approval_response_without_request")
        else:
            approval = None
        if call.origin == "server":
            if approval is not None and approval.status == "pending":
                # Approved by the user; an operator still has to decide.
                return None
            await self.apply_row(call)
            return None
        # An interface tool: the response replaces the TOOL_RESULT. A refusal
        # is never a success, whatever else the frame carries.
        if call.approval_asked_at is not None:
            parts.clock.approval_decided("approved" if payload.approved else "denied",
                                         asked_at=call.approval_asked_at)
        if not payload.approved:
            call.declined_by = "user"
            call.resolve(Outcome(DENIED, error=DECLINED_MESSAGE))
            return None
        outcome = (Outcome(ERROR, error=payload.error) if payload.error
                   else Outcome(SUCCESS, result=payload.result))
        try:
            if call.approval_id is not None:
                # The call's end and its executed/failed event, together,
                # whatever happens to the connection this very moment.
                await asyncio.shield(parts.store.approval_executed(call, outcome))
        finally:
            call.resolve(outcome)
        return None

    async def skipped(self, call: PendingCall, reason: str) -> p.Message:
        """A high or critical page call answered with no APPROVAL_REQUEST
        before it: the answer does not count. The call ends as refused, the
        model is told the action was not approved, and the violation is
        audited for the operators' review queue."""
        try:
            approval = await self.parts.store.approval_violation(call, reason=reason)
        except ApprovalError as exc:
            return p.error_event(exc.code, exc.message, callId=call.call_id)
        call.approval_id = approval.id
        call.resolve(Outcome(DENIED, error=NOT_APPROVED_MESSAGE))
        return p.error_event(
            "approval_required",
            f"The tool {call.name} needs the user's approval first (APPROVAL_REQUEST); "
            "the answer was refused.",
            callId=call.call_id,
        )

    async def on_approval_decided(self, approval_id: int) -> None:
        """An operator decided (maybe on another process): re-read the row."""
        call = self.parts.ledger.by_approval(approval_id)
        if call is not None:
            await self.apply_row(call)

    async def apply_row(self, call: PendingCall) -> None:
        """Hand the row's decision, if any, to the server tool waiting on it."""
        status, declined_by = await self.parts.store.approval_decision(call.approval_id)
        if status in APPROVAL_DECISIONS:  # still pending otherwise
            call.declined_by = call.declined_by or declined_by
            call.decide(status)
