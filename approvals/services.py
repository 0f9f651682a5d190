"""Writes for approvals. Each function is one transaction holding the change
and its audit event, so the record of a decision can never disagree with it.

A call that has an approval gets its final status from here, with the event
that ends it: a refusal (denied), a violation, the call's run (executed or
failed, with its result), and every ending the system writes (expired,
cancelled, disconnected) move the ``ToolCall`` row in the event's
transaction, and the event names the status it moved to (``data.call``).
The turn writes behind only the calls that have no approval
(``agent.store``).

Every transaction starts by locking the audit chain head (see
``approvals.audit.lock_chain``): decisions on approvals are therefore
serialised across processes, and of two racing answers the first one wins
and the second sees the approval already decided.

Server tools are declared here too (``server_tool_create``, ``_update``,
``_delete``), by the admin as by anyone: each change is one transaction
holding the row and the ``OperatorAction`` that records who made it.

Async callers wrap each call in one ``database_sync_to_async``.
"""
from __future__ import annotations

import logging
from datetime import timedelta
from typing import TYPE_CHECKING

from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.utils import timezone

from agent.approvals import NOT_APPROVED_MESSAGE
from aitp import alerts, calls, liveness, notify
from aitp.calls import CallEvent, CallStatus
from aitp.ledger import (
    CANCELLED_MESSAGE,
    DECLINED_MESSAGE,
    LEFT_MESSAGE,
    OPERATOR_DECLINED_MESSAGE,
    SERVER_EXPIRED_MESSAGE,
    USER_EXPIRED_MESSAGE,
)
from aitp.models import OperatorAction, Session, ToolCall
from aitp.ports import ApprovalError
from aitp.services import LOST_CALL_ERROR
from aitp.tools import args_hash as compute_args_hash
from approvals.audit import append_event, lock_chain
from approvals.models import Approval, AuditEvent, Policy, ServerTool, higher_risk, policy_parties
from runtime.config import config
from tenants.selectors import may_change_tenant

if TYPE_CHECKING:
    from approvals.server_tools import ServerToolDef

logger = logging.getLogger(__name__)

Action = AuditEvent.Action
ActorKind = AuditEvent.ActorKind
Channel = AuditEvent.Channel
Status = Approval.Status
Decision = Approval.Decision

# Refused: the session's process is known gone (aitp.liveness) or its row
# stopped being refreshed, though the sweep has not closed it yet.
SESSION_LOST = "session_lost"
SESSION_LOST_MESSAGE = (
    "the server process holding the page's session is gone; the call can no longer run"
)


# --- helpers ------------------------------------------------------------------


def _locked_approval(approval_id) -> Approval:
    """The approval row, locked; call after lock_chain() inside a transaction."""
    try:
        pk = int(approval_id)
    except (TypeError, ValueError):
        raise ApprovalError("unknown_call") from None
    approval = (
        Approval.objects.select_for_update().select_related("tool_call").filter(pk=pk).first()
    )
    if approval is None:
        raise ApprovalError("unknown_call")
    return approval


def _audit(approval: Approval, action: str, *, actor_kind: str, actor: str, channel: str,
           data: dict | None = None) -> AuditEvent:
    return append_event(
        tenant_id=approval.tenant_id,
        approval_id=approval.pk,
        session_id=approval.session_id,
        call_id=approval.tool_call.call_id,
        action=action,
        actor_kind=actor_kind,
        actor=actor,
        channel=channel,
        args_hash=approval.args_hash,
        data=data,
    )


def _resolve(approval: Approval, now) -> None:
    """Set the overall status from the parties' decisions: one refusal denies,
    approval needs every required party."""
    decisions = [approval.user_decision, approval.operator_decision]
    if Decision.DENIED in decisions:
        approval.status = Status.DENIED
    elif (not approval.needs_user or approval.user_decision == Decision.APPROVED) and (
        not approval.needs_operator or approval.operator_decision == Decision.APPROVED
    ):
        approval.status = Status.APPROVED
    if approval.status != Status.PENDING:
        approval.decided_at = now


