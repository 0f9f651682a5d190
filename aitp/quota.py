"""The monthly token quota, held request by request.

A turn's start is checked against the quota (``aitp.limits``), but one turn
can loop through tool rounds, and forty sessions can start at once: checked
only then, a tenant spent many times its quota. So each model request of a
tenant with a quota first reserves what it may use, and runs only while the
tokens the tenant used this month plus those reserved by requests still
under way stay under the quota; when it ends, its reservation is settled:
released, and the tokens it really used counted in the tenant's day, in one
transaction, so they are never counted twice nor, in between, not at all.

**The estimate** is the request's ``max_tokens`` (the most it may write)
plus its input, estimated at one token per ``CHARS_PER_TOKEN`` characters of
its JSON (system prompt, tools, messages). Usually more than the request
uses (a cached prefix is not counted at all), so the reservation is the
upper bound the check needs; when it is less, the settle counts the truth.

**The bound.** A request starts only while ``used + reserved < quota``, and
every request under way holds its reservation until its real tokens are
counted. When the quota is crossed, it is crossed by the requests already
under way, at most one per live session (a session runs one request at a
time): a tenant spends at most its quota plus one model request per live
session (with estimates at least what requests use, one request in all).
The turn that finds the quota crossed stops between rounds: the spec's
``usage_limit_exceeded``, then ``AGENT_RESPONSE {chunk: "", done: true}``.

**Where the truth is.** The database: the reservation is a row
(``TokenReservation``), inserted, then counted under the tenant's row lock
(PostgreSQL: SELECT ... FOR NO KEY UPDATE; SQLite: the write transaction's
lock, taken by the insert), so the reservations of every process of a
tenant are counted together and two cannot both take the last room. Redis
is not needed, and a Redis outage changes nothing here.

**A process that dies** mid-request leaves its reservation: it stops
counting at ``expires_at`` (``OWLLAYER_TOKEN_RESERVATION_SECONDS`` after it
was made), or sooner, when the sweep (``aitp.processes``) finds its process
gone and deletes it.

**Tenants without a quota** pay nothing: whether the tenant has one is read
with the turn's start check, and a turn of a tenant without one reserves
nothing (no query per request).
"""
from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from functools import cache

from django.db import DatabaseError, connection, transaction
from django.db.models import F, Q, Sum
from django.utils import timezone

from aitp import liveness
from aitp.llm import LlmRequest, Usage
from aitp.models import DailyUsage, ServerProcess, TokenReservation
from aitp.store.statements import table_of
from runtime.config import config
from runtime.db import db_call
from tenants.models import Tenant

logger = logging.getLogger(__name__)

# docs/protocol.md §8: the protocol's own words for a used-up quota.
USAGE_LIMIT_CODE = "usage_limit_exceeded"
USAGE_LIMIT_MESSAGE = "API key usage limit exceeded."
USAGE_LIMIT_REASON = "usage limit exceeded"


# --- the month's tokens ----------------------------------------------------------


