"""Reads for the live pages and the watch socket.

Every read starts from ``visible_sessions(user)``: a session of a tenant the
user is not a member of does not exist as far as these pages are concerned.
"""
from __future__ import annotations

from datetime import datetime

from django.contrib.auth import get_user_model
from django.db.models import BooleanField, CharField, Count, ExpressionWrapper, Q, QuerySet, Value
from django.urls import reverse
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from aitp.ledger import OPERATOR_CALL
from aitp.models import OperatorAction, Session
from aitp.selectors import session_conversation
from aitp.store.admission import live_sessions_filter
from aitp.transcript import conversation_rows, pretty_json
from approvals.models import Approval, AuditEvent
from approvals.selectors import awaiting_operator
from tenants.selectors import scope_to_user, tenant_ids_for_user


def is_watcher(user) -> bool:
    """Who may open the live pages and the watch socket: active staff. What
    each one sees is then limited to the tenants they are members of."""
    return bool(user.is_authenticated and user.is_active and user.is_staff)


def visible_sessions(user, now: datetime | None = None) -> QuerySet[Session]:
    """Sessions of the user's tenants, each annotated with ``live_now``."""
    live = ExpressionWrapper(Q(**live_sessions_filter(now or timezone.now())),
                             output_field=BooleanField())
    queryset = Session.objects.select_related("tenant", "api_key").annotate(live_now=live)
    return scope_to_user(queryset, user)


def live_sessions(user, now: datetime | None = None) -> QuerySet[Session]:
    """Sessions open right now on a process still alive, newest first."""
    now = now or timezone.now()
    return visible_sessions(user, now).filter(**live_sessions_filter(now)).order_by("-started_at")


def _iso(moment: datetime | None) -> str | None:
    return moment.isoformat() if moment is not None else None


def session_row(session: Session) -> dict:
    """One session as the live list shows it (JSON-ready). ``session`` comes
    from ``visible_sessions``, which sets ``live_now``."""
    return {
        "id": session.id,
        "tenant": session.tenant.slug,
        "tenant_name": session.tenant.name,
        "key": session.api_key.name or f"{session.api_key.prefix}…",
        "key_prefix": session.api_key.prefix,
        "origin": session.origin,
        "url": session.current_url,
        "title": session.title,
        "state": session.state,
        "state_label": session.get_state_display(),
        "started_at": _iso(session.started_at),
        "last_activity_at": _iso(session.last_activity_at),
        "last_seen_at": _iso(session.last_seen_at),
        "ended_at": _iso(session.ended_at),
        "close_code": session.close_code,
        "turns": session.turns,
        "input_tokens": session.input_tokens,
        "output_tokens": session.output_tokens,
        "total_tokens": session.total_tokens,
        # The operator answering in the agent's place (operators.handover): "" while the agent answers.
        "operator_name": session.operator_name,
        "taken_over_at": _iso(session.taken_over_at),
        # The agent asked for a person and none has taken the chat over yet: None otherwise.
        "handoff_requested_at": _iso(session.handoff_requested_at),
        "handoff_reason": session.handoff_reason,
        "live": bool(getattr(session, "live_now", session.is_live)),
        "detail_url": reverse("operators:live_session", args=[session.id]),
    }


def live_session_rows(user) -> list[dict]:
    return [session_row(session) for session in live_sessions(user)]


def _counted(queryset: QuerySet, name: str) -> QuerySet:
    """``(name, how many rows)``: always one row, zero included, so two of
    them are read together in one query (a UNION ALL)."""
    return (queryset.order_by().annotate(kind=Value(name, output_field=CharField()))
            .values("kind").annotate(rows=Count("pk")).values_list("kind", "rows"))


