"""Writes: every change to tenants, keys and sessions goes through here.

Sync functions, one transaction per unit of work; async callers wrap each one
in a single ``database_sync_to_async`` call. Functions that must reach live
sessions on other processes write first, then notify over the channel layer
(see ``aitp.notify``); receivers re-read the database.

Two writes keep the rows every session shares out of the sessions'
transactions, so those of different sessions never queue behind each other:
the tenant's daily usage counters are added up in this process and written
behind (``UsageBuffer``, one UPDATE per tenant and day at most every
``OWLLAYER_USAGE_FLUSH_INTERVAL`` seconds, and when the process stops), and
a session open takes its key's row lock after its insert, for the cap's
count and the commit only.
"""
from __future__ import annotations

import functools
import hashlib
import hmac
import logging
import secrets
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date, datetime, timedelta

from django.conf import settings
from django.db import DatabaseError, connection, transaction
from django.db.models import F
from django.utils import timezone

from aitp import calls, limits, liveness, notify, open_statements, ports, statements
from aitp.calls import CallStatus
from aitp.close_codes import CLOSE_ABNORMAL
from aitp.models import (
    ApiKey,
    ConversationMessage,
    DailyUsage,
    OperatorAction,
    Session,
    ToolCall,
)
from tenants.models import Tenant

logger = logging.getLogger(__name__)

KEY_PREFIX = "pk_live_"
# The lookup prefix: "pk_live_" + 8 characters of the random part. Unique per
# key, shown in the console and admin, useless on its own.
LOOKUP_PREFIX_LENGTH = len(KEY_PREFIX) + 8


# --- tenants --------------------------------------------------------------


def tenant_create(*, slug: str, name: str = "", **fields) -> Tenant:
    """A new tenant; ``fields`` (e.g. its ceilings) replace the defaults for new tenants."""
    return Tenant.objects.create(slug=slug, name=name or slug, **fields)


# --- API keys -------------------------------------------------------------


def _key_hash(raw_key: str) -> str:
    secret = settings.OWLLAYER_KEY_HASH_SECRET.encode()
    return hmac.new(secret, raw_key.encode(), hashlib.sha256).hexdigest()


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
            key_hash=_key_hash(raw_key),
            allowed_origins=list(allowed_origins),
            max_sessions=max_sessions or settings.OWLLAYER_DEFAULT_SESSION_CAP,
            expires_at=expires_at,
        )
    return key, raw_key


def api_key_lookup(raw_key: str, *, for_update: bool = False) -> ApiKey | None:
    """The key row for a plaintext key, whatever its status; None if unknown.
    ``for_update`` locks the row (inside a transaction; FOR NO KEY UPDATE on
    PostgreSQL, the tenant row is not locked)."""
    if not raw_key or len(raw_key) < LOOKUP_PREFIX_LENGTH or len(raw_key) > 200:
        return None
    # Not FOR UPDATE: see session_open. One statement built once (every open reads it twice).
    key = open_statements.key_with_tenant(raw_key[:LOOKUP_PREFIX_LENGTH], for_update=for_update)
    if key is None:
        # Hash anyway so an unknown prefix costs the same as a wrong key.
        _key_hash(raw_key)
        return None
    if not hmac.compare_digest(key.key_hash, _key_hash(raw_key)):
        return None
    return key


# How long a key read for a session open serves the next opens of that key
# (this process): the first check (known, usable, from this origin) and the
# tenant the session belongs to. The admission reads the key's row again
# under its lock, and that row decides: a key revoked or changed since still
# refuses at once. A tenant's system prompt or quota changed reaches sessions
# opened this much later. Only keys that exist are remembered: a key just
# created works at once, and a wrong key is looked up every time.
KEY_READ_FRESH_FOR = 1.0
_KEYS_REMEMBERED = 10_000
_recent_keys: dict[str, tuple[float, ApiKey]] = {}


