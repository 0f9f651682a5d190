"""The tenants' daily usage counts (``DailyUsage``): written behind by the
fast store (``UsageBuffer``), at once by the plain one and by a model
request's settle against the quota (``usage_write_now``)."""
from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from datetime import date, datetime

from django.db import DatabaseError, connection
from django.db.models import F
from django.utils import timezone

from aitp.models import DailyUsage
from runtime.config import config

logger = logging.getLogger(__name__)

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
        interval = config().store.usage_flush_interval
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