def alert_counts(user, now: datetime | None = None) -> dict[str, int]:
    """What waits for a person in the tenants the user may see (viewers
    included: they see what waits, even if they cannot act on it).

    ``waiting``: live sessions whose agent asked for a person that no
    operator has taken over yet. ``approvals``: approvals waiting for an
    operator's decision, as the pending approvals queue lists them. One
    query for the user's tenants (none for a superuser), one for both counts."""
    now = now or timezone.now()
    waiting = Session.objects.filter(
        **live_sessions_filter(now), handoff_requested_at__isnull=False, operator__isnull=True)
    approvals = awaiting_operator(Approval.objects.all())
    tenant_ids = tenant_ids_for_user(user)
    if tenant_ids is not None:
        if not tenant_ids:
            return {"waiting": 0, "approvals": 0}
        waiting = waiting.filter(tenant_id__in=tenant_ids)
        approvals = approvals.filter(tenant_id__in=tenant_ids)
    counts = dict(_counted(waiting, "waiting").union(_counted(approvals, "approvals"), all=True))
    return {"waiting": counts["waiting"], "approvals": counts["approvals"]}


def watcher(user_id: int):
    """The user behind a watch socket, read again: a user who lost staff
    status or was deactivated since connecting sees nothing more."""
    user = get_user_model().objects.filter(pk=user_id).first()
    return user if user is not None and is_watcher(user) else None


def watched_session_row(*, user_id: int, session_id: str) -> dict | None:
    """The row a watcher is sent when a session changed; None when the user
    may not see it (any more) or it does not exist."""
    user = watcher(user_id)
    if user is None:
        return None
    session = visible_sessions(user).filter(pk=session_id).first()
    return session_row(session) if session is not None else None


def watcher_live_rows(*, user_id: int) -> list[dict] | None:
    """The whole live list for a watch socket; None when the user may not watch."""
    user = watcher(user_id)
    return None if user is None else live_session_rows(user)


# --- the session page ------------------------------------------------------------


def _tool_calls(session: Session) -> list[dict]:
    calls = []
    for call in session.tool_calls.order_by("created_at", "pk"):
        # An error says more than whatever result came with it.
        outcome = call.error or pretty_json(call.result)
        calls.append({"call": call, "arguments": pretty_json(call.arguments), "outcome": outcome,
                      "by_operator": call.tool_use_id.startswith(OPERATOR_CALL)})
    return calls


def _approvals(session: Session) -> list[dict]:
    approvals = list(
        Approval.objects.filter(session=session).select_related("tool_call", "operator")
        .order_by("created_at", "pk")
    )
    events: dict[int, list[AuditEvent]] = {}
    for event in AuditEvent.objects.filter(approval_id__in=[a.pk for a in approvals]).order_by("seq"):
        events.setdefault(event.approval_id, []).append(event)
    return [
        {
            "approval": approval,
            "arguments": pretty_json(approval.arguments),
            "events": events.get(approval.pk, []),
            "can_decide": (approval.is_pending and approval.needs_operator
                           and approval.operator_decision is None),
        }
        for approval in approvals
    ]


def _page_history(session: Session) -> list[dict]:
    """Pages the session went through, latest first."""
    pages = []
    for entry in reversed(session.page_history or []):
        if not isinstance(entry, dict):
            continue
        at = entry.get("at")
        pages.append({
            "url": str(entry.get("url", "")), "title": str(entry.get("title", "")),
            "at": parse_datetime(at) if isinstance(at, str) else None,
        })
    return pages


def _operator_actions(session: Session) -> list[OperatorAction]:
    actions = list(
        OperatorAction.objects.filter(session=session).select_related("user")
        .order_by("created_at", "pk")
    )
    for action in actions:
        data = action.data if isinstance(action.data, dict) else {}
        # Sorted: PostgreSQL's jsonb does not keep the order keys were written in.
        action.details = "; ".join(
            f"{key}: {data[key]}" for key in sorted(data) if data[key] not in ("", None)
        )
    return actions


def session_record(session: Session) -> dict:
    """Everything the session page shows, read from the database: the same for
    a live session (as it stands now) and an ended one (the replay)."""
    approvals = _approvals(session)
    return {
        "session": session,
        "conversation": conversation_rows(session_conversation(session)),
        "tool_calls": _tool_calls(session),
        "turns": list(session.turn_records.order_by("number")),
        "approvals": approvals,
        "pending_approvals": [a for a in approvals if a["can_decide"]],
        "page_history": _page_history(session),
        "operator_actions": _operator_actions(session),
    }
