"""Refusals that come in floods, logged once per window with their count.

A connection that floods is refused frame by frame (frames dropped, invalid
frames, user inputs and approval requests over their limits, audio too
fast), and a script reconnecting is refused open by open; a log line for
each would turn one socket's flood into a flood of the log. Each kind of
refusal is counted instead, per connection (per key for session opens), and
written as one line per ``OWLLAYER_FLOOD_LOG_INTERVAL`` seconds while it
lasts, with its count::

    session ses_ab12: 2,940 frames dropped in the last 60 s (over 30 a second)

A window opens at its first refusal and is written when it ends, or sooner
when the connection ends (``close``), so a flood always leaves its line.
Nothing is kept, and no timer runs, for a kind that is not being refused.
"""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field


@dataclass
class _Window:
    subject: str
    what: str
    detail: str
    level: int
    started: float
    count: int = 0
    timer: asyncio.TimerHandle | None = field(default=None, repr=False)


class FloodLog:
    """Counts of refusals by kind (any hashable key), each written as one
    line per ``interval`` seconds to ``logger``."""

    def __init__(self, logger: logging.Logger, interval: float) -> None:
        self._logger = logger
        self._interval = interval
        self._windows: dict[object, _Window] = {}

    def count(self, kind: object, *, subject: str, what: str, detail: str = "",
              level: int = logging.INFO, times: int = 1) -> None:
        """``times`` more refusals of ``kind`` (``subject``: whose, e.g.
        "session ses_1"; ``what``: the refusals, e.g. "frames dropped";
        ``detail``: why, e.g. "over 30 a second"). The subject is the latest
        given. Call on the event loop (the window's end is a timer of it)."""
        window = self._windows.get(kind)
        if window is None:
            window = self._windows[kind] = _Window(subject, what, detail, level, time.monotonic())
            window.timer = asyncio.get_running_loop().call_later(self._interval, self._due, kind)
        window.subject = subject
        window.count += times

    def counted(self, kind: object) -> int:
        """Refusals of ``kind`` in the window not written yet."""
        window = self._windows.get(kind)
        return 0 if window is None else window.count

    def close(self) -> None:
        """Write every open window now (the connection is ending)."""
        for kind in list(self._windows):
            self._write(kind)

    def _due(self, kind: object) -> None:
        if kind in self._windows:
            self._windows[kind].timer = None
            self._write(kind)

    def _write(self, kind: object) -> None:
        window = self._windows.pop(kind)
        if window.timer is not None:
            window.timer.cancel()
        elapsed = max(1, round(time.monotonic() - window.started))
        detail = f" ({window.detail})" if window.detail else ""
        self._logger.log(window.level, "%s: %s %s in the last %d s%s", window.subject,
                         f"{window.count:,}", window.what, elapsed, detail)
