"""This server process: its row, its live connections, its clean stop, and
the sweep that tidies up after processes that are gone.

A process serving pages registers a ``ServerProcess`` row when it starts
(``owllayer_site.serve``), refreshes it every heartbeat interval and marks
it stopped when it exits cleanly. Every session row names the process
holding it. A process is gone when

- its row says it stopped; or
- it ran on this host (same host name and pid namespace) and its pid is
  not running any more, or runs a process that started after the row was
  registered (the pid was reused); or
- its row was not refreshed for three heartbeat intervals (another host,
  or a process that hangs).

The sweep (at start-up, before serving, and periodically in every process)
closes the rows of gone processes whatever their age, so a key's session
cap is free as soon as the process that held the sessions is known to be
gone; their tool calls get a final status and their approvals are closed
with an audit event. The tokens they had reserved against their tenants'
quotas (``aitp.quota``) stop counting, as do reservations past their time.

On SIGTERM the process drains (``drain``): every open page is told
``SYSTEM_EVENT disconnect`` and closed with 1001, which the client answers
by reconnecting (to another process behind the proxy); running turns are
cancelled with every tool call given its final status; what served the
turns beside this process's connections is stopped (``stop_after_drain``:
the speech worker processes, which the serving entry point registers); then
the rows left are closed and the process is marked stopped.

The tenants' usage counts this process added up (``aitp.store.usage``)
are written every ``OWLLAYER_USAGE_FLUSH_INTERVAL`` by a timer and at the
clean stop, before the process is marked stopped.

The heartbeats of this process's sessions (each marks its row seen and
re-checks its key every heartbeat interval) are gathered: the sessions that
beat within a fifth of a second share one database call
(``session_heartbeat``).

Served by something other than ``owllayer_site.serve`` (tests'
in-process communicators, another ASGI server), no process is registered:
sessions carry no process and only the heartbeat rule applies to them.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import socket
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Protocol

from django.db import DatabaseError
from django.db.models import Q
from django.utils import timezone

from aitp import budgets, liveness, ports, quota, services, store
from aitp.close_codes import CLOSE_ABNORMAL
from aitp.liveness import (  # noqa: F401  (the liveness rules, as this module offered them)
    START_TIME_TOLERANCE,
    PidState,
    current_id,
    gone_ids,
    hostname,
    is_gone,
    pid_state,
)
from aitp.models import ServerProcess, Session
from runtime import metrics
from runtime.config import config
from runtime.db import db_call

logger = logging.getLogger(__name__)

# Rows of processes stopped longer ago than this are deleted by the sweep.
KEEP_STOPPED = timedelta(days=7)
SHUTDOWN_MESSAGE = "The server is restarting; reconnecting."


# --- this process ------------------------------------------------------------

_stopped = False


def register() -> ServerProcess:
    """Record this process as serving; its id goes on every session it opens."""
    pid = os.getpid()
    process_id = f"{socket.gethostname()[:80]}:{pid}:{secrets.token_hex(4)}"
    now = timezone.now()
    row = ServerProcess.objects.create(
        id=process_id, hostname=hostname(), pid=pid, started_at=now, last_seen_at=now,
    )
    liveness.set_current_id(row.id)
    logger.info("server process %s registered", row.id)
    return row


def mark_alive() -> None:
    if current_id():
        ServerProcess.objects.filter(id=current_id(), stopped_at__isnull=True).update(
            last_seen_at=timezone.now()
        )


def mark_stopped(*, reason: str = "server shutting down") -> int:
    """The clean end of this process: close the session rows it still holds
    (with their calls), mark it stopped, close the approvals of ended
    sessions. Returns how many session rows were still open."""
    global _stopped
    # The usage counts this process added up and has not written yet.
    store.current().usage_flush_logged()
    if not current_id():
        return 0

    # Done again at exit: a handshake that was being written while the
    # connections drained may have opened a row since.
    closed = services.sessions_close_of_processes(
        process_ids=[current_id()], code=1001, reason=reason, mark_stopped=True,
    )
    ports.approvals().close_of_ended_sessions()
    if not _stopped or closed:
        logger.info("server process %s stopped (%d session rows closed)", current_id(), closed)
    _stopped = True
    return closed


# --- the sweep -------------------------------------------------------------------


@dataclass(frozen=True)
class SweepResult:
    processes: int  # processes found gone
    sessions: int  # session rows closed
    approvals: int  # approvals closed because their session ended
    expired: int  # approvals past their deadline
    reservations: int = 0  # token reservations of gone processes, or past their time


def sweep(*, now: datetime | None = None) -> SweepResult:
    """Close what processes that are gone left open. Safe to run at any time,
    from several processes at once."""
    now = now or timezone.now()
    here = hostname()
    # Processes not known to be stopped, and any process still holding an open row.
    holding = Session.objects.filter(ended_at__isnull=True).values("process")
    candidates = ServerProcess.objects.filter(Q(stopped_at__isnull=True) | Q(id__in=holding))
    gone = [row.id for row in candidates if is_gone(row, now=now, this_host=here)]
    closed = 0
    # The approvals closed with the session rows, with their calls.
    closing = services.Closing()
    if gone:
        closed += services.sessions_close_of_processes(
            process_ids=gone, code=CLOSE_ABNORMAL, reason="server process lost", mark_stopped=True, now=now,
            closing=closing,
        )
        logger.warning("server processes gone: %s (%d session rows closed)", ", ".join(gone), closed)
    closed += services.sessions_close_stale(now=now, closing=closing)
    reservations = quota.reservations_sweep(gone_processes=gone, now=now)
    ServerProcess.objects.filter(stopped_at__lt=now - KEEP_STOPPED).delete()
    closed_approvals = closing.approvals + ports.approvals().close_of_ended_sessions()
    expired = ports.approvals().expire_overdue()
    return SweepResult(len(gone), closed, closed_approvals, expired, reservations)


# --- live connections and the drain -------------------------------------------------


# --- the heartbeats of this process's sessions, one query for many ------------


def sessions_heartbeat(session_ids: list[str]) -> dict[str, object]:
    """Mark these sessions seen now and re-check their keys, in two queries
    whatever their number: {session_id: the Refusal that ends it} for those
    that must end (an unknown session, a key revoked, expired, or no longer
    allowing its origin)."""
    now = timezone.now()
    Session.objects.filter(id__in=session_ids, ended_at__isnull=True).update(last_seen_at=now)
    rows = {row.id: row for row in Session.objects.select_related("api_key").filter(id__in=session_ids)}
    refusals: dict[str, object] = {}
    for session_id in session_ids:
        row = rows.get(session_id)
        if row is None:
            refusals[session_id] = services.Refusal(
                "session_ended", "This session no longer exists.", "session ended")
            continue
        refusal = services.api_key_refusal(row.api_key, origin=row.origin, now=now)
        if refusal is not None:
            refusals[session_id] = refusal
    return refusals


class SessionHeartbeats:
    """The heartbeats of this process's sessions, gathered: each session asks
    on its own clock, and the asks of one ``window`` are answered by one
    ``sessions_heartbeat`` call (at 5,000 sessions, a few calls a second
    instead of hundreds). Per event loop, as the futures belong to one."""

    WINDOW = 0.2
    BATCH = 500

    def __init__(self) -> None:
        self.waiting: dict[str, list[asyncio.Future]] = {}
        self.flusher: asyncio.Task | None = None

    async def beat(self, session_id: str):
        """This session was seen; the Refusal that must end it, or None."""
        future = asyncio.get_running_loop().create_future()
        self.waiting.setdefault(session_id, []).append(future)
        if self.flusher is None or self.flusher.done():
            self.flusher = asyncio.create_task(self._flush_soon())
        return await future

    async def _flush_soon(self) -> None:
        await asyncio.sleep(self.WINDOW)
        while self.waiting:
            ids = list(self.waiting)[: self.BATCH]
            futures = {session_id: self.waiting.pop(session_id) for session_id in ids}
            try:
                refusals = await db_call(sessions_heartbeat, ids)
            except Exception as exc:
                for waiting in futures.values():
                    for future in waiting:
                        if not future.done():
                            future.set_exception(exc)
                continue
            for session_id, waiting in futures.items():
                for future in waiting:
                    if not future.done():
                        future.set_result(refusals.get(session_id))


_heartbeats: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


async def session_heartbeat(session_id: str):
    """One session's heartbeat (see SessionHeartbeats): the Refusal that must
    end it, or None. Raises what the database raised."""
    loop = asyncio.get_running_loop()
    heartbeats = _heartbeats.get(loop)
    if heartbeats is None:
        heartbeats = _heartbeats[loop] = SessionHeartbeats()
    return await heartbeats.beat(session_id)


class Connection(Protocol):
    async def shutdown(self, message: str) -> None:
        """Tell the peer the server is going away, close with 1001, and
        finish everything the connection owns."""


_connections: weakref.WeakSet = weakref.WeakSet()
_draining = False
_timers: list[asyncio.Task] = []
# Stopped by the drain once the turns that used them are over (blocking, each
# on a thread): registered from above this app, which owns what they stop.
_after_drain: list[Callable[[], None]] = []


def connection_opened(connection: Connection) -> None:
    _connections.add(connection)


def connection_closed(connection: Connection) -> None:
    _connections.discard(connection)


def stop_after_drain(stop: Callable[[], None]) -> None:
    """Have the drain call ``stop`` (blocking, on a thread) once the
    connections are closed, before this process is marked stopped (once,
    however often it is registered)."""
    if stop not in _after_drain:
        _after_drain.append(stop)


def draining() -> bool:
    """True once this process stopped serving: a connection opened now is
    closed at once (with 1001, so its client goes elsewhere)."""
    return _draining


def start_timers(loop: asyncio.AbstractEventLoop | None = None) -> None:
    """Refresh this process's row every OWLLAYER_HEARTBEAT_INTERVAL, sweep
    every OWLLAYER_SWEEP_INTERVAL, write the usage counts added up every
    OWLLAYER_USAGE_FLUSH_INTERVAL and check the tenants' monthly budgets every
    OWLLAYER_BUDGET_CHECK_INTERVAL, on the serving event loop."""
    loop = loop or asyncio.get_event_loop()
    _timers.append(loop.create_task(_every(config().store.heartbeat_interval, _heartbeat)))
    _timers.append(loop.create_task(_every(config().store.sweep_interval, _sweep)))
    if config().store.usage_flush_interval > 0:
        _timers.append(loop.create_task(
            _every(config().store.usage_flush_interval, _usage_flush)))
    if config().store.budget_check_interval > 0:
        _timers.append(loop.create_task(
            _every(config().store.budget_check_interval, _budgets_check)))


async def _every(interval: float, job) -> None:
    while True:
        await asyncio.sleep(interval)
        try:
            await job()
        except DatabaseError:
            logger.warning("server process %s: database unavailable for %s", current_id(),
                           job.__name__.strip("_"), exc_info=True)
        except Exception:
            logger.exception("server process %s: %s failed", current_id(), job.__name__.strip("_"))


async def _heartbeat() -> None:
    await db_call(mark_alive)


async def _usage_flush() -> None:
    # Only when something is pending: an idle process makes no database call.
    if store.current().usage_pending():
        await db_call(store.current().usage_flush)


async def _budgets_check() -> None:
    # On a database thread: it sends too (SMTP, the webhook), never on the loop.
    # Every process runs it; the alert's unique row makes one of them the sender.
    await db_call(budgets.budgets_check, timezone.now())


async def _sweep() -> None:
    result = await db_call(sweep)
    if result.sessions or result.approvals or result.expired or result.reservations:
        logger.info("sweep: %s", result)


async def drain(timeout: float | None = None) -> None:
    """Stop serving: close every live connection as a restart (1001), wait
    for their turns to end and their rows to close, at most ``timeout``
    seconds (OWLLAYER_SHUTDOWN_DRAIN); then close what is left and mark this
    process stopped."""
    global _draining
    _draining = True
    metrics.draining(True)
    timeout = config().store.shutdown_drain if timeout is None else timeout
    for timer in _timers:
        timer.cancel()
    for timer in _timers:
        with contextlib.suppress(asyncio.CancelledError):
            await timer
    connections = list(_connections)
    logger.info("shutting down: closing %d connections (drain %ss)", len(connections), timeout)
    if connections:
        tasks = [asyncio.ensure_future(c.shutdown(SHUTDOWN_MESSAGE)) for c in connections]
        done, pending = await asyncio.wait(tasks, timeout=timeout)
        for task in done:
            if not task.cancelled() and task.exception() is not None:
                logger.error("shutdown of a connection failed", exc_info=task.exception())
        if pending:
            # Their rows are closed below; daphne then cancels what is left.
            logger.warning("%d connections still closing after the drain time", len(pending))
            for task in pending:
                task.cancel()
    # What served the turns (the speech workers), once the turns are over.
    for stop in _after_drain:
        await asyncio.to_thread(stop)
    try:
        await db_call(mark_stopped)
    except DatabaseError:
        logger.exception("server process %s: could not record its stop", current_id())
