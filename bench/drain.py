"""Wait until a server has finished the work of the last sample.

The product defers some work past the frame that ends a sample: the session
row is closed by the consumer's teardown after the socket closes, rows may
be written behind the answer. If the baseline's next sample were timed
while that runs, the baseline would pay for the product's work, and the
ratio would flatter the product. So before a baseline sample the run waits
until the product is drained:

- no session row of the run is still open (beyond the ones the phase keeps
  open on purpose), and no tool call of the run lacks its final status;
- the server process is quiet: its CPU time (every thread, from
  /proc/<pid>/task/*/schedstat, in ns) grows by less than QUIET_SHARE of
  the window over QUIET_WINDOW, twice in a row. A process holding thousands
  of idle sessions is never that still (their heartbeats), so a phase that
  holds many may ask for a longer window and a larger share.

Then the run's own client settles its heap (``settle_client_heap``): a
full collection of its own during a sample would stop every page it drives
at once and land on whichever side is being timed.

Every wait is bounded: a server that never drains is a failed run, not a
hang. The clock, the sleep and the two probes are parameters, so the tests
check the logic with fakes.
"""
from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

QUIET_WINDOW = 0.01
QUIET_SHARE = 0.1  # of one core over the window: idle apart from timers
QUIET_WINDOWS_IN_A_ROW = 2
ROWS_POLL = 0.02
# Closing thousands of sessions on a loaded machine takes minutes; longer is a hang.
DRAIN_TIMEOUT = 900.0


class NotDrained(RuntimeError):
    pass


def process_cpu_seconds(pid: int) -> float:
    """CPU time of every thread of ``pid`` so far, in seconds (ns precision)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue  # the thread ended while we read
    return total / 1e9


def settle_client_heap() -> None:
    """Before a sample: what the client holds now (the frames it keeps for
    the schema check, hundreds of thousands by the end of a run) is
    collected once and frozen, so that a full collection during the sample
    walks only what the sample makes. Unfrozen, those collections grew to
    half a second over a full run, each one a stall of every page at once."""
    gc.collect()
    gc.freeze()


@dataclass
class RunRows:
    """What the run left in the database, as two counts (for the drain)."""

    open_sessions: int
    unfinished_calls: int


def run_rows(tenant_id: int) -> RunRows:
    """The run's open session rows and tool calls without a final status."""
    from django.db import close_old_connections

    from aitp.models import Session, ToolCall

    close_old_connections()
    return RunRows(
        open_sessions=Session.objects.filter(tenant_id=tenant_id, ended_at__isnull=True).count(),
        unfinished_calls=ToolCall.objects.filter(session__tenant_id=tenant_id)
        .exclude(status__in=ToolCall.FINAL_STATUSES).count(),
    )


class Drainer:
    def __init__(
        self,
        *,
        rows: Callable[[], Awaitable[RunRows]] | None,
        cpu_seconds: Callable[[int], float] = process_cpu_seconds,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        clock: Callable[[], float] = time.monotonic,
        timeout: float = DRAIN_TIMEOUT,
    ) -> None:
        self.rows = rows
        self.cpu_seconds = cpu_seconds
        self.sleep = sleep
        self.clock = clock
        self.timeout = timeout
        self.drains = 0

    async def drain(self, pids: list[int], *, open_sessions: int = 0,
                    window: float = QUIET_WINDOW, share: float = QUIET_SHARE) -> None:
        """Return once the rows are written and closed (at most ``open_sessions``
        still open: the ones the phase holds) and every process is quiet."""
        deadline = self.clock() + self.timeout
        if self.rows is not None:
            while True:
                rows = await self.rows()
                if rows.open_sessions <= open_sessions and rows.unfinished_calls == 0:
                    break
                if self.clock() > deadline:
                    raise NotDrained(f"after {self.timeout}s {rows.open_sessions} sessions are "
                                     f"still open and {rows.unfinished_calls} tool calls "
                                     "unfinished")
                await self.sleep(ROWS_POLL)
        for pid in pids:
            await self.quiet(pid, deadline, window, share)
        settle_client_heap()
        self.drains += 1

    async def quiet(self, pid: int, deadline: float, window: float = QUIET_WINDOW,
                    share: float = QUIET_SHARE) -> None:
        in_a_row = 0
        before = self.cpu_seconds(pid)
        while in_a_row < QUIET_WINDOWS_IN_A_ROW:
            await self.sleep(window)
            now = self.cpu_seconds(pid)
            in_a_row = in_a_row + 1 if now - before < window * share else 0
            before = now
            if self.clock() > deadline:
                raise NotDrained(f"process {pid} still busy after {self.timeout}s")
