"""Who may open a session: the checks of a key as read, and the admission
rule, written once. Both stores (``aitp.store.plain``, ``aitp.store.fast``)
read the key and count the live sessions their own way, under the key's and
its tenant's row locks, and hand what they read to ``refusal``.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from aitp import liveness, quota
from aitp.models import ApiKey, Session
from runtime.config import config


@dataclass(frozen=True)
class Refusal:
    code: str
    message: str
    reason: str  # the WebSocket close reason, short


QUOTA_REFUSAL = Refusal(quota.USAGE_LIMIT_CODE, quota.USAGE_LIMIT_MESSAGE,
                        quota.USAGE_LIMIT_REASON)
SESSION_LIMIT_REFUSAL = Refusal("session_limit", "Too many concurrent sessions for this API key.",
                                "session limit reached")
# The tenant's own ceiling, over all its keys: refused as the key's cap is.
TENANT_SESSION_LIMIT_REFUSAL = Refusal(
    "tenant_session_limit", "Too many concurrent sessions for this tenant.",
    "tenant session limit reached")

# A key's ``last_used_at`` is rewritten when it is older than this (the
# console shows it to the minute): most opens then write nothing to the key row.
KEY_USE_PRECISION = timedelta(seconds=60)


def api_key_refusal(key: ApiKey | None, *, origin: str | None, now: datetime,
                    preview_key_id: int | None = None) -> Refusal | None:
    """Why this key, as read, may not be used from this origin now (None: it
    may). ``preview_key_id``: the key a good preview ticket names
    (``aitp.preview``); for that key, the page's origin is not checked."""
    if key is None:
        return Refusal("invalid_api_key", "The API key is not valid.", "invalid api key")
    if key.status == ApiKey.Status.REVOKED:
        return Refusal("api_key_revoked", "This API key has been revoked.", "api key revoked")
    if key.status == ApiKey.Status.DISABLED:
        return Refusal("api_key_disabled", "This API key is disabled.", "api key disabled")
    if key.expires_at is not None and key.expires_at <= now:
        return Refusal("api_key_expired", "This API key has expired.", "api key expired")
    if key.allowed_origins and (origin or "") not in key.allowed_origins and key.pk != preview_key_id:
        return Refusal(
            "origin_not_allowed",
            "This page's origin is not allowed for this API key.",
            "origin not allowed",
        )
    return None


def refusal(key: ApiKey | None, *, origin: str, now: datetime, key_live: Callable[[], int],
            tenant_live: Callable[[], int], preview_key_id: int | None = None) -> Refusal | None:
    """The admission rule. ``key`` as read under its and its tenant's row
    locks (with its tenant), the open's own row already inserted;
    ``key_live`` and ``tenant_live`` count the live sessions of the key and
    of the tenant, this one included. Refused, in this order: the key as it
    is now, its tenant's token quota, the key's session cap, the tenant's
    ceiling. A count over a limit is made again without the sessions of
    server processes known to be gone, which hold no slot (the sweep closes
    their rows; until it has, they still look live)."""
    refused = api_key_refusal(key, origin=origin, now=now, preview_key_id=preview_key_id)
    if refused is not None:
        return refused
    if quota.token_quota_used_up(key.tenant, now=now):
        return QUOTA_REFUSAL
    if key_live() > key.max_sessions and \
            live_without_gone_processes(now, api_key=key) > key.max_sessions:
        return SESSION_LIMIT_REFUSAL
    ceiling = key.tenant.max_sessions
    if ceiling is not None and tenant_live() > ceiling and \
            live_without_gone_processes(now, tenant_id=key.tenant_id) > ceiling:
        return TENANT_SESSION_LIMIT_REFUSAL
    return None


def refusal_counting_rows(key: ApiKey | None, *, origin: str, now: datetime,
                          preview_key_id: int | None = None) -> Refusal | None:
    """``refusal`` with the live sessions counted by the ORM (the plain
    store's open, and a resume in both stores)."""
    live = Session.objects.filter(**live_sessions_filter(now))
    return refusal(key, origin=origin, now=now, preview_key_id=preview_key_id,
                   key_live=lambda: live.filter(api_key=key).count(),
                   tenant_live=lambda: live.filter(tenant_id=key.tenant_id).count())


def stale_before(now: datetime) -> datetime:
    """A session row not seen since this time is stale: its process stopped refreshing it."""
    return now - timedelta(seconds=3 * config().store.heartbeat_interval)


def live_sessions_filter(now: datetime) -> dict:
    """Rows of sessions that are open on a process still alive."""
    return {"ended_at__isnull": True, "last_seen_at__gte": stale_before(now)}


def live_without_gone_processes(now: datetime, **rows) -> int:
    """The live sessions of these rows (a key's, a tenant's), not counting
    those of server processes known to be gone."""
    live = Session.objects.filter(**rows, **live_sessions_filter(now))
    gone = liveness.gone_ids(set(live.values_list("process", flat=True)), now=now)
    return live.exclude(process__in=gone).count() if gone else live.count()


def key_use_stale(key: ApiKey, now: datetime) -> bool:
    """Whether an open should write the key's ``last_used_at``."""
    return key.last_used_at is None or key.last_used_at <= now - KEY_USE_PRECISION
