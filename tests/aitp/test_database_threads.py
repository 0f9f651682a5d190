"""The database threads (runtime.db): a call runs on one of them, its result or
error comes back to the caller, and a caller that stops waiting never stops
a call that already runs."""
from __future__ import annotations

import asyncio
import threading

import pytest

from runtime import db

# A bound against a hang only: a working path never comes near it.
PATIENCE = 30


@pytest.fixture
def one_database_thread(settings):
    db.shutdown()
    settings.OWLLAYER_DB_THREADS = 1
    yield
    db.shutdown()


async def test_a_call_runs_on_a_database_thread_not_the_event_loops(one_database_thread):
    name = await db.db_call(lambda: threading.current_thread().name)
    assert name.startswith("owllayer-db_")
    assert name != threading.current_thread().name


async def test_a_cancelled_caller_lets_its_running_call_finish(one_database_thread):
    started, release, finished = threading.Event(), threading.Event(), threading.Event()

    def work() -> None:
        started.set()
        release.wait(PATIENCE)
        finished.set()

    caller = asyncio.create_task(db.db_call(work))
    assert await asyncio.to_thread(started.wait, PATIENCE)
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    release.set()
    assert await asyncio.to_thread(finished.wait, PATIENCE)
    # The thread is free again for the next call.
    assert await asyncio.wait_for(db.db_call(lambda: "next"), PATIENCE) == "next"


async def test_a_call_whose_caller_left_before_it_started_never_runs(one_database_thread):
    busy, release = threading.Event(), threading.Event()
    ran: list[str] = []

    def hold() -> None:
        busy.set()
        release.wait(PATIENCE)

    holder = asyncio.create_task(db.db_call(hold))
    assert await asyncio.to_thread(busy.wait, PATIENCE)
    waiting = asyncio.create_task(db.db_call(ran.append, "late"))
    await asyncio.sleep(0)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    release.set()
    await holder
    # Calls run in order: once this one ran, the cancelled one was skipped.
    assert await db.db_call(ran.append, "after") is None
    assert ran == ["after"]


async def test_an_error_of_any_kind_reaches_the_caller(one_database_thread):
    def stop() -> None:
        raise SystemExit(3)

    with pytest.raises(SystemExit):
        await db.db_call(stop)
    assert await db.db_call(divmod, 9, 4) == (2, 1)