@dataclass(frozen=True)
class QuotaStatus:
    quota: int  # 0: unlimited
    used: int
    month: date

    @property
    def unlimited(self) -> bool:
        return not self.quota

    @property
    def used_up(self) -> bool:
        return bool(self.quota) and self.used >= self.quota

    @property
    def remaining(self) -> int | None:
        return None if self.unlimited else max(0, self.quota - self.used)

    @property
    def percent(self) -> int | None:
        return None if self.unlimited else min(100, self.used * 100 // self.quota)


def tenant_quota_status(tenant, *, now: datetime | None = None) -> QuotaStatus:
    """The tenant's quota and the tokens (input + output) counted this
    calendar month, in the project's time zone (DailyUsage's days)."""
    month = timezone.localdate(now or timezone.now()).replace(day=1)
    used = DailyUsage.objects.filter(tenant_id=tenant.pk, date__gte=month).aggregate(
        tokens=Sum(F("input_tokens") + F("output_tokens"))
    )["tokens"] or 0
    return QuotaStatus(quota=tenant.monthly_token_quota or 0, used=int(used), month=month)


def token_quota_used_up(tenant, *, now: datetime | None = None) -> bool:
    """True when the tenant has a quota and this month's tokens reached it."""
    if not tenant.monthly_token_quota:
        return False
    return tenant_quota_status(tenant, now=now).used_up

# The input estimate: characters of the request's JSON per token. Claude's
# tokens average about four characters of English or JSON.
CHARS_PER_TOKEN = 4


def estimate_tokens(request: LlmRequest) -> int:
    """What a request may use: its ``max_tokens`` and its input, estimated."""
    text = json.dumps([request.system, request.tools, request.messages], ensure_ascii=False,
                      separators=(",", ":"))
    return request.max_tokens + -(-len(text) // CHARS_PER_TOKEN)


class QuotaExceeded(Exception):
    """The tenant's quota has no room for the next model request: the turn
    ends as an upstream failure does (an error event, then an empty done)."""

    code = USAGE_LIMIT_CODE
    message = USAGE_LIMIT_MESSAGE
    status = None


# --- the database side (on a database thread: runtime.db) -----------------------------


def _month_start(now: datetime):
    return timezone.localdate(now).replace(day=1)


@cache
def _counted_sql(vendor: str) -> str:
    usage, reservations = table_of(DailyUsage), table_of(TokenReservation)
    u, r = usage.column, reservations.column
    return (
        f"SELECT (SELECT COALESCE(SUM({u['input_tokens']} + {u['output_tokens']}), 0) "
        f"FROM {usage.name} WHERE {u['tenant']} = %s AND {u['date']} >= %s), "
        f"(SELECT COALESCE(SUM({r['tokens']}), 0) FROM {reservations.name} "
        f"WHERE {r['tenant']} = %s AND {r['expires_at']} > %s AND {r['id']} <> %s)"
    )


def used_and_reserved(tenant_id: int, *, now: datetime, besides: int = 0) -> tuple[int, int]:
    """This month's tokens of the tenant (``DailyUsage``, input + output) and
    those reserved by its requests under way (unexpired), but ``besides``."""
    usage, reservations = table_of(DailyUsage), table_of(TokenReservation)
    with connection.cursor() as cursor:
        cursor.execute(_counted_sql(connection.vendor), [
            usage.prep("tenant", tenant_id), usage.prep("date", _month_start(now)),
            reservations.prep("tenant", tenant_id), reservations.prep("expires_at", now),
            besides,
        ])
        used, reserved = cursor.fetchone()
    return int(used), int(reserved)


def reserve(*, tenant_id: int, tokens: int, session_id: str = "", process: str = "",
            now: datetime | None = None) -> int | None:
    """Reserve ``tokens`` against the tenant's quota: the reservation's id,
    or None when the tenant's used and reserved tokens already reach its
    quota (nothing is kept then). A tenant without a quota always gets one."""
    now = now or timezone.now()
    expires_at = now + timedelta(seconds=config().store.token_reservation_seconds)
    with transaction.atomic():
        # The insert first: on SQLite it takes the write lock every other
        # reservation waits for; on PostgreSQL the tenant's row lock below
        # does, held until the commit.
        row = TokenReservation.objects.create(tenant_id=tenant_id, tokens=tokens,
                                              session_id=session_id[:40], process=process,
                                              created_at=now, expires_at=expires_at)
        quota = Tenant.objects.select_for_update(no_key=True).values_list(
            "monthly_token_quota", flat=True).get(pk=tenant_id)
        if not quota:
            return row.pk
        used, reserved = used_and_reserved(tenant_id, now=now, besides=row.pk)
        if used + reserved >= quota:
            transaction.set_rollback(True)
            return None
    return row.pk


def settle(*, reservation_id: int, tenant_id: int, input_tokens: int, output_tokens: int,
           now: datetime | None = None) -> None:
    """A request is over: count the tokens it used in the tenant's day and
    release its reservation, in one transaction."""
    from aitp.store.usage import usage_write_now

    now = now or timezone.now()
    with transaction.atomic():
        usage_write_now(tenant_id, now, input_tokens=input_tokens, output_tokens=output_tokens)
        TokenReservation.objects.filter(pk=reservation_id).delete()


def release(*, reservation_id: int) -> None:
    """A request failed or was cancelled: its reservation stops counting."""
    TokenReservation.objects.filter(pk=reservation_id).delete()


def reservations_sweep(*, gone_processes=(), now: datetime | None = None) -> int:
    """Delete the reservations past their time, and those of server
    processes that are gone: found gone by this sweep, or stopped already;
    returns how many (the sweep, ``aitp.processes``)."""
    now = now or timezone.now()
    gone = [process for process in gone_processes if process]
    stopped = ServerProcess.objects.filter(stopped_at__isnull=False).values("id")
    deleted, _ = TokenReservation.objects.filter(
        Q(expires_at__lte=now) | Q(process__in=gone) | Q(process__in=stopped)).delete()
    return deleted


# --- one session's side, on the event loop --------------------------------------------


@dataclass(frozen=True)
class Reservation:
    id: int
    tokens: int


class TokenQuota:
    """One session's model requests against its tenant's quota. ``limit`` is
    the quota the turn's start check read (``aitp.limits``); 0 reserves
    nothing. The agent calls ``reserve`` before each request, then
    ``settle`` or ``release``, and ``take_counted`` when its turn ends: the
    tokens the settles counted in the tenant's day, which the turn's own
    usage write then leaves out."""

    def __init__(self, *, session_id: str, tenant_id: int) -> None:
        self.session_id = session_id
        self.tenant_id = tenant_id
        self.limit = 0
        self._counted = Usage()
        self._settling: set[asyncio.Task] = set()

    async def reserve(self, request: LlmRequest) -> Reservation | None:
        """A reservation for ``request`` (None: no quota, or the database
        could not answer: the request runs unreserved, counted with its
        turn). Raises QuotaExceeded when the quota has no room for it."""
        if not self.limit:
            return None
        tokens = estimate_tokens(request)
        task = asyncio.get_running_loop().create_task(db_call(
            reserve, tenant_id=self.tenant_id, tokens=tokens, session_id=self.session_id,
            process=liveness.current_id()))
        try:
            # Shielded: a reservation written while the turn was cancelled is
            # released, not left counting until it expires.
            reservation_id = await asyncio.shield(task)
        except asyncio.CancelledError:
            task.add_done_callback(self._release_late)
            raise
        except DatabaseError as exc:
            logger.warning("session %s: tokens not reserved against the quota (%s)",
                           self.session_id, type(exc).__name__)
            return None
        if reservation_id is None:
            logger.info("session %s: model request refused, tenant %s's token quota is used "
                        "or reserved", self.session_id, self.tenant_id)
            raise QuotaExceeded()
        return Reservation(reservation_id, tokens)

    async def settle(self, reservation: Reservation | None, usage: Usage) -> None:
        """The request is over and used ``usage``: its tokens are counted and
        its reservation released (even if the turn is cancelled meanwhile)."""
        if reservation is None:
            return
        task = asyncio.get_running_loop().create_task(self._settle(reservation, usage))
        self._settling.add(task)
        task.add_done_callback(self._settling.discard)
        await asyncio.shield(task)

    async def _settle(self, reservation: Reservation, usage: Usage) -> None:
        try:
            await db_call(settle, reservation_id=reservation.id, tenant_id=self.tenant_id,
                          input_tokens=usage.input_tokens, output_tokens=usage.output_tokens)
        except DatabaseError as exc:
            # Counted with the turn's usage instead; the reservation expires.
            logger.warning("session %s: token reservation not settled (%s)", self.session_id,
                           type(exc).__name__)
            return
        self._counted.input_tokens += usage.input_tokens
        self._counted.output_tokens += usage.output_tokens

    async def release(self, reservation: Reservation | None) -> None:
        """The request failed or was cancelled: its reservation goes (the
        release runs to its end even when the turn is cancelled again)."""
        if reservation is not None:
            await asyncio.shield(self._release_task(reservation.id))

    async def take_counted(self) -> Usage:
        """The tokens this turn's settles counted in the tenant's day (after
        waiting for those still on their way); the count starts again."""
        if self._settling:
            await asyncio.wait(list(self._settling))
        counted, self._counted = self._counted, Usage()
        return counted

    def _release_task(self, reservation_id: int) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(db_call(release, reservation_id=reservation_id))
        task.add_done_callback(self._release_done)
        return task

    def _release_late(self, reserving: asyncio.Task) -> None:
        if not reserving.cancelled() and reserving.exception() is None and reserving.result():
            self._release_task(reserving.result())

    def _release_done(self, task: asyncio.Task) -> None:
        if not task.cancelled() and task.exception() is not None:
            # It still expires, or goes with the sweep.
            logger.warning("session %s: token reservation not released (%s)", self.session_id,
                           type(task.exception()).__name__)