def _key_for_open(raw_key: str) -> ApiKey | None:
    """``api_key_lookup`` for a session open, the row read at most
    KEY_READ_FRESH_FOR seconds ago standing in for a new read."""
    prefix = raw_key[:LOOKUP_PREFIX_LENGTH] if raw_key else ""
    known = _recent_keys.get(prefix)
    if known is not None and time.monotonic() - known[0] < KEY_READ_FRESH_FOR \
            and len(raw_key) <= 200 and hmac.compare_digest(known[1].key_hash, _key_hash(raw_key)):
        return known[1]
    key = api_key_lookup(raw_key)
    if key is not None:
        if len(_recent_keys) >= _KEYS_REMEMBERED:
            _recent_keys.clear()
        _recent_keys[prefix] = (time.monotonic(), key)
    return key


def remembered_key_id(raw_key: str) -> int | None:
    """The id of this plaintext key when this process has read it for an
    open (however long ago: a key's id never changes), else None. Reads
    no database: for the event loop."""
    known = _recent_keys.get(raw_key[:LOOKUP_PREFIX_LENGTH] if raw_key else "")
    if known is None or len(raw_key) > 200 or not hmac.compare_digest(
            known[1].key_hash, _key_hash(raw_key)):
        return None
    return known[1].pk


def _key_changed(key: ApiKey) -> None:
    """This process's next open of the key reads it again."""
    _recent_keys.pop(key.prefix, None)


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
    _key_changed(key)
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
    _key_changed(key)
    if status != ApiKey.Status.ACTIVE:
        transaction.on_commit(lambda: notify.key_changed(key.pk))
    return key


def api_key_revoke(*, key: ApiKey, user=None) -> ApiKey:
    return api_key_set_status(key=key, status=ApiKey.Status.REVOKED, user=user)


# --- key checks (pure decisions on a loaded row) ----------------------------


@dataclass(frozen=True)
class Refusal:
    code: str
    message: str
    reason: str  # the WebSocket close reason, short


def api_key_refusal(key: ApiKey | None, *, origin: str | None, now: datetime) -> Refusal | None:
    if key is None:
        return Refusal("invalid_api_key", "The API key is not valid.", "invalid api key")
    if key.status == ApiKey.Status.REVOKED:
        return Refusal("api_key_revoked", "This API key has been revoked.", "api key revoked")
    if key.status == ApiKey.Status.DISABLED:
        return Refusal("api_key_disabled", "This API key is disabled.", "api key disabled")
    if key.expires_at is not None and key.expires_at <= now:
        return Refusal("api_key_expired", "This API key has expired.", "api key expired")
    if key.allowed_origins and (origin or "") not in key.allowed_origins:
        return Refusal(
            "origin_not_allowed",
            "This page's origin is not allowed for this API key.",
            "origin not allowed",
        )
    return None


# --- sessions ---------------------------------------------------------------


def live_sessions_filter(now: datetime) -> dict:
    """Rows of sessions that are open on a process still alive."""
    return {"ended_at__isnull": True, "last_seen_at__gte": _stale_before(now)}


def _stale_before(now: datetime) -> datetime:
    """A session row not seen since this time is stale: its process stopped refreshing it."""
    return now - timedelta(seconds=3 * settings.OWLLAYER_HEARTBEAT_INTERVAL)


@dataclass(frozen=True)
class HandshakeInfo:
    session_id: str
    origin: str
    user_agent: str
    viewport: str
    sdk_version: str
    protocol_version: str
    channel_name: str
    # The ServerProcess holding the connection ("" when none is registered).
    process: str = ""


# A key's ``last_used_at`` is rewritten when it is older than this (the
# console shows it to the minute): most opens then write nothing to the key row.
KEY_USE_PRECISION = timedelta(seconds=60)


def session_open(*, raw_key: str, info: HandshakeInfo) -> tuple[Session | None, Refusal | None]:
    """Check the key, its concurrent-session cap and its tenant's ceiling,
    and open the session.

    The key is read and checked without a lock first (a bad key costs no
    transaction; a key read for an open less than KEY_READ_FRESH_FOR seconds
    ago is not read again). Then, in one transaction, the session row is
    inserted and only after it the key's and the tenant's rows are locked,
    read again and the live sessions of the key and of the tenant counted,
    this one included: two handshakes racing on two processes, with one key
    or two keys of a tenant, cannot both take the last slot, and the locks
    are held for the counts and the commit only, never across the insert
    (the day's usage is written behind, ``usage_count``). The row read under the lock
    decides (and gives the session its tenant); a refusal rolls the insert
    back. On PostgreSQL that transaction is one
    query (``_session_open_in_one_query``): the lock is held for the time
    the database takes, not across round trips."""
    now = timezone.now()
    key = _key_for_open(raw_key)
    refusal = api_key_refusal(key, origin=info.origin, now=now)
    if refusal is not None:
        return None, refusal
    if statements.one_query_transactions():
        return _session_open_in_one_query(key, raw_key, info, now)
    return _session_open_locked(key, raw_key, info, now)