def _move_call(approval: Approval, event: CallEvent, now, *, error: str = "",
               result=None) -> str | None:
    """Move the approval's tool call by ``event`` of the call table
    (``aitp.calls``), in the caller's transaction, when its state allows
    it: a decision and what it does to the call are recorded together, with
    the one audit event; a final status with its ``error`` (or ``result``).
    The status it moved to; None when it had moved on (a final status
    written first is never undone)."""
    sources, target = calls.TRANSITIONS[event]
    call = approval.tool_call
    fields: dict = {"status": target.value}
    if target.is_final:
        fields.update(error=error[:4000], finished_at=now,
                      duration_ms=max(0, int((now - call.created_at).total_seconds() * 1000)))
        if result is not None:
            fields["result"] = result
    moved = ToolCall.objects.filter(
        pk=call.pk, status__in=[state.value for state in sources]
    ).update(**fields)
    if not moved:
        return None
    call.status = target.value
    return target.value


def call_is_final(approval: Approval) -> bool:
    """Whether the approval's call has its final status (as read with the
    approval, or as moved since): the turn then writes none."""
    return approval.tool_call.status in ToolCall.FINAL_STATUSES


def _ending_error(approval: Approval, status: str) -> str:
    """What the model and the call's row are told when an ending the
    system writes ends the call."""
    if status == Status.EXPIRED:
        return USER_EXPIRED_MESSAGE if approval.origin == Approval.Origin.CLIENT else SERVER_EXPIRED_MESSAGE
    if status == Status.DISCONNECTED:
        return LEFT_MESSAGE
    return CANCELLED_MESSAGE


def _with_call(data: dict | None, moved: str | None) -> dict | None:
    """The event's data, naming the status the call moved to with it."""
    return data if moved is None else {**(data or {}), "call": moved}


def _decision_moves_call(approval: Approval, now) -> str | None:
    """What a resolved decision does to its call: a refusal ends it as
    denied (with the words the model is told); an approval lets a server
    tool run. A page's call, approved, ends with the page's own answer."""
    if approval.status == Status.DENIED:
        declined = (OPERATOR_DECLINED_MESSAGE if approval.operator_decision == Decision.DENIED
                    else DECLINED_MESSAGE)
        return _move_call(approval, CallEvent.DENIED, now, error=declined)
    if approval.status == Status.APPROVED and approval.origin == Approval.Origin.SERVER:
        return _move_call(approval, CallEvent.APPROVED, now)
    return None


def _close(approval: Approval, status: str, action: str, now, *, data: dict | None = None,
           moved: str | None = None) -> None:
    approval.status = status
    approval.decided_at = now
    approval.save(update_fields=["status", "decided_at"])
    _audit(approval, action, actor_kind=ActorKind.SYSTEM, actor="system", channel=Channel.SYSTEM,
           data=_with_call(data, moved))


def _is_overdue(approval: Approval, now) -> bool:
    return now > approval.deadline


def _why_call_cannot_run(approval: Approval, now) -> ApprovalError | None:
    """Why nothing would ever run the call now, if so: its session has ended,
    or it has not ended yet but the server process holding it is known gone
    (``aitp.liveness``) or stopped refreshing the session's row for three
    heartbeats. Those the sweep would close; a decision must not wait for it.
    One query for the session (and one for its process, when it names one)."""
    row = Session.objects.filter(pk=approval.session_id).values_list(
        "ended_at", "process", "last_seen_at").first()
    if row is None or row[0] is not None:
        return ApprovalError("session_ended")
    _, process, last_seen_at = row
    stale_before = now - timedelta(seconds=3 * config().store.heartbeat_interval)
    if last_seen_at < stale_before or (process and liveness.gone_ids({process}, now=now)):
        return ApprovalError(SESSION_LOST, SESSION_LOST_MESSAGE)
    return None


def _expire(approval: Approval, now, *, error: str | None = None, data: dict | None = None) -> None:
    """Close the pending approval as expired, its call with it."""
    moved = _move_call(approval, CallEvent.EXPIRED, now,
                       error=_ending_error(approval, Status.EXPIRED) if error is None else error)
    _close(approval, Status.EXPIRED, Action.EXPIRED, now, data=data, moved=moved)


