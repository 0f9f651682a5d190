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
which cost more CPU in the event loop than a short query). With
PostgreSQL's pool (``CONN_MAX_AGE`` 0) that hands the connection back to the
pool after every call instead of closing it, so a
thread holds a connection only while it works; with SQLite each thread keeps
its own connection open (``CONN_MAX_AGE`` None) and only drops a broken one.

Usage: ``await db_call(store.current().session_open, raw_key=..., info=...)``.
"""
from __future__ import annotations

import asyncio
import contextvars
import functools
import queue
import threading
import time
from collections.abc import Callable
from typing import ParamSpec, TypeVar

from channels.consumer import get_handler_name
from channels.db import aclose_old_connections
from django.db import close_old_connections

from runtime import metrics
from runtime.config import config

P = ParamSpec("P")
R = TypeVar("R")


class DatabaseThreads:
    """A fixed set of threads taking calls from one queue.

    ``concurrent.futures.ThreadPoolExecutor`` would do, but each of its
    submits takes a semaphore and a condition lock that its threads hold in
    turn, and with thousands of sessions the event loop stalls on them (a
    lock convoy with the GIL). Here a submit is one put on a lock-free
    ``SimpleQueue``; the result comes back with ``call_soon_threadsafe``.
    """

    def __init__(self, workers: int) -> None:
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()
        self.threads = [
            threading.Thread(target=self._work, name=f"owllayer-db_{n}", daemon=True)
            for n in range(workers)
        ]
        for thread in self.threads:
            thread.start()

    def submit(self, loop: asyncio.AbstractEventLoop, call: Callable[[], R]) -> asyncio.Future:
        future = loop.create_future()
        self.jobs.put((loop, future, call))
        return future

    def _work(self) -> None:
        while True:
            job = self.jobs.get()
            if job is None:
                return
            loop, future, call = job
            if future.cancelled():
                continue  # its caller stopped waiting before it started
            try:
                result, error = call(), None
            except BaseException as exc:  # handed to the caller, as an executor would
                result, error = None, exc
            try:
                loop.call_soon_threadsafe(_settle, future, result, error)
            except RuntimeError:
                pass  # the loop is closed: nobody waits any more
            del job, loop, future, call, result, error

    def shutdown(self, *, wait: bool = True) -> None:
        for _ in self.threads:
            self.jobs.put(None)
        if wait:
            for thread in self.threads:
                thread.join()


def _settle(future: asyncio.Future, result, error: BaseException | None) -> None:
    if future.cancelled():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


_threads: DatabaseThreads | None = None
_lock = threading.Lock()
_exit_hook_set = False


def threads() -> DatabaseThreads:
    """This process's database threads, started on first use. At exit, what
    they have taken finishes before the interpreter goes (as with
    ``ThreadPoolExecutor``, whose exit hook this uses too)."""
    global _threads, _exit_hook_set
    if _threads is None:
        with _lock:
            if _threads is None:
                _threads = DatabaseThreads(config().store.db_threads)
                if not _exit_hook_set:
                    threading._register_atexit(shutdown)
                    _exit_hook_set = True
    return _threads


async def db_call(fn: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs) -> R:
    """Run the sync ``fn`` (one service call, one transaction) on a database
    thread and return its result.

    A cancelled caller stops waiting, but a call already running finishes
    (a thread cannot be interrupted): its transaction commits or rolls back
    whole, as before. A call whose caller was cancelled before it started
    does not run.
    """
    call = functools.partial(contextvars.copy_context().run, _in_thread, fn, args, kwargs)
    started = time.monotonic()
    try:
        return await threads().submit(asyncio.get_running_loop(), call)
    finally:
        metrics.database_call(time.monotonic() - started)


def _in_thread(fn: Callable[..., R], args: tuple, kwargs: dict) -> R:
    close_old_connections()
    try:
        return fn(*args, **kwargs)
    finally:
        close_old_connections()


def shutdown(*, wait: bool = True) -> None:
    """Stop the database threads (tests; a process that is about to exit)."""
    global _threads
    with _lock:
        pool, _threads = _threads, None
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
