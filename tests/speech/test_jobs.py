"""The pool of speech worker processes (speech.jobs), with real worker
processes and no server: where jobs run, how many at once, what waits, what
is refused at once, and what becomes of a worker that crashes or hangs."""
from __future__ import annotations

import asyncio
import os
import signal
import time
from dataclasses import replace
from pathlib import Path

import pytest

from aitp.voice.base import SpeechError
from speech import jobs
from speech.allowance import JOBS_LIMIT, SECONDS_LIMIT, KeyLimits
from speech.jobs import PoolSettings, SpeechPool, pool_settings

from . import speech_jobs
from .conftest import sphinx_config

# Bounds on waiting for a worker process to do something (start, answer,
# exit) on a loaded machine: each wait ends as soon as it happens.
PATIENCE = 60


@pytest.fixture
def make_pool():
    pools: list[SpeechPool] = []

    def make(workers: int = 2, queue: int = 2, timeout: float = PATIENCE, **per_key) -> SpeechPool:
        pool = SpeechPool(PoolSettings(workers=workers, queue=queue, timeout=timeout,
                                       per_key=KeyLimits(**per_key)))
        pools.append(pool)
        return pool

    yield make
    for pool in pools:
        pool.close()


@pytest.fixture
def folder(tmp_path) -> str:
    return str(tmp_path)


def started(folder: str, name: str) -> bool:
    return Path(folder, f"{name}.started").exists()


def wait_until(condition, what: str) -> None:
    deadline = time.monotonic() + PATIENCE
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"never: {what}")
        time.sleep(0.01)


def go(folder: str, *names: str) -> None:
    for name in names:
        Path(folder, f"{name}.go").write_text("")