def _close_for_ended_session(approval: Approval, now, *, reason: str = "session ended") -> None:
    """Close the approval, and end its call, as the sweep does for a session
    whose process is gone."""
    moved = _move_call(approval, CallEvent.DISCONNECTED, now, error=LOST_CALL_ERROR)
    _close(approval, Status.DISCONNECTED, Action.DISCONNECTED, now, data={"reason": reason},
           moved=moved)


def _end_approved_call(approval: Approval, event: CallEvent, action: str, now, *, error: str,
                       data: dict | None = None) -> bool:
    """End the call of an approved approval that has not ended yet (a
    server tool cut while it ran, a session that ended before the call's
    run was recorded), with an event of the approval: the decision stands.
    False when the call had ended."""
    moved = _move_call(approval, event, now, error=error)
    if moved is None:
        return False
    _audit(approval, action, actor_kind=ActorKind.SYSTEM, actor="system", channel=Channel.SYSTEM,
           data=_with_call(data, moved))
    return True


def _end_with_session(approval: Approval, now, *, reason: str) -> bool:
    """An approval whose session ended: pending, it closes as disconnected;
    approved, its call still open ends disconnected; each with its event.
    True when a pending approval was closed."""
    if approval.status == Status.PENDING:
        _close_for_ended_session(approval, now, reason=reason)
        return True
    if approval.status == Status.APPROVED:
        _end_approved_call(approval, CallEvent.DISCONNECTED, Action.DISCONNECTED, now,
                           error=LOST_CALL_ERROR, data={"reason": reason})
    return False


def _still_ending_a_call(approvals) -> list[int]:
    """The approvals among these that may still end a call: pending, or
    approved with the call still open."""
    open_statuses = [state.value for state in calls.OPEN]
    return list(approvals.filter(
        status__in=[Status.PENDING, Status.APPROVED], tool_call__status__in=open_statuses,
    ).values_list("pk", flat=True))


def _close_for_refusal(approval: Approval, now, refusal: ApprovalError) -> None:
    reason = "session ended" if refusal.code == "session_ended" else "server process gone"
    _close_for_ended_session(approval, now, reason=reason)


