"""One connection's fixed-window counters (aitp.limits.ConnectionWindows):
the counting of limits' fixed window over a memory store, on a stopped clock."""
from __future__ import annotations

import pytest
from limits import RateLimitItemPerMinute, RateLimitItemPerSecond

from aitp import limits


class StoppedClock:
    def __init__(self) -> None:
        self.now = 1_900_000_000.0

    def time(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch) -> StoppedClock:
    stopped = StoppedClock()
    monkeypatch.setattr(limits, "time", stopped)
    return stopped


def test_a_window_allows_its_amount_and_refuses_the_next_hit(clock):
    windows = limits.ConnectionWindows()
    three = RateLimitItemPerSecond(3)
    assert [windows.hit(three, "frames") for _ in range(4)] == [True, True, True, False]
    stats = windows.get_window_stats(three, "frames")
    assert (stats.remaining, stats.reset_time) == (0, clock.now + 1)


def test_a_window_opens_again_once_its_period_from_the_first_hit_is_over(clock):
    windows = limits.ConnectionWindows()
    one = RateLimitItemPerMinute(1)
    assert windows.hit(one, "inputs")
    clock.now += 59
    assert not windows.hit(one, "inputs")
    clock.now += 1
    assert windows.hit(one, "inputs")
    assert windows.get_window_stats(one, "inputs").remaining == 0


def test_counters_of_other_names_and_limits_are_apart(clock):
    windows = limits.ConnectionWindows()
    one, two = RateLimitItemPerSecond(1), RateLimitItemPerSecond(2)
    assert windows.hit(one, "approvals", "call_a")
    assert windows.hit(one, "approvals", "call_b")
    assert not windows.hit(one, "approvals", "call_a")
    assert windows.hit(two, "approvals", "call_a")
    assert windows.get_window_stats(two, "never").remaining == 2


def test_expired_windows_are_forgotten_once_there_are_many(clock):
    windows = limits.ConnectionWindows()
    one = RateLimitItemPerSecond(1)
    for n in range(limits.ConnectionWindows.PRUNE_ABOVE + 1):
        windows.hit(one, "approvals", f"call_{n}")
    clock.now += 1
    windows.hit(one, "approvals", "call_new")
    assert len(windows.windows) == 1
