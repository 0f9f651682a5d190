"""Writes to tenants, keys and sessions outside a live connection's own
(those go through the session store, ``aitp.store``).

Sync functions, one transaction per unit of work; async callers wrap each one
in a single ``database_sync_to_async`` call. Functions that must reach live
sessions on other processes write first, then notify over the channel layer
(see ``aitp.notify``); receivers re-read the database.
"""
from __future__ import annotations

import logging
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import transaction
from django.utils import timezone

from aitp import notify, ports
from aitp.close_codes import CLOSE_ABNORMAL
from aitp.models import ApiKey, OperatorAction, Session, ToolCall
from aitp.store import keys
from aitp.store.admission import Refusal, api_key_refusal
from aitp.store.keys import KEY_PREFIX, LOOKUP_PREFIX_LENGTH
from runtime.config import config
from tenants.models import Tenant

logger = logging.getLogger(__name__)

__all__ = ["KEY_PREFIX", "LOOKUP_PREFIX_LENGTH", "Refusal"]


# --- tenants --------------------------------------------------------------


def tenant_create(*, slug: str, name: str = "", **fields) -> Tenant:
    """A new tenant; ``fields`` (e.g. its ceilings) replace the defaults for new tenants."""
    return Tenant.objects.create(slug=slug, name=name or slug, **fields)


# --- API keys -------------------------------------------------------------


class KeyCeilingReached(ValueError):
    """The tenant holds as many keys as its ceiling (``Tenant.max_keys``) allows."""


def key_ceiling_refusal(tenant_id: int, *, lock: bool = False) -> str | None:
    """Why this tenant may not have one more key (its keys that are not
    revoked already fill its ceiling), or None. ``lock``: counted under the
    tenant's row lock (inside a transaction), as ``api_key_create`` does;
    forms ask without it, to answer before anything is written."""
    tenants = Tenant.objects.select_for_update(no_key=True) if lock else Tenant.objects
    ceiling = tenants.values_list("max_keys", flat=True).get(pk=tenant_id)
    if ceiling is None:
        return None
    held = ApiKey.objects.filter(tenant_id=tenant_id).exclude(status=ApiKey.Status.REVOKED).count()
    if held < ceiling:
        return None
    keys = "1 key" if held == 1 else f"{held} keys"
    return (f"This tenant already has {keys}, as many as its ceiling allows: revoke a key it "
            "no longer uses, or ask the service's operators to raise the ceiling.")


def api_key_create(
    *,
    tenant: Tenant,
    name: str = "",
    allowed_origins: list[str] | tuple[str, ...] = (),
    max_sessions: int | None = None,
    expires_at: datetime | None = None,
) -> tuple[ApiKey, str]:
    """Create a key; returns the row and the plaintext key, which is never
    stored. Raises KeyCeilingReached when the tenant already holds
    ``max_keys`` keys that are not revoked (counted under the tenant's row
    lock, so two creations at once cannot both take the last one)."""
    raw_key = KEY_PREFIX + secrets.token_urlsafe(24).replace("-", "x").replace("_", "y")
    with transaction.atomic():
        refusal = key_ceiling_refusal(tenant.pk, lock=True)
        if refusal is not None:
            raise KeyCeilingReached(refusal)
        key = ApiKey.objects.create(
            tenant=tenant,
            name=name,
            prefix=raw_key[:LOOKUP_PREFIX_LENGTH],
            key_hash=keys.key_hash(raw_key),
            allowed_origins=list(allowed_origins),
            max_sessions=max_sessions or config().store.default_session_cap,
            expires_at=expires_at,
        )
    return key, raw_key


def api_key_update(
    *,
    key: ApiKey,
    name: str | None = None,
    allowed_origins: list[str] | None = None,
    max_sessions: int | None = None,
    expires_at: datetime | None = None,
    user=None,
) -> ApiKey:
    changed = {}
    if name is not None:
        key.name = name
        changed["name"] = name
    if allowed_origins is not None:
        key.allowed_origins = list(allowed_origins)
        changed["allowed_origins"] = list(allowed_origins)
    if max_sessions is not None:
        key.max_sessions = max_sessions
        changed["max_sessions"] = max_sessions
    if expires_at is not None:
        key.expires_at = expires_at
        changed["expires_at"] = expires_at.isoformat()
    with transaction.atomic():
        key.save()
        OperatorAction.objects.create(
            tenant_id=key.tenant_id, user=user, action="key_updated",
            data={"prefix": key.prefix, **changed},
        )
    keys.key_changed(key)
    if "allowed_origins" in changed or "expires_at" in changed:
        # Live sessions re-check their key: one from an origin just removed closes.
        transaction.on_commit(lambda: notify.key_changed(key.pk))
    return key


def api_key_set_status(*, key: ApiKey, status: str, user=None) -> ApiKey:
    """Disable, revoke or re-activate a key; live sessions of a key that can
    no longer be used are closed on every process."""
    if key.status == ApiKey.Status.REVOKED and status != ApiKey.Status.REVOKED:
        raise ValueError("a revoked key cannot be re-activated")
    if key.status == status:
        return key
    with transaction.atomic():
        key.status = status
        if status == ApiKey.Status.REVOKED:
            key.revoked_at = timezone.now()
        key.save(update_fields=["status", "revoked_at"])
        OperatorAction.objects.create(
            tenant_id=key.tenant_id, user=user, action=f"key_{status}", data={"prefix": key.prefix}
        )
    keys.key_changed(key)
    if status != ApiKey.Status.ACTIVE:
        transaction.on_commit(lambda: notify.key_changed(key.pk))
    return key


def api_key_revoke(*, key: ApiKey, user=None) -> ApiKey:
    return api_key_set_status(key=key, status=ApiKey.Status.REVOKED, user=user)


# --- sessions ---------------------------------------------------------------


def session_still_allowed(*, session_id: str) -> Refusal | None:
    """Re-check the key of a live session (on a key-change notice, and at each
    heartbeat so a process that missed the notice still closes it)."""
    session = Session.objects.select_related("api_key").filter(id=session_id).first()
    if session is None:
        return Refusal("session_ended", "This session no longer exists.", "session ended")
    return api_key_refusal(session.api_key, origin=session.origin, now=timezone.now())


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