def _as_javascript_sees_it(value):
    """The value after a JSON round trip through a page: JavaScript has one
    number type, so a model's 2.0 comes back as 2. Compared this way, such an
    echo is not mistaken for different arguments."""
    if isinstance(value, float) and value.is_integer() and abs(value) <= 2**53:
        return int(value)
    if isinstance(value, dict):
        return {k: _as_javascript_sees_it(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_as_javascript_sees_it(v) for v in value]
    return value


def _same_call(name_a: str, args_a: dict, name_b: str, args_b: dict) -> bool:
    return compute_args_hash(name_a, _as_javascript_sees_it(args_a)) == compute_args_hash(
        name_b, _as_javascript_sees_it(args_b)
    )


def _tool_facts(tool: ServerTool | ServerToolDef) -> tuple[str, str, str]:
    """(name, risk, policy) of a ServerTool row or a loaded ServerToolDef."""
    if isinstance(tool, ServerTool):
        return tool.name, tool.risk, tool.approval_policy
    risk = tool.spec.risk
    return tool.spec.name, str(getattr(risk, "value", risk)), tool.policy


def _request(*, tool_call: ToolCall, tool_name: str, args: dict, risk: str, message: str,
             session_id: str, timeout: float, origin: str, policy: str) -> Approval:
    """Shared by both directions: open an approval for a call, or extend the open one."""
    requested_hash = compute_args_hash(tool_name, args)
    if origin == Approval.Origin.CLIENT:
        actor_kind, actor, channel = ActorKind.PAGE, session_id, Channel.PAGE
    else:
        actor_kind, actor, channel = ActorKind.SYSTEM, "agent", Channel.SYSTEM
    mismatch = False
    with transaction.atomic():
        lock_chain()
        now = timezone.now()
        call = ToolCall.objects.select_for_update().filter(pk=tool_call.pk).first()
        # Only the session that holds the call may ask, and only while the call is open.
        if call is None or call.session_id != session_id or call.origin != origin:
            raise ApprovalError("unknown_call")
        existing = Approval.objects.select_for_update().select_related("tool_call").filter(
            tool_call=call
        ).first()
        expected_hash = compute_args_hash(call.name, call.arguments)
        if not _same_call(tool_name, args, call.name, call.arguments):
            # Recorded and committed: a page asking approval for arguments other
            # than those the call carries is worth an operator's look.
            append_event(
                tenant_id=call.session.tenant_id,
                approval_id=existing.pk if existing else None,
                session_id=session_id,
                call_id=call.call_id,
                action=Action.MISMATCH,
                actor_kind=actor_kind,
                actor=actor,
                channel=channel,
                args_hash=requested_hash,
                data={"expected_args_hash": expected_hash, "tool": tool_name[:64]},
            )
            mismatch = True
        elif existing is not None:
            if existing.status != Status.PENDING:
                raise ApprovalError("already_decided")
            existing.deadline = max(existing.deadline, now + timedelta(seconds=timeout))
            existing.save(update_fields=["deadline"])
            _audit(existing, Action.EXTENDED, actor_kind=actor_kind, actor=actor, channel=channel,
                   data={"deadline": existing.deadline.isoformat()})
            return existing
        elif call.status in ToolCall.FINAL_STATUSES:
            raise ApprovalError("unknown_call")
        else:
            needs_user, needs_operator = policy_parties(policy)
            approval = Approval.objects.create(
                tenant_id=call.session.tenant_id,
                session_id=session_id,
                tool_call=call,
                tool_name=call.name,
                arguments=call.arguments,
                args_hash=expected_hash,
                risk=higher_risk(risk, call.risk),
                origin=origin,
                policy=policy,
                message=message,
                needs_user=needs_user,
                needs_operator=needs_operator,
                deadline=now + timedelta(seconds=timeout),
                created_at=now,
            )
            # The call table's move (aitp.calls): pending or sent -> awaiting approval.
            ToolCall.objects.filter(
                pk=call.pk, status__in=[s.value for s in calls.sources(CallStatus.AWAITING_APPROVAL)]
            ).update(status=CallStatus.AWAITING_APPROVAL.value)
            _audit(approval, Action.REQUESTED, actor_kind=actor_kind, actor=actor, channel=channel,
                   data={"policy": policy, "risk": approval.risk})
            if needs_operator:
                _tell_tenant_approval_waits(approval)
            return approval
    if mismatch:
        logger.warning("session %s: approval arguments differ from call %s", session_id,
                       tool_call.call_id)
        raise ApprovalError("approval_mismatch")
    raise AssertionError("unreachable")


def _tell_tenant_approval_waits(approval: Approval) -> None:
    """The tenant's alert (``aitp.alerts``), once the approval is committed,
    on a thread of its own: the turn never waits for the mail server or the
    webhook."""
    facts = (approval.tenant_id, approval.session_id, approval.pk, approval.tool_name, approval.risk,
             approval.deadline)
    transaction.on_commit(lambda: alerts.send_in_background(alerts.approval_waiting, *facts), robust=True)


# --- requests -----------------------------------------------------------------


def approval_request_client(*, tool_call: ToolCall, tool_name: str, args: dict, risk: str,
                            message: str, session_id: str, timeout: float) -> Approval:
    """The page asks approval for an interface call it holds (its APPROVAL_REQUEST).
    A second request for the same call extends the pending approval's deadline."""
    return _request(
        tool_call=tool_call, tool_name=tool_name, args=args, risk=risk, message=message,
        session_id=session_id, timeout=timeout, origin=Approval.Origin.CLIENT,
        policy=Policy.USER,
    )


def approval_request_server(*, tool_call: ToolCall, tool: ServerTool | ServerToolDef, args: dict,
                            session_id: str, timeout: float, message: str = "") -> Approval:
    """The agent wants to run a risky server tool: open an approval with the tool's policy."""
    name, risk, policy = _tool_facts(tool)
    return _request(
        tool_call=tool_call, tool_name=name, args=args, risk=risk,
        message=message or f"Allow {name} to run? (risk: {risk})",
        session_id=session_id, timeout=timeout, origin=Approval.Origin.SERVER, policy=policy,
    )


def approval_record_violation(*, tool_call: ToolCall, session_id: str, risk: str,
                              reason: str) -> Approval:
    """The page answered a high or critical call without asking its user
    (a TOOL_RESULT, or an APPROVAL_RESPONSE with no APPROVAL_REQUEST before
    it). The answer does not count: the call gets an approval row closed as
    a violation, audited, so it reaches the operators' review queue."""
    with transaction.atomic():
        lock_chain()
        now = timezone.now()
        call = ToolCall.objects.select_for_update().filter(pk=tool_call.pk).first()
        if call is None or call.session_id != session_id or call.origin != Approval.Origin.CLIENT:
            raise ApprovalError("unknown_call")
        if Approval.objects.filter(tool_call=call).exists():
            # The call has an approval: the page did ask, so this is no violation.
            raise ApprovalError("already_decided")
        approval = Approval.objects.create(
            tenant_id=call.session.tenant_id,
            session_id=session_id,
            tool_call=call,
            tool_name=call.name,
            arguments=call.arguments,
            args_hash=compute_args_hash(call.name, call.arguments),
            risk=higher_risk(risk, call.risk),
            origin=Approval.Origin.CLIENT,
            policy=Policy.USER,
            message="",
            status=Status.VIOLATION,
            deadline=now,
            created_at=now,
            decided_at=now,
        )
        approval.tool_call = call
        moved = _move_call(approval, CallEvent.DENIED, now, error=NOT_APPROVED_MESSAGE)
        _audit(approval, Action.VIOLATION, actor_kind=ActorKind.PAGE, actor=session_id,
               channel=Channel.PAGE, data=_with_call({"reason": reason, "risk": approval.risk}, moved))
    logger.warning("session %s: call %s answered without approval (%s)", session_id,
                   call.call_id, reason)
    return approval


# --- decisions ----------------------------------------------------------------


def approval_decide_user(*, approval_id, session_id: str, approved: bool,
                         error: str | None = None) -> Approval:
    """The page user's answer (APPROVAL_RESPONSE). Only the session holding the
    call may answer, once, before the deadline, while its session lasts and
    its process lives."""
    expired = False
    with transaction.atomic():
        lock_chain()
        now = timezone.now()
        approval = _locked_approval(approval_id)
        if approval.session_id != session_id or not approval.needs_user:
            raise ApprovalError("not_allowed")
        if approval.status != Status.PENDING or approval.user_decision is not None:
            raise ApprovalError("already_decided")
        refusal = _why_call_cannot_run(approval, now)
        if refusal is not None:
            _close_for_refusal(approval, now, refusal)
        elif _is_overdue(approval, now):
            _expire(approval, now, data={"late": "user"})
            expired = True
        else:
            approval.user_decision = Decision.APPROVED if approved else Decision.DENIED
            approval.user_decided_at = now
            _resolve(approval, now)
            approval.save(update_fields=["user_decision", "user_decided_at", "status", "decided_at"])
            data = {"party": "user", "status": approval.status}
            if error:
                data["error"] = error
            _audit(approval, Action.APPROVED if approved else Action.DENIED,
                   actor_kind=ActorKind.PAGE, actor=session_id, channel=Channel.PAGE,
                   data=_with_call(data, _decision_moves_call(approval, now)))
    if refusal is not None:
        raise refusal
    if expired:
        raise ApprovalError("already_decided", "approval expired")
    return approval


def approval_decide_operator(*, approval_id, user, approved: bool, note: str = "",
                             channel: str = "admin") -> Approval:
    """An operator's decision, from the admin or the console. The process
    holding the session is told to re-read the approval after commit. An
    approval whose session has ended, or whose session's process is gone,
    is closed instead, never approved: nothing would run the call."""
    expired = False
    with transaction.atomic():
        lock_chain()
        now = timezone.now()
        approval = _locked_approval(approval_id)
        # Owners of the tenant (or superusers): a viewer decides nothing.
        if not may_change_tenant(user, approval.tenant_id):
            raise ApprovalError("not_allowed")
        if not approval.needs_operator:
            raise ApprovalError("not_allowed", "this approval is for the page user")
        if approval.status != Status.PENDING or approval.operator_decision is not None:
            raise ApprovalError("already_decided")
        refusal = _why_call_cannot_run(approval, now)
        if refusal is not None:
            _close_for_refusal(approval, now, refusal)
        elif _is_overdue(approval, now):
            _expire(approval, now, data={"late": "operator"})
            expired = True
        else:
            approval.operator_decision = Decision.APPROVED if approved else Decision.DENIED
            approval.operator = user
            approval.operator_note = note
            approval.operator_decided_at = now
            _resolve(approval, now)
            approval.save(update_fields=[
                "operator_decision", "operator", "operator_note", "operator_decided_at",
                "status", "decided_at",
            ])
            data = {"party": "operator", "status": approval.status}
            if note:
                data["note"] = note
            _audit(approval, Action.APPROVED if approved else Action.DENIED,
                   actor_kind=ActorKind.OPERATOR, actor=user.get_username(), channel=channel,
                   data=_with_call(data, _decision_moves_call(approval, now)))
            OperatorAction.objects.create(
                session_id=approval.session_id, tenant_id=approval.tenant_id, user=user,
                action="approval_approved" if approved else "approval_denied",
                data={"approval_id": approval.pk, "tool": approval.tool_name, "note": note[:500]},
            )
        session_id, pk = approval.session_id, approval.pk
        transaction.on_commit(
            lambda: notify.session_command(session_id, "approval_decided", approval_id=pk),
            robust=True,
        )
    if refusal is not None:
        if refusal.code == SESSION_LOST:
            logger.warning("session %s: operator decision on approval %s refused: its server "
                           "process is gone", approval.session_id, approval.pk)
        raise refusal
    if expired:
        raise ApprovalError("already_decided", "approval expired")
    logger.info("session %s: operator %s %s approval %s", approval.session_id,
                user.get_username(), "approved" if approved else "denied", approval.pk)
    return approval


# --- endings ------------------------------------------------------------------


def approval_expire(*, approval_id, error: str | None = None) -> Approval:
    """The waiting side gave up: a pending approval becomes expired, and its
    call with it (``error``: what the model is told, by default the words
    of an expiry). Idempotent; the caller's timer decides when, so an
    approval the agent stopped waiting for can never be approved afterwards."""
    with transaction.atomic():
        lock_chain()
        approval = _locked_approval(approval_id)
        if approval.status == Status.PENDING:
            _expire(approval, timezone.now(), error=error)
    return approval


def approval_expire_overdue() -> int:
    """Expire every pending approval past its deadline (those whose session's
    process died before its timer fired). Returns how many."""
    now = timezone.now()
    overdue = list(
        Approval.objects.filter(status=Status.PENDING, deadline__lt=now).values_list("pk", flat=True)
    )
    expired = 0
    for pk in overdue:
        with transaction.atomic():
            lock_chain()
            approval = _locked_approval(pk)
            if approval.status == Status.PENDING and _is_overdue(approval, timezone.now()):
                _expire(approval, timezone.now())
                expired += 1
    return expired


def approvals_close_of_ended_sessions() -> int:
    """Close every pending approval whose session has ended (its process
    died or stopped before the turn could close it), each with its call and
    its audit event; an approved one whose call never recorded its end
    ends that call as disconnected, with an event. Returns how many
    approvals closed."""
    stranded = _still_ending_a_call(Approval.objects.filter(session__ended_at__isnull=False))
    closed = 0
    for pk in stranded:
        with transaction.atomic():
            lock_chain()
            closed += _end_with_session(_locked_approval(pk), timezone.now(), reason="session ended")
    return closed


def approvals_end_with_sessions(*, session_ids, now, reason: str) -> int:
    """In the caller's transaction, the one that ends these sessions' rows:
    end their approvals' open calls with their events (a pending approval
    closes as disconnected, an approved one keeps its decision), before
    the caller disconnects the calls left. Returns how many approvals
    closed."""
    ending = _still_ending_a_call(Approval.objects.filter(session_id__in=list(session_ids)))
    if not ending:
        return 0
    closed = 0
    with transaction.atomic():
        lock_chain()
        for pk in ending:
            closed += _end_with_session(_locked_approval(pk), now, reason=reason)
    return closed


def approval_close(*, approval_id, status: str, call_status: str | None = None,
                   error: str | None = None) -> Approval:
    """End a pending approval because the turn was cancelled or the page went
    away, and its call with it: as ``call_status`` (by default the
    approval's own ``status``; a page that asked about other arguments
    ends its call denied) with ``error``, what the model is told. An
    approved call that has not ended yet (a server tool cut while it ran)
    ends too, with the event; its decision stands."""
    if status not in (Status.CANCELLED, Status.DISCONNECTED):
        raise ValueError(f"cannot close an approval as {status!r}")
    action = Action.CANCELLED if status == Status.CANCELLED else Action.DISCONNECTED
    event = calls.ENDED_BY[CallStatus(call_status or status)]
    with transaction.atomic():
        lock_chain()
        approval = _locked_approval(approval_id)
        now = timezone.now()
        error = _ending_error(approval, status) if error is None else error
        if approval.status == Status.PENDING:
            moved = _move_call(approval, event, now, error=error)
            _close(approval, status, action, now, moved=moved)
        elif approval.status == Status.APPROVED:
            _end_approved_call(approval, event, action, now, error=error)
    return approval


def approval_record_execution(*, approval_id, ok: bool, error: str = "", result=None) -> Approval:
    """Record that the approved tool ran (executed) or failed, and end its
    call with it: success with its ``result``, or error with ``error``."""
    with transaction.atomic():
        lock_chain()
        approval = _locked_approval(approval_id)
        if approval.status != Status.APPROVED:
            raise ApprovalError("not_allowed", "approval was not approved")
        moved = _move_call(approval, CallEvent.SUCCEEDED if ok else CallEvent.FAILED,
                           timezone.now(), error=error, result=result if ok else None)
        _audit(approval, Action.EXECUTED if ok else Action.FAILED, actor_kind=ActorKind.SYSTEM,
               actor="system", channel=Channel.SYSTEM,
               data=_with_call({"error": error} if error else None, moved))
    return approval


# --- review -------------------------------------------------------------------


def approval_review(*, approval_id, user, verdict: str, note: str = "",
                    channel: str = "admin") -> Approval:
    """An operator looks back at a decided approval and records a verdict."""
    if verdict not in (Approval.Verdict.OK, Approval.Verdict.CONCERN):
        raise ValueError(f"unknown review verdict {verdict!r}")
    with transaction.atomic():
        lock_chain()
        approval = _locked_approval(approval_id)
        if not may_change_tenant(user, approval.tenant_id):
            raise ApprovalError("not_allowed")
        if approval.status == Status.PENDING:
            raise ApprovalError("not_allowed", "a pending approval cannot be reviewed")
        approval.review_status = Approval.ReviewStatus.REVIEWED
        approval.review_verdict = verdict
        approval.review_note = note
        approval.reviewed_by = user
        approval.reviewed_at = timezone.now()
        approval.save(update_fields=[
            "review_status", "review_verdict", "review_note", "reviewed_by", "reviewed_at",
        ])
        data = {"verdict": verdict}
        if note:
            data["note"] = note
        _audit(approval, Action.REVIEWED, actor_kind=ActorKind.OPERATOR,
               actor=user.get_username(), channel=channel, data=data)
    return approval


# --- server tools -------------------------------------------------------------

# What an owner sets on a server tool, in the admin or anywhere else. The
# webhook secret is made with the row and never set here; a tool stays with
# the tenant it was made for.
SERVER_TOOL_FIELDS = ("name", "description", "kind", "webhook_url", "timeout_seconds",
                      "python_handler", "parameters", "risk", "approval_policy", "enabled",
                      "webhook_networks")
# What a tool's webhook may reach inside the server's network: set by
# superusers only (a tenant must not open that network to itself).
SUPERUSER_TOOL_FIELDS = ("webhook_networks",)
# Recorded with their values; the description and the parameters by name
# only (they may be long).
_TOOL_FIELDS_RECORDED = ("name", "kind", "webhook_url", "timeout_seconds", "python_handler",
                         "risk", "approval_policy", "enabled", "webhook_networks")


def _check_tool_fields(fields: dict) -> None:
    unknown = set(fields) - set(SERVER_TOOL_FIELDS)
    if unknown:
        raise ValueError(f"not a server tool field: {', '.join(sorted(unknown))}")


def _check_tool_owner(user, tenant_id: int) -> None:
    # Owners of the tenant (or superusers): a viewer changes no tool.
    if not may_change_tenant(user, tenant_id):
        raise PermissionDenied("only the tenant's owners change its server tools")


def _check_superuser_fields(user, fields: dict) -> None:
    if not user.is_superuser and any(fields.get(field) for field in SUPERUSER_TOOL_FIELDS):
        raise PermissionDenied("only superusers open networks to a webhook")


def _tool_record(tool: ServerTool, fields) -> dict:
    data: dict = {"tool": tool.name, "fields": sorted(fields)}
    for field in _TOOL_FIELDS_RECORDED:
        if field in fields:
            data[field] = getattr(tool, field)
    return data


def server_tool_create(*, tenant, by, fields: dict) -> ServerTool:
    """Declare a tenant's server tool, recording who did. The row gets a new
    webhook secret, which the caller shows once. Raises ``ValidationError``
    for what the model refuses (a webhook without a url, an unknown handler,
    a schema that does not convert, a name the tenant already uses)."""
    _check_tool_fields(fields)
    _check_tool_owner(by, tenant.pk)
    _check_superuser_fields(by, fields)
    tool = ServerTool(tenant=tenant, **fields)
    tool.full_clean()
    with transaction.atomic():
        tool.save(force_insert=True)
        OperatorAction.objects.create(
            tenant=tenant, user=by, action="server_tool_created",
            data=_tool_record(tool, [field for field in SERVER_TOOL_FIELDS if field in fields]),
        )
    logger.info("server tool created tenant=%s tool=%s user=%s", tenant.pk, tool.name, by.pk)
    return tool


def server_tool_update(*, tool: ServerTool, by, changes: dict) -> ServerTool:
    """Change a server tool's fields, recording who did and what changed
    (under the name it had before). Values equal to the stored ones are no
    change; with none left, nothing is written or recorded. Sessions opened
    from now on load the new declaration."""
    _check_tool_fields(changes)
    with transaction.atomic():
        current = ServerTool.objects.select_for_update().filter(pk=tool.pk).first()
        if current is None:
            raise ServerTool.DoesNotExist(f"no server tool #{tool.pk}")
        _check_tool_owner(by, current.tenant_id)
        changed = {field: value for field, value in changes.items() if getattr(current, field) != value}
        if not changed:
            return current
        _check_superuser_fields(by, changed)
        before = current.name
        for field, value in changed.items():
            setattr(current, field, value)
        current.full_clean()
        current.save(update_fields=list(changed))
        data = _tool_record(current, changed)
        data["tool"] = before
        OperatorAction.objects.create(
            tenant_id=current.tenant_id, user=by, action="server_tool_updated", data=data,
        )
    logger.info("server tool changed tenant=%s tool=%s user=%s fields=%s", current.tenant_id,
                current.name, by.pk, ",".join(sorted(changed)))
    return current


def server_tool_delete(*, tool: ServerTool, by) -> None:
    """Remove a server tool, recording who did. Its past calls, approvals and
    audit events keep the tool's name, not the row, and stay."""
    with transaction.atomic():
        current = ServerTool.objects.select_for_update().filter(pk=tool.pk).first()
        if current is None:
            return  # already removed by someone else
        _check_tool_owner(by, current.tenant_id)
        OperatorAction.objects.create(
            tenant_id=current.tenant_id, user=by, action="server_tool_deleted",
            data={"tool": current.name, "kind": current.kind},
        )
        current.delete()
    logger.info("server tool removed tenant=%s tool=%s user=%s", tool.tenant_id, tool.name, by.pk)