def _new_session(key: ApiKey, info: HandshakeInfo, now: datetime) -> Session:
    return Session(
        id=info.session_id,
        tenant=key.tenant,
        api_key=key,
        channel_name=info.channel_name,
        process=info.process,
        origin=info.origin[:500],
        user_agent=info.user_agent[:500],
        viewport=info.viewport[:40],
        sdk_version=info.sdk_version[:40],
        protocol_version=info.protocol_version[:40],
        started_at=now,
        last_seen_at=now,
        last_activity_at=now,
    )


def _session_open_in_one_query(key: ApiKey, raw_key: str, info: HandshakeInfo,
                               now: datetime) -> tuple[Session | None, Refusal | None]:
    """session_open on PostgreSQL: the insert, the key's and tenant's locks,
    their re-read, the cap and the ceiling in one round trip
    (``open_statements.session_admit``). The quota of the tenant read with
    the key is checked after (its counts are written behind anyway). Over
    the cap or the ceiling, the slow path counts without processes known to
    be gone and, when that leaves a slot, opens as ``_session_open_locked``
    does."""
    session = _new_session(key, info, now)
    locked, stayed = open_statements.session_admit(
        session, prefix=raw_key[:LOOKUP_PREFIX_LENGTH], seen_since=_stale_before(now), now=now)
    if locked is not None and not hmac.compare_digest(locked.key_hash, _key_hash(raw_key)):
        locked = None
    refusal = api_key_refusal(locked, origin=info.origin, now=now)
    if refusal is None and limits.token_quota_used_up(locked.tenant, now=now):
        refusal = _QUOTA_REFUSAL
    if refusal is None and not stayed:
        refusal = _caps_refusal(locked, now, row_counted=False)
        if refusal is None:
            return _session_open_locked(locked, raw_key, info, now)
    if refusal is not None:
        if stayed:  # refused for what the query does not check (the origin, the quota)
            Session.objects.filter(pk=session.pk).delete()
        return None, refusal
    if locked.last_used_at is None or locked.last_used_at <= now - KEY_USE_PRECISION:
        ApiKey.objects.filter(pk=locked.pk).update(last_used_at=now)
    session.tenant = locked.tenant  # as read under the lock: its prompt as it is now
    usage_count(locked.tenant_id, now, sessions=1)
    return session, None


def _session_open_locked(key: ApiKey, raw_key: str, info: HandshakeInfo,
                         now: datetime) -> tuple[Session | None, Refusal | None]:
    """session_open in one transaction of several statements (SQLite; the
    slow path on PostgreSQL)."""
    with transaction.atomic():
        session = _new_session(key, info, now)
        open_statements.session_insert(session)
        refusal, locked = _session_open_refusal(raw_key, info, now)
        if refusal is not None:
            transaction.set_rollback(True)
            return None, refusal
    session.tenant = locked.tenant  # as read under the lock: its prompt as it is now
    usage_count(key.tenant_id, now, sessions=1)
    return session, None


_QUOTA_REFUSAL = Refusal(limits.USAGE_LIMIT_CODE, limits.USAGE_LIMIT_MESSAGE,
                         limits.USAGE_LIMIT_REASON)
_SESSION_LIMIT_REFUSAL = Refusal("session_limit", "Too many concurrent sessions for this API key.",
                                 "session limit reached")
# The tenant's own ceiling, over all its keys: refused as the key's cap is.
_TENANT_SESSION_LIMIT_REFUSAL = Refusal(
    "tenant_session_limit", "Too many concurrent sessions for this tenant.",
    "tenant session limit reached")


