"""Speech jobs run in a pool of OWLLAYER_VOICE_JOBS threads, never more at once, never on the loop."""
from __future__ import annotations

import asyncio
import threading

import pytest

from aitp.voice import jobs


@pytest.fixture(autouse=True)
def fresh_pool():
    jobs.shutdown()
    yield
    jobs.shutdown()


class Occupancy:
    """Counts how many jobs are inside at once."""

    def __init__(self) -> None:
        self.inside = 0
        self.most = 0
        self.lock = threading.Lock()

    def job(self, release: threading.Event) -> str:
        with self.lock:
            self.inside += 1
            self.most = max(self.most, self.inside)
        try:
            release.wait(timeout=60)
            return threading.current_thread().name
        finally:
            with self.lock:
                self.inside -= 1


async def test_no_more_jobs_run_at_once_than_the_setting_allows(settings):
    settings.OWLLAYER_VOICE_JOBS = 2
    occupancy = Occupancy()
    release = threading.Event()
    running = [asyncio.create_task(jobs.run(occupancy.job, release)) for _ in range(5)]
    # Wait (on events, not a clock) until the pool is full, then let them all finish.
    while occupancy.most < 2:
        await asyncio.sleep(0.01)
    assert occupancy.inside == 2, "the other three wait their turn"
    release.set()
    names = await asyncio.gather(*running)
    assert occupancy.most == 2
    assert all(name.startswith("voice") for name in names)


async def test_the_event_loop_keeps_running_while_every_job_is_busy(settings):
    settings.OWLLAYER_VOICE_JOBS = 1
    occupancy = Occupancy()
    release = threading.Event()
    busy = asyncio.create_task(jobs.run(occupancy.job, release))
    while occupancy.inside < 1:
        await asyncio.sleep(0.01)
    # The loop still serves other work while the only job thread is taken.
    assert await asyncio.wait_for(asyncio.sleep(0, result="frame"), timeout=30) == "frame"
    assert not busy.done()
    release.set()
    await busy


async def test_a_new_size_setting_takes_effect_for_later_jobs(settings):
    settings.OWLLAYER_VOICE_JOBS = 1
    occupancy = Occupancy()
    release = threading.Event()
    release.set()
    await jobs.run(occupancy.job, release)
    settings.OWLLAYER_VOICE_JOBS = 3
    release.clear()
    running = [asyncio.create_task(jobs.run(occupancy.job, release)) for _ in range(3)]
    while occupancy.most < 3:
        await asyncio.sleep(0.01)
    release.set()
    await asyncio.gather(*running)
    assert occupancy.most == 3
