"""Where async code runs its database work: a bounded pool of threads.

Channels' ``database_sync_to_async`` runs every call of a process on one
thread by default (thread-sensitive mode), so at fifty sessions each one waits
in line behind the others' writes while the database sits idle. Here the
calls of different sessions run side by side on ``OWLLAYER_DB_THREADS``
threads; a service is one transaction and shares nothing with another
thread, so nothing needs the single thread.

Before and after each call, ``close_old_connections`` ends a connection that
is broken or past ``CONN_MAX_AGE`` (what Channels' ``DatabaseSyncToAsync``
does, without its per-call wrapper object and thread-sensitivity machinery,
which cost more CPU in the event loop than a short query). With PostgreSQL's pool (``CONN_MAX_AGE`` 0) that hands the
connection back to the pool after every call instead of closing it, so a
thread holds a connection only while it works; with SQLite each thread keeps
its own connection open (``CONN_MAX_AGE`` None) and only drops a broken one.

Usage: ``await db_call(services.session_open, raw_key=..., info=...)``.
"""
from __future__ import annotations

import asyncio
import contextvars
import functools
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

from channels.consumer import get_handler_name
from channels.db import aclose_old_connections
from django.conf import settings
from django.db import close_old_connections

P = ParamSpec("P")
R = TypeVar("R")

_executor: ThreadPoolExecutor | None = None
_lock = threading.Lock()


def executor() -> ThreadPoolExecutor:
    """This process's database threads, started on first use."""
    global _executor
    if _executor is None:
        with _lock:
            if _executor is None:
                _executor = ThreadPoolExecutor(
                    max_workers=settings.OWLLAYER_DB_THREADS, thread_name_prefix="owllayer-db"
                )
    return _executor


async def db_call(fn: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs) -> R:
    """Run the sync ``fn`` (one service call, one transaction) on a database
    thread and return its result.

    A cancelled caller stops waiting, but a call already running finishes
    (a thread cannot be interrupted): its transaction commits or rolls back
    whole, as before.
    """
    call = functools.partial(contextvars.copy_context().run, _in_thread, fn, args, kwargs)
    return await asyncio.get_running_loop().run_in_executor(executor(), call)


def _in_thread(fn: Callable[..., R], args: tuple, kwargs: dict) -> R:
    close_old_connections()
    try:
        return fn(*args, **kwargs)
    finally:
        close_old_connections()


def shutdown(*, wait: bool = True) -> None:
    """Stop the database threads (tests; a process that is about to exit)."""
    global _executor
    with _lock:
        pool, _executor = _executor, None
    if pool is not None:
        pool.shutdown(wait=wait)


# How often a consumer still tidies the connection of Channels' shared sync
# thread (see DbCallConsumer).
SHARED_THREAD_CLEANUP_INTERVAL = 1.0
_shared_thread_cleaned_at = 0.0


class DbCallConsumer:
    """Mix in before a Channels consumer class whose database work all goes
    through ``db_call``.

    Channels runs ``close_old_connections`` before every message a consumer
    handles, on its one shared sync thread: every frame of every session
    would queue there behind the others. ``db_call`` already tidies around
    each call, so here it runs at most once a second per process, for what
    still uses that thread (the async ORM, ``database_sync_to_async``).
    """

    async def dispatch(self, message) -> None:
        global _shared_thread_cleaned_at
        handler = getattr(self, get_handler_name(message), None)
        if handler is None:
            raise ValueError(f"No handler for message type {message['type']}")
        now = time.monotonic()
        if now - _shared_thread_cleaned_at >= SHARED_THREAD_CLEANUP_INTERVAL:
            _shared_thread_cleaned_at = now
            await aclose_old_connections()
        await handler(message)