def _session_open_refusal(raw_key: str, info: HandshakeInfo,
                          now: datetime) -> tuple[Refusal | None, ApiKey | None]:
    """Under the key's and its tenant's row locks (inside session_open's
    transaction, its own row already inserted): the refusal of the key as it
    is now, of its tenant's token quota, of its session cap or of its
    tenant's ceiling (None admits the session), and the key as read under
    the lock, with its tenant. ``open_statements.session_admit`` is the same
    rule in SQL (tests/aitp/test_admission_paths.py runs both)."""
    # FOR NO KEY UPDATE: the session rows inserted by other opens hold a
    # KEY SHARE lock on the key and tenant rows (their foreign keys) until
    # they commit; a FOR UPDATE would wait for them, and they for it.
    key = api_key_lookup(raw_key, for_update=True)
    refusal = api_key_refusal(key, origin=info.origin, now=now)
    if refusal is not None:
        return refusal, key
    if limits.token_quota_used_up(key.tenant, now=now):
        return _QUOTA_REFUSAL, key
    refusal = _caps_refusal(key, now)
    if refusal is not None:
        return refusal, key
    if key.last_used_at is None or key.last_used_at <= now - KEY_USE_PRECISION:
        ApiKey.objects.filter(pk=key.pk).update(last_used_at=now)
    return None, key


def session_still_allowed(*, session_id: str) -> Refusal | None:
    """Re-check the key of a live session (on a key-change notice, and at each
    heartbeat so a process that missed the notice still closes it)."""
    session = Session.objects.select_related("api_key").filter(id=session_id).first()
    if session is None:
        return Refusal("session_ended", "This session no longer exists.", "session ended")
    return api_key_refusal(session.api_key, origin=session.origin, now=timezone.now())


def session_heartbeat(*, session_id: str) -> None:
    Session.objects.filter(id=session_id, ended_at__isnull=True).update(last_seen_at=timezone.now())


PAGE_HISTORY_LIMIT = 500


def session_write_live(
    *, session_id: str, snapshot: dict | None = None, state: str | None = None,
    visits: list[dict] = (), ending: dict | None = None,
) -> None:
    """One write of what a live connection holds: the page snapshot (url,
    title, context, tools), the turn state, and the pages visited since the
    last write (each distinct URL with its time; the oldest are dropped past
    PAGE_HISTORY_LIMIT). A closed session is left as it is. ``ending``: the
    fields that end the row, set in the same statement."""
    fields: dict = {"last_activity_at": timezone.now()}
    if snapshot is not None:
        fields.update(
            current_url=snapshot["url"][:2000], title=snapshot["title"][:500],
            context=snapshot["context"], tools=snapshot["tools"],
        )
    if state is not None:
        fields["state"] = state
    if ending is not None:
        fields.update(ending)
    if visits:
        statements.session_live_visits(session_id=session_id, fields=fields, visits=list(visits),
                                       keep=PAGE_HISTORY_LIMIT)
    else:
        statements.session_live_update(session_id=session_id, fields=fields)


def sessions_write_live(writes: list[dict]) -> list[Exception | None]:
    """Several connections' ``session_write_live`` in one transaction (one
    query on PostgreSQL); for each, None or what its write raised
    (``_together_or_alone``)."""
    return _together_or_alone(writes, lambda write: session_write_live(**write))


def _together_or_alone(
    writes: list[dict], write: Callable[[dict], None], *,
    alone: Callable[[dict], None] | None = None, committed: Callable[[dict], None] | None = None,
) -> list[Exception | None]:
    """The writes of several sessions (``aitp.group_write``) in one
    transaction, ``statements.together``: one query on PostgreSQL. For each,
    None or what it raised: when the database refuses them together (a value
    of one session it cannot store), each is written alone (``alone``, or
    ``write`` in a transaction of its own), so only that one fails.
    ``committed`` runs for each once its transaction committed."""
    alone = alone or write
    if len(writes) > 1:
        try:
            with statements.together():
                for each in writes:
                    write(each)
        except Exception:
            pass  # rolled back whole: find the one that fails, alone
        else:
            if committed is not None:
                for each in writes:
                    committed(each)
            return [None] * len(writes)
    outcomes: list[Exception | None] = []
    for each in writes:
        try:
            alone(each)
        except Exception as exc:
            outcomes.append(exc)
        else:
            outcomes.append(None)
    return outcomes


def sessions_close(closes: list[dict]) -> list[Exception | None]:
    """Several ``session_close`` in one transaction (``_together_or_alone``)."""
    return _together_or_alone(closes, lambda close: session_close(**close),
                              alone=_session_close_alone)


