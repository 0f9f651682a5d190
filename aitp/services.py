"""Writes to sessions outside a live connection's own (those go through
the session store, ``aitp.store``): re-checking a live session's key, its
heartbeat, closing the rows of sessions whose process is gone, and
operators' commands to a live session. Tenants, their members and their keys
are written in ``aitp.tenancy``.

Sync functions, one transaction per unit of work; async callers wrap each one
in a single ``database_sync_to_async`` call. Functions that must reach live
sessions on other processes write first, then notify over the channel layer
(see ``aitp.notify``); receivers re-read the database.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import transaction
from django.utils import timezone

from aitp import notify, ports
from aitp.close_codes import CLOSE_ABNORMAL
from aitp.models import OperatorAction, Session, ToolCall
from aitp.store.admission import Refusal, api_key_refusal
from runtime.config import config

logger = logging.getLogger(__name__)


# --- sessions ---------------------------------------------------------------


def session_still_allowed(*, session_id: str) -> Refusal | None:
    """Re-check the key of a live session (on a key-change notice, and at each
    heartbeat so a process that missed the notice still closes it)."""
    session = Session.objects.select_related("api_key").filter(id=session_id).first()
    if session is None:
        return Refusal("session_ended", "This session no longer exists.", "session ended")
    return api_key_refusal(session.api_key, origin=session.origin, now=timezone.now())


def session_link_visitor(*, session_id: str, visitor_id: str) -> None:
    """The visitor a valid visitor token vouched for (aitp.visitors), kept on the session."""
    Session.objects.filter(id=session_id).update(visitor_id=visitor_id)


def session_heartbeat(*, session_id: str) -> None:
    Session.objects.filter(id=session_id, ended_at__isnull=True).update(last_seen_at=timezone.now())


@dataclass
class Closing:
    """What closing session rows closed with them, added up over the closes
    it is handed to."""

    approvals: int = 0


def sessions_close_stale(*, now: datetime | None = None, closing: Closing | None = None) -> int:
    """Close the rows of sessions whose process stopped refreshing them (it
    died without closing them). They already stopped counting against their
    key's cap; this ends their record, and their tool calls get a final
    status. Returns how many."""
    now = now or timezone.now()
    stale_before = now - timedelta(seconds=3 * config().store.heartbeat_interval)
    stale = Session.objects.filter(ended_at__isnull=True, last_seen_at__lt=stale_before)
    return _sessions_close(stale, now=now, code=CLOSE_ABNORMAL, reason="server process lost", closing=closing)


# The sweep (aitp.processes) closes the rows of server processes that are
# gone, whatever their age: a key's cap is free as soon as they are known gone.
SESSIONS_CLOSE_BATCH = 500
LOST_CALL_ERROR = "The connection to the page ended before the tool finished."


def sessions_close_of_processes(
    *, process_ids, code: int, reason: str, mark_stopped: bool = False,
    now: datetime | None = None, closing: Closing | None = None,
) -> int:
    """Close every open session row held by these server processes, with
    their unfinished tool calls ('disconnected'); with ``mark_stopped`` the
    processes are marked stopped in the same transaction, so no row of a
    stopped process is ever left counting. Returns how many rows closed."""
    from aitp.models import ServerProcess

    now = now or timezone.now()
    process_ids = [pid for pid in process_ids if pid]
    if not process_ids:
        return 0
    with transaction.atomic():
        closed = _sessions_close(
            Session.objects.filter(ended_at__isnull=True, process__in=process_ids),
            now=now, code=code, reason=reason, closing=closing,
        )
        if mark_stopped:
            ServerProcess.objects.filter(id__in=process_ids, stopped_at__isnull=True).update(
                stopped_at=now
            )
    return closed


def _sessions_close(open_rows, *, now: datetime, code: int, reason: str,
                    closing: Closing | None = None) -> int:
    """Close these open session rows and give their unfinished tool calls
    their final status, one transaction per batch: first the calls that have
    an approval, each with its approval's event (the approvals app, through
    its port), then the others."""
    closed = 0
    while True:
        with transaction.atomic():
            ids = list(open_rows.values_list("id", flat=True)[:SESSIONS_CLOSE_BATCH])
            if not ids:
                return closed
            approvals = ports.approvals().end_with_sessions(session_ids=ids, now=now, reason=reason)
            if closing is not None:
                closing.approvals += approvals
            closed += Session.objects.filter(id__in=ids, ended_at__isnull=True).update(
                ended_at=now, close_code=code, close_reason=reason[:200],
                state=Session.State.ENDED, last_seen_at=now,
            )
            ToolCall.objects.filter(session_id__in=ids).exclude(
                status__in=ToolCall.FINAL_STATUSES
            ).update(status=ToolCall.Status.DISCONNECTED, error=LOST_CALL_ERROR, finished_at=now)


# --- operator actions on a live session ----------------------------------------

SESSION_COMMANDS = ("end", "reload", "redirect")


def session_command(*, session: Session, user, command: str, url: str = "", message: str = "",
                    channel: str = "admin") -> OperatorAction:
    """Record an operator's action, then ask the process holding the session
    to carry it out (end: disconnect event + 1008; reload; redirect to url)."""
    if command not in SESSION_COMMANDS:
        raise ValueError(f"unknown session command {command!r}")
    if command == "redirect" and not url:
        raise ValueError("redirect needs a url")
    with transaction.atomic():
        action = OperatorAction.objects.create(
            session=session, tenant_id=session.tenant_id, user=user, action=f"session_{command}",
            data={"url": url, "message": message, "channel": channel},
        )
    transaction.on_commit(
        lambda: notify.session_command(session.id, command, url=url, message=message)
    )
    return action


# --- asking for a person ----------------------------------------------------------


def session_handoff_requested(*, session_id: str, reason: str) -> bool:
    """The agent asked for a person: the live session waits for an operator
    from now on. False when one is in charge already, or the session has
    ended; asking again while waited for keeps the first time and reason."""
    return bool(Session.objects.filter(
        pk=session_id, ended_at__isnull=True, operator__isnull=True, handoff_requested_at__isnull=True,
    ).update(handoff_requested_at=timezone.now(), handoff_reason=reason[:500]))


def session_handoff_unanswered(*, session_id: str) -> bool:
    """Nobody took the chat over in time: the session is no longer waited
    for. False when an operator took it meanwhile (or nothing was waited for)."""
    return bool(Session.objects.filter(
        pk=session_id, handoff_requested_at__isnull=False, operator__isnull=True,
    ).update(handoff_requested_at=None, handoff_reason=""))
