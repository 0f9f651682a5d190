"""Where the agent turn writes: the conversation, the ledger, usage, approvals.

Each method is one ``database_sync_to_async`` call into a service, so the
turn never touches the ORM from the event loop.
"""
from __future__ import annotations

from channels.db import database_sync_to_async

from aitp import services
from aitp.ledger import Outcome, PendingCall
from aitp.llm.base import Usage


class AgentStore:
    def __init__(self, *, session_id: str, tenant_id: int) -> None:
        self.session_id = session_id
        self.tenant_id = tenant_id

    async def checkpoint(self, *, turn: int, messages: list[dict], calls: list[PendingCall] = (),
                         usage: Usage | None = None, turns: int = 0) -> None:
        """One database round trip for what the turn produced since the last one."""
        await database_sync_to_async(services.turn_checkpoint)(
            session_id=self.session_id,
            tenant_id=self.tenant_id,
            turn=turn,
            messages=messages,
            calls=[
                {
                    "call_id": call.call_id,
                    "tool_use_id": call.tool_use_id,
                    "name": call.name,
                    "arguments": call.args,
                    "risk": call.risk.value,
                    "origin": call.origin,
                }
                for call in calls
            ],
            usage=None if usage is None else {
                "turns": turns,
                "input_tokens": usage.input_tokens,
                "output_tokens": usage.output_tokens,
                "cache_read_tokens": usage.cache_read_tokens,
                "cache_write_tokens": usage.cache_write_tokens,
            },
        )

    async def mark_call(self, call: PendingCall, status: str, *, sent: bool = False) -> None:
        await database_sync_to_async(services.tool_call_mark)(
            call_id=call.call_id, status=status, sent=sent,
            risk=call.risk.value, origin=call.origin,
        )

    async def finish_call(self, call: PendingCall, outcome: Outcome) -> None:
        await database_sync_to_async(services.tool_call_finish)(
            call_id=call.call_id, status=outcome.status, result=outcome.result,
            error=outcome.error, risk=call.risk.value, origin=call.origin,
        )

    # --- approvals (the approvals app owns these rows) -------------------------

    async def approval_request_client(self, call: PendingCall, *, tool_name: str, args: dict,
                                      message: str, timeout: float):
        from approvals import services as approvals

        return await database_sync_to_async(_approval_request_client)(
            approvals, call.call_id, tool_name, args, call.risk.value, message,
            self.session_id, timeout,
        )

    async def approval_request_server(self, call: PendingCall, tool, *, timeout: float,
                                      message: str):
        from approvals import services as approvals

        return await database_sync_to_async(_approval_request_server)(
            approvals, call, tool, self.session_id, timeout, message
        )

    async def approval_violation(self, call: PendingCall, *, reason: str):
        from approvals import services as approvals

        return await database_sync_to_async(_approval_violation)(
            approvals, call.call_id, call.risk.value, self.session_id, reason
        )

    async def approval_decide_user(self, approval_id: int, *, approved: bool, error: str | None):
        from approvals import services as approvals

        return await database_sync_to_async(approvals.approval_decide_user)(
            approval_id=approval_id, session_id=self.session_id, approved=approved, error=error
        )

    async def approval_status(self, approval_id: int) -> str:
        from approvals.models import Approval

        approval = await Approval.objects.filter(pk=approval_id).only("status").afirst()
        return approval.status if approval is not None else "cancelled"

    async def approval_expire(self, approval_id: int) -> None:
        from approvals import services as approvals

        await database_sync_to_async(approvals.approval_expire)(approval_id=approval_id)

    async def approval_close(self, approval_id: int, status: str) -> None:
        from approvals import services as approvals

        await database_sync_to_async(approvals.approval_close)(approval_id=approval_id, status=status)

    async def approval_executed(self, approval_id: int, *, ok: bool, error: str = "") -> None:
        from approvals import services as approvals

        await database_sync_to_async(approvals.approval_record_execution)(
            approval_id=approval_id, ok=ok, error=error
        )


def _approval_request_client(approvals, call_id, tool_name, args, risk, message, session_id, timeout):
    from aitp.models import ToolCall

    tool_call = ToolCall.objects.get(call_id=call_id)
    return approvals.approval_request_client(
        tool_call=tool_call, tool_name=tool_name, args=args, risk=risk,
        message=message, session_id=session_id, timeout=timeout,
    )


def _approval_request_server(approvals, call, tool, session_id, timeout, message):
    from aitp.models import ToolCall

    tool_call = ToolCall.objects.get(call_id=call.call_id)
    return approvals.approval_request_server(
        tool_call=tool_call, tool=tool, args=call.args, session_id=session_id,
        timeout=timeout, message=message,
    )


def _approval_violation(approvals, call_id, risk, session_id, reason):
    from aitp.models import ToolCall

    tool_call = ToolCall.objects.get(call_id=call_id)
    return approvals.approval_record_violation(
        tool_call=tool_call, session_id=session_id, risk=risk, reason=reason,
    )