def session_close(*, session_id: str, code: int | None, reason: str = "",
                  live: dict | None = None) -> None:
    """End a session's row; ``live``: the last ``session_write_live`` it is
    owed (but the session id), written with it, in the same statement."""
    now = timezone.now()
    reason = (reason or "")[:200]
    if live is None:
        open_statements.session_end(session_id, now=now, code=code, reason=reason,
                                    state=Session.State.ENDED)
        return
    session_write_live(session_id=session_id, **live, ending=open_statements.end_fields(
        now=now, code=code, reason=reason, state=Session.State.ENDED))


def _session_close_alone(close: dict) -> None:
    """``session_close``; when the database refuses the last live values (a
    value it cannot store), the row still ends, without them."""
    try:
        session_close(**close)
    except Exception as exc:
        if close.get("live") is None:
            raise
        logger.warning("session %s: its last page snapshot could not be written (%s); "
                       "closing the row without it", close["session_id"], type(exc).__name__)
        session_close(**{**close, "live": None})


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
    stale_before = now - timedelta(seconds=3 * settings.OWLLAYER_HEARTBEAT_INTERVAL)
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


def _caps_refusal(key: ApiKey, now: datetime, *, row_counted: bool = True) -> Refusal | None:
    """The refusal of the key's session cap or of its tenant's ceiling, in
    that order (None: both have room for this open), counted under their row
    locks. ``row_counted``: this open's row is among the live rows (inside
    session_open's transaction); else the one query took it back out, and
    it is counted here. A count over a limit is made again without the
    sessions of server processes known to be gone, which hold no slot."""
    seen_since = _stale_before(now)
    this_open = 0 if row_counted else 1

    def over(limit: int, quick: Callable[[], int], **rows) -> bool:
        if row_counted and quick() <= limit:
            return False
        return _live_sessions_without_gone_processes(now, **rows) + this_open > limit

    if over(key.max_sessions, lambda: open_statements.live_session_count(
            key.pk, seen_since=seen_since), api_key=key):
        return _SESSION_LIMIT_REFUSAL
    ceiling = key.tenant.max_sessions
    if ceiling is not None and over(ceiling, lambda: open_statements.tenant_live_session_count(
            key.tenant_id, seen_since=seen_since), tenant_id=key.tenant_id):
        return _TENANT_SESSION_LIMIT_REFUSAL
    return None


def _live_sessions_without_gone_processes(now: datetime, **rows) -> int:
    """The live sessions of these rows (a key's, a tenant's), not counting
    those of server processes known to be gone (the sweep closes their rows;
    until it has, they hold no slot)."""
    live = Session.objects.filter(**rows, **live_sessions_filter(now))
    gone = liveness.gone_ids(set(live.values_list("process", flat=True)), now=now)
    return live.exclude(process__in=gone).count() if gone else live.count()


def _session_usage_update(session_id: str, now: datetime, **amounts: int) -> None:
    statements.session_usage_add(session_id=session_id, now=now, amounts=amounts)


# --- the tenants' daily usage, written behind -----------------------------------

USAGE_FIELDS = (
    "sessions", "turns", "input_tokens", "output_tokens", "cache_read_tokens",
    "cache_write_tokens",
)


