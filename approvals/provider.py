"""The approvals app's side of ``aitp.ports.ApprovalDesk``.

Registered in ``ApprovalsConfig.ready()``; the turn and the sweep reach
approvals and server tools only through it. Each method maps to one service
(``approvals.services``) or loader (``approvals.server_tools``); the ToolCall
row is looked up here, by its call id, so the protocol app never hands model
instances across.
"""
from __future__ import annotations

import asyncio

from aitp.models import ToolCall
from approvals import services, webhooks
from approvals.models import Approval
from approvals.server_tools import ServerToolDef, load_server_tools


class ApprovalsProvider:
    def request_client(self, *, call_id, tool_name, args, risk, message, session_id, timeout):
        return services.approval_request_client(
            tool_call=ToolCall.objects.get(call_id=call_id), tool_name=tool_name, args=args,
            risk=risk, message=message, session_id=session_id, timeout=timeout,
        )

    def request_server(self, *, call_id, tool: ServerToolDef, args, session_id, timeout, message):
        return services.approval_request_server(
            tool_call=ToolCall.objects.get(call_id=call_id), tool=tool, args=args,
            session_id=session_id, timeout=timeout, message=message,
        )

    def record_violation(self, *, call_id, session_id, risk, reason):
        return services.approval_record_violation(
            tool_call=ToolCall.objects.get(call_id=call_id), session_id=session_id, risk=risk,
            reason=reason,
        )

    def decide_user(self, *, approval_id, session_id, approved, error):
        return services.approval_decide_user(
            approval_id=approval_id, session_id=session_id, approved=approved, error=error,
        )

    def decision(self, approval_id):
        row = Approval.objects.filter(pk=approval_id).values_list(
            "status", "operator_decision").first()
        if row is None:
            return None
        status, operator_decision = row
        declined_by = ""
        if status == Approval.Status.DENIED:
            declined_by = "operator" if operator_decision == Approval.Decision.DENIED else "user"
        return str(status), declined_by

    def expire(self, *, approval_id, error=None) -> bool:
        return services.call_is_final(services.approval_expire(approval_id=approval_id, error=error))

    def close(self, *, approval_id, status, call_status=None, error=None) -> bool:
        return services.call_is_final(services.approval_close(
            approval_id=approval_id, status=status, call_status=call_status, error=error))

    def record_execution(self, *, approval_id, ok, error="", result=None) -> bool:
        return services.call_is_final(services.approval_record_execution(
            approval_id=approval_id, ok=ok, error=error, result=result))

    def close_of_ended_sessions(self) -> int:
        return services.approvals_close_of_ended_sessions()

    def end_with_sessions(self, *, session_ids, now, reason) -> int:
        return services.approvals_end_with_sessions(session_ids=session_ids, now=now, reason=reason)

    def expire_overdue(self) -> int:
        return services.approval_expire_overdue()

    async def load_server_tools(self, tenant_id: int) -> list[ServerToolDef]:
        return await load_server_tools(tenant_id)


class TenantWebhooksProvider:
    """``aitp.ports.TenantWebhooks``: the alerts' notices, sent as a server
    tool's call is (``approvals.webhooks``). Called from a thread with no
    event loop of its own (a database thread, a command)."""

    def post_notice(self, *, url: str, secret: str, payload: dict) -> None:
        asyncio.run(webhooks.post_notice(url=url, secret=secret, payload=payload))