def gone(pid: int) -> bool:
    """The process ended (a zombie its parent has not reaped yet counts as ended;
    one reaped between opening its stat file and reading it, too)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] == "Z"
    except (FileNotFoundError, ProcessLookupError):
        return True


def refusal(call, *args, **kwargs) -> SpeechError:
    with pytest.raises(SpeechError) as caught:
        call(*args, **kwargs)
    return caught.value


def test_a_job_runs_in_a_worker_process_not_in_the_serving_one(make_pool):
    pool = make_pool(workers=1)
    pid = pool.submit(speech_jobs.pid, ()).result(PATIENCE)
    assert pid != os.getpid()
    assert pool.pids() == [pid]


def test_no_more_jobs_run_at_once_than_there_are_workers(make_pool, folder):
    pool = make_pool(workers=2, queue=2)
    futures = [pool.submit(speech_jobs.hold, (folder, name)) for name in ("a", "b", "c")]
    wait_until(lambda: started(folder, "a") and started(folder, "b"), "two jobs started")
    assert not started(folder, "c"), "the third waits for a worker"
    assert pool.load() == (2, 1)
    go(folder, "a", "b", "c")
    pids = [future.result(PATIENCE) for future in futures]
    assert len(set(pids)) == 2 and set(pids) <= set(pool.pids())


def test_with_the_workers_busy_and_the_queue_full_a_job_is_refused_speech_busy_at_once(make_pool, folder):
    pool = make_pool(workers=2, queue=1)
    futures = [pool.submit(speech_jobs.hold, (folder, name)) for name in ("a", "b", "c")]
    wait_until(lambda: started(folder, "a") and started(folder, "b"), "two jobs started")
    busy = refusal(pool.submit, speech_jobs.pid, ())
    assert busy.code == "speech_busy"
    go(folder, "a", "b", "c")
    for future in futures:
        future.result(PATIENCE)
    # Once the work is done there is room again.
    assert pool.submit(speech_jobs.pid, ()).result(PATIENCE) in pool.pids()


def test_a_job_whose_caller_left_the_queue_frees_its_place_and_never_runs(make_pool, folder):
    pool = make_pool(workers=1, queue=1)
    running = pool.submit(speech_jobs.hold, (folder, "a"))
    wait_until(lambda: started(folder, "a"), "the first job started")
    waiting = pool.submit(speech_jobs.hold, (folder, "b"))
    assert refusal(pool.submit, speech_jobs.pid, ()).code == "speech_busy"
    assert waiting.cancel()
    assert pool.load() == (1, 0)
    after = pool.submit(speech_jobs.hold, (folder, "c"))
    go(folder, "a", "b", "c")
    running.result(PATIENCE)
    after.result(PATIENCE)
    assert not started(folder, "b")


async def test_a_running_job_whose_caller_left_keeps_its_place_until_its_worker_is_done(
        settings, folder):
    settings.OWLLAYER_VOICE_JOBS, settings.OWLLAYER_VOICE_QUEUE = 1, 0
    settings.OWLLAYER_VOICE_JOBS_PER_KEY = 1
    jobs.shutdown()
    try:
        caller = asyncio.create_task(jobs.run(speech_jobs.hold, folder, "a", owner="key-1"))
        await asyncio.to_thread(wait_until, lambda: started(folder, "a"), "the job started")
        caller.cancel()
        with pytest.raises(asyncio.CancelledError):
            await caller
        pool = jobs.get_pool()
        # The worker is still at it: its place and its key's share are taken.
        assert pool.load() == (1, 0) and pool.jobs_of("key-1") == 1
        assert refusal(pool.submit, speech_jobs.pid, (), owner="key-1").code == "speech_rate_limited"
        assert refusal(pool.submit, speech_jobs.pid, ()).code == "speech_busy"
        go(folder, "a")
        await asyncio.to_thread(wait_until, lambda: pool.load() == (0, 0), "the worker is done")
        assert pool.jobs_of("key-1") == 0
        assert await jobs.run(speech_jobs.pid, owner="key-1") in pool.pids()
    finally:
        go(folder, "a")
        jobs.shutdown()


def test_a_key_past_its_jobs_at_once_is_refused_speech_rate_limited_and_another_key_is_not(
        make_pool, folder):
    pool = make_pool(workers=2, queue=2, jobs_at_once=1)
    first = pool.submit(speech_jobs.hold, (folder, "a"), owner="key-1")
    limited = refusal(pool.submit, speech_jobs.pid, (), owner="key-1")
    assert (limited.code, limited.data) == ("speech_rate_limited", {"limit": JOBS_LIMIT})
    other = pool.submit(speech_jobs.pid, (), owner="key-2")
    assert other.result(PATIENCE) in pool.pids()
    go(folder, "a")
    first.result(PATIENCE)
    assert pool.submit(speech_jobs.pid, (), owner="key-1").result(PATIENCE) in pool.pids()


def test_a_key_past_its_seconds_per_minute_is_refused_speech_rate_limited_and_another_key_is_not(
        make_pool):
    pool = make_pool(workers=1, queue=2, seconds_per_minute=5)
    pool.submit(speech_jobs.pid, (), owner="key-1", seconds=3).result(PATIENCE)
    limited = refusal(pool.submit, speech_jobs.pid, (), owner="key-1", seconds=3)
    assert limited.code == "speech_rate_limited"
    assert limited.data["limit"] == SECONDS_LIMIT
    assert 0 < limited.data["retryAfterMs"] <= 60_000
    # What is left of the key's minute still fits, and another key has its own.
    pool.submit(speech_jobs.pid, (), owner="key-1", seconds=2).result(PATIENCE)
    pool.submit(speech_jobs.pid, (), owner="key-2", seconds=3).result(PATIENCE)


def test_a_worker_that_crashes_fails_its_job_speech_failed_and_is_replaced(make_pool):
    pool = make_pool(workers=1)
    before = pool.submit(speech_jobs.pid, ()).result(PATIENCE)
    failed = refusal(pool.submit(speech_jobs.crash, ()).result, PATIENCE)
    assert failed.code == "speech_failed"
    after = pool.submit(speech_jobs.pid, ()).result(PATIENCE)
    assert after != before and pool.pids() == [after]
    wait_until(lambda: gone(before), "the crashed worker is gone")


def test_a_worker_that_died_while_idle_is_replaced_before_the_next_job_which_runs(make_pool):
    pool = make_pool(workers=1)
    before = pool.submit(speech_jobs.pid, ()).result(PATIENCE)
    os.kill(before, signal.SIGKILL)
    wait_until(lambda: before not in pool.pids(), "the killed worker is known to be gone")
    after = pool.submit(speech_jobs.pid, ()).result(PATIENCE)
    assert after != before


def test_a_worker_that_hangs_fails_its_job_speech_timeout_and_is_killed_and_replaced(make_pool):
    pool = make_pool(workers=1, timeout=3)
    before = pool.submit(speech_jobs.pid, ()).result(PATIENCE)
    failed = refusal(pool.submit(speech_jobs.hang, ()).result, PATIENCE)
    assert failed.code == "speech_timeout"
    wait_until(lambda: gone(before), "the hung worker is killed")
    after = pool.submit(speech_jobs.pid, ()).result(PATIENCE)
    assert after != before and pool.pids() == [after]


def test_an_engine_refusal_or_a_bug_in_a_job_reaches_the_caller_and_the_worker_goes_on(make_pool):
    pool = make_pool(workers=1)
    before = pool.submit(speech_jobs.pid, ()).result(PATIENCE)
    assert refusal(pool.submit(speech_jobs.refuse, ()).result, PATIENCE).code == "speech_rejected"
    bug = refusal(pool.submit(speech_jobs.break_down, ()).result, PATIENCE)
    assert bug.code == "speech_failed" and "scripted bug" in bug.detail
    assert pool.submit(speech_jobs.pid, ()).result(PATIENCE) == before


def test_closing_the_pool_fails_its_jobs_and_stops_every_worker(make_pool, folder):
    pool = make_pool(workers=2, queue=2)
    futures = [pool.submit(speech_jobs.hold, (folder, name)) for name in ("a", "b", "c")]
    wait_until(lambda: started(folder, "a") and started(folder, "b"), "two jobs started")
    pids = pool.pids()
    assert len(pids) == 2
    pool.close()
    for future in futures:
        assert refusal(future.result, PATIENCE).code == "speech_unavailable"
    assert all(gone(pid) for pid in pids)
    assert refusal(pool.submit, speech_jobs.pid, ()).code == "speech_unavailable"


def test_a_worker_loads_its_decoder_before_its_first_job_and_keeps_it_across_jobs(settings, caplog):
    settings.OWLLAYER_STT = "pocketsphinx"
    config = sphinx_config()
    # One worker: both jobs find the decoder its warm-up loaded.
    pool = SpeechPool(replace(pool_settings(), workers=1, queue=1, timeout=PATIENCE))
    try:
        first = pool.submit(speech_jobs.decoder_id, (config,)).result(PATIENCE)
        second = pool.submit(speech_jobs.decoder_id, (config,)).result(PATIENCE)
    finally:
        pool.close()
    assert first == second
    assert "could not prepare" not in caplog.text


async def test_run_refuses_at_once_when_the_pool_is_full_instead_of_waiting(settings, folder):
    settings.OWLLAYER_VOICE_JOBS, settings.OWLLAYER_VOICE_QUEUE = 1, 0
    jobs.shutdown()
    try:
        holding = asyncio.create_task(jobs.run(speech_jobs.hold, folder, "a"))
        await asyncio.to_thread(wait_until, lambda: started(folder, "a"), "the job started")
        with pytest.raises(SpeechError) as busy:
            await jobs.run(speech_jobs.pid)
        assert busy.value.code == "speech_busy"
        assert not holding.done()
        go(folder, "a")
        assert await holding in jobs.get_pool().pids()
    finally:
        go(folder, "a")
        jobs.shutdown()


async def test_a_new_pool_setting_takes_effect_for_later_jobs(settings, folder):
    settings.OWLLAYER_VOICE_JOBS, settings.OWLLAYER_VOICE_QUEUE = 1, 0
    jobs.shutdown()
    try:
        first = jobs.get_pool()
        await jobs.run(speech_jobs.pid)
        settings.OWLLAYER_VOICE_JOBS = 3
        holding = [asyncio.create_task(jobs.run(speech_jobs.hold, folder, name)) for name in "abc"]
        await asyncio.to_thread(wait_until, lambda: all(started(folder, n) for n in "abc"), "three at once")
        assert jobs.get_pool() is not first
        go(folder, "a", "b", "c")
        assert len(set(await asyncio.gather(*holding))) == 3
    finally:
        go(folder, "a", "b", "c")
        jobs.shutdown()