class UsageBuffer:
    """The ``DailyUsage`` counts this process added and has not written yet,
    per (tenant, day). Every open and every turn of a tenant adds to the same
    row; written from inside their transactions, that row's lock made them
    wait for one another through their commits. Here they only add in
    memory; ``flush`` writes each (tenant, day) in one UPDATE, outside any
    session's transaction.

    It flushes when a count arrives and the last flush is at least
    ``OWLLAYER_USAGE_FLUSH_INTERVAL`` seconds old (0: every count is written
    at once), on the serving process's timer (``aitp.processes``) and when
    the process stops. A flush the database refuses keeps its counts for the
    next one. A process killed outright loses at most one interval's counts;
    the monthly token quota (``aitp.limits``) sees another process's tokens
    at most one interval late."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: dict[tuple[int, date], Counter] = {}
        self._last_flush = time.monotonic()

    def add(self, tenant_id: int, day: date, amounts: dict[str, int]) -> None:
        amounts = {name: amount for name, amount in amounts.items() if amount}
        with self._lock:
            self._pending.setdefault((tenant_id, day), Counter()).update(amounts)

    def pending(self) -> dict[tuple[int, date], dict[str, int]]:
        """What is not written yet (a copy)."""
        with self._lock:
            return {row: dict(amounts) for row, amounts in self._pending.items()}

    def due(self) -> bool:
        interval = settings.OWLLAYER_USAGE_FLUSH_INTERVAL
        if interval <= 0:
            return True
        # Never from inside a transaction: the row lock would last until its commit.
        return time.monotonic() - self._last_flush >= interval and not connection.in_atomic_block

    def flush(self) -> int:
        """Write every pending count, one statement per (tenant, day) row;
        returns how many rows were written. Raises what the database raised,
        after putting back what it could not write."""
        with self._lock:
            pending, self._pending = self._pending, {}
            self._last_flush = time.monotonic()
        rows = list(pending.items())
        for done, ((tenant_id, day), amounts) in enumerate(rows):
            try:
                _usage_write(tenant_id, day, amounts)
            except DatabaseError:
                for row, left in rows[done:]:
                    self.add(*row, left)
                raise
        return len(rows)


_usage = UsageBuffer()


def usage_count(tenant_id: int, now: datetime, **amounts: int) -> None:
    """Count these amounts in the tenant's day (``DailyUsage``), written
    behind (see UsageBuffer). Call it once the work they count is committed."""
    _usage.add(tenant_id, timezone.localdate(now), amounts)
    if _usage.due():
        usage_flush_logged()


def usage_flush() -> int:
    """Write this process's pending usage counts now (the timer, the stop,
    tests). Returns how many (tenant, day) rows were written."""
    return _usage.flush()


def usage_flush_logged() -> int:
    """``usage_flush`` for callers whose own work is done: a database that
    cannot take the counts now keeps them pending and says so."""
    try:
        return _usage.flush()
    except DatabaseError as exc:
        logger.warning("usage counts not written yet, kept for the next flush (%s)",
                       type(exc).__name__)
        return 0


def usage_pending() -> dict[tuple[int, date], dict[str, int]]:
    return _usage.pending()


def usage_write_now(tenant_id: int, now: datetime, **amounts: int) -> None:
    """Count these amounts in the tenant's day at once, not behind (inside
    the caller's transaction): a model request's tokens settled against the
    tenant's quota (``aitp.quota``), which must never be counted later than
    its reservation stops counting."""
    _usage_write(tenant_id, timezone.localdate(now), amounts)


def _usage_write(tenant_id: int, day: date, amounts: dict[str, int]) -> None:
    changes = {k: F(k) + v for k, v in amounts.items() if v}
    if not changes:
        return
    # The day's row exists but for the first write of the day: one UPDATE.
    if DailyUsage.objects.filter(tenant_id=tenant_id, date=day).update(**changes):
        return
    row, _ = DailyUsage.objects.get_or_create(tenant_id=tenant_id, date=day)
    DailyUsage.objects.filter(pk=row.pk).update(**changes)


# --- the conversation and the tool-call ledger --------------------------------


def conversation_append(*, session_id: str, seq: int, turn: int, role: str, content: list) -> None:
    ConversationMessage.objects.create(
        session_id=session_id, seq=seq, turn=turn, role=role, content=content
    )


def turn_checkpoint(
    *, session_id: str, tenant_id: int, turn: int, messages: list[dict],
    calls: list[dict] = (), usage: dict | None = None, finished: list[dict] = (),
    counted: dict | None = None,
) -> None:
    """What a turn has produced since its last checkpoint, in one transaction
    (``statements.together``: one round trip on PostgreSQL):
    the final outcomes of calls that ended since (``tool_call_finish``
    arguments), conversation messages, the ledger rows of the calls about to
    run, and the turn's usage on its session's row (its tokens and, for a
    voice turn, ``audio_heard_ms`` and ``audio_spoken_ms``). Outcomes, messages
    and calls are idempotent (a checkpoint interrupted half way may be
    written again); usage is added once, and counted in the tenant's day
    (written behind, see UsageBuffer) only once the transaction committed,
    but for ``counted``: what of it is in the tenant's day already (tokens
    settled against the quota, ``aitp.quota``)."""
    now = timezone.now()
    with statements.together():
        _checkpoint_statements(session_id=session_id, turn=turn, messages=messages, calls=calls,
                               usage=usage, finished=finished, now=now)
    if usage is not None:
        usage_count(tenant_id, now, **_not_counted(usage, counted))


def turn_checkpoints(checkpoints: list[dict]) -> list[Exception | None]:
    """The checkpoints of several sessions' turns (``turn_checkpoint``
    arguments) in one transaction, their usage counted once it committed;
    for each, None or what its write raised (``_together_or_alone``)."""
    now = timezone.now()

    def statements_of(checkpoint: dict) -> None:
        _checkpoint_statements(**{k: v for k, v in checkpoint.items()
                                  if k not in ("tenant_id", "counted")}, now=now)

    def count_usage(checkpoint: dict) -> None:
        if checkpoint.get("usage") is not None:
            usage_count(checkpoint["tenant_id"], now,
                        **_not_counted(checkpoint["usage"], checkpoint.get("counted")))

    return _together_or_alone(checkpoints, statements_of,
                              alone=lambda checkpoint: turn_checkpoint(**checkpoint),
                              committed=count_usage)


def _not_counted(usage: dict, counted: dict | None) -> dict:
    """The usage a turn's day still lacks: ``usage`` less what was ``counted`` already."""
    if not counted:
        return usage
    return {name: amount - counted.get(name, 0) for name, amount in usage.items()}


def _checkpoint_statements(*, session_id: str, turn: int, messages: list[dict],
                           calls: list[dict] = (), usage: dict | None = None,
                           finished: list[dict] = (), now: datetime) -> None:
    for outcome in finished:
        tool_call_finish(**outcome, now=now)
    if messages:
        statements.messages_insert(session_id=session_id, turn=turn, messages=messages, now=now)
    if calls:
        statements.calls_insert(session_id=session_id, turn=turn, calls=calls, now=now)
    if usage is not None:
        _session_usage_update(session_id, now, **usage)


def tool_calls_record(*, session_id: str, turn: int, calls: list[dict]) -> None:
    """Record every tool_use of one assistant message before any is dispatched,
    so a crash half way still leaves a row per call."""
    statements.calls_insert(session_id=session_id, turn=turn, calls=calls, now=timezone.now())


def tool_call_mark(*, call_id: str, status: str, sent: bool = False, risk: str | None = None,
                   origin: str | None = None) -> None:
    """Record progress of a call (sent, running): the status changes only from
    a state the call table (``aitp.calls``) leads from, so it never undoes a
    final status, which a cancelled turn may have written first."""
    status = CallStatus(status).value
    statements.call_mark(
        call_id=call_id, status=status, sources=_mark_sources(status),
        sent_at=timezone.now() if sent else None, risk=risk, origin=origin,
    )


def tool_call_marks(marks: list[dict]) -> list[Exception | None]:
    """Several ``tool_call_mark`` in one transaction (``_together_or_alone``)."""
    return _together_or_alone(marks, lambda mark: tool_call_mark(**mark))


@functools.cache
def _mark_sources(status: str) -> tuple[str, ...]:
    return tuple(sorted(s.value for s in calls.sources(status)))


def tool_call_finish(*, call_id: str, status: str, result=None, error: str = "",
                     risk: str | None = None, origin: str | None = None,
                     created_at: datetime | None = None, sent_at: datetime | None = None,
                     now: datetime | None = None) -> None:
    """Write a call's one final outcome; a call already final is left alone.
    ``created_at``, when the caller recorded the row with it, saves a read;
    ``sent_at`` is kept as the time it was sent unless its mark wrote one."""
    now = now or timezone.now()
    if created_at is None:
        call = ToolCall.objects.filter(call_id=call_id).only("created_at", "status").first()
        if call is None or call.status in ToolCall.FINAL_STATUSES:
            return
        created_at = call.created_at
    statements.call_finish(
        call_id=call_id, status=status, result=result, error=error[:4000], finished_at=now,
        duration_ms=max(0, int((now - created_at).total_seconds() * 1000)), risk=risk,
        origin=origin, sent_at=sent_at, finals=_FINAL_STATUSES,
    )


_FINAL_STATUSES = tuple(sorted(str(s) for s in ToolCall.FINAL_STATUSES))


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
