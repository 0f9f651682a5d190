"""The session row, written behind the connection.

The session machine and the agent hold the live values (the page, the turn's
state); ``SessionRowWriter`` writes them to the ``Session`` row at most once
per ``ROW_WRITE_INTERVAL``, in a task of its own, so neither the page's next
frame nor the turn waits for the database. Only the latest values are
written, every URL visited in between is kept for the page history, and
watchers are told after the row changed. The consumer owns one per
connection and lets the last write land (``flush()``) before the row ends.
The writes of all connections of the process that meet in time go to the
database in one call (``aitp.group_write``).
"""
from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from django.utils import timezone

from aitp import services
from aitp.group_write import GroupWrite
from aitp.session import ContextChanged

# The session row (page snapshot, turn state) is written at most this often;
# the connection holds the live values, the row is for watchers and the record.
# A turn passes through three or four states: written each time, they were a
# third of a busy process's database calls; a watcher sees them at most this late.
ROW_WRITE_INTERVAL = 1.0

# The writes of every connection of this process: those asked for while one
# is on its way go together, in one database call.
LIVE_ROWS = GroupWrite(services.sessions_write_live)


class SessionRowWriter:
    def __init__(self, *, own: Callable[[asyncio.Task, str], asyncio.Task]) -> None:
        self._own = own
        self.session_id: str | None = None
        self.feed = None  # the WatcherFeed, once the session is open
        self.state = "idle"
        self._snapshot: ContextChanged | None = None
        self._state: str | None = None
        self._written_at: float | None = None
        self._flush = asyncio.Event()
        self._last_url = ""
        self._visits: list[dict] = []
        self._task: asyncio.Task | None = None

    def open(self, session_id: str, feed) -> None:
        self.session_id = session_id
        self.feed = feed

    def context_changed(self, event: ContextChanged) -> None:
        if event.url and event.url != self._last_url:
            self._last_url = event.url
            self._visits.append({"url": event.url, "title": event.title, "at": timezone.now().isoformat()})
        self._snapshot = event
        self._kick()

    def state_changed(self, state: str) -> None:
        if state == self.state or self.session_id is None:
            return
        self.state = state
        self._state = state
        self._kick()

    async def flush(self) -> None:
        """Let the last snapshot and state land, now (the connection is ending)."""
        if self._task is not None:
            self._flush.set()
            with contextlib.suppress(Exception):
                await self._task

    def _kick(self) -> None:
        if self._task is None or self._task.done():
            self._task = self._own(asyncio.create_task(self._write()), "row writer")

    async def _write(self) -> None:
        while self._snapshot is not None or self._state is not None:
            if self._written_at is not None and not self._flush.is_set():
                # At most one write per interval: a page sending updates
                # back to back costs one write, not one per frame.
                wait = self._written_at + ROW_WRITE_INTERVAL - asyncio.get_running_loop().time()
                if wait > 0:
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(self._flush.wait(), wait)
            event, self._snapshot = self._snapshot, None
            state, self._state = self._state, None
            visits, self._visits = self._visits, []
            snapshot = None
            if event is not None:
                snapshot = {
                    "url": event.url, "title": event.title, "context": event.context,
                    "tools": [tool.wire for tool in event.tools],  # shared: serialized as they are
                }
            await LIVE_ROWS.write(
                session_id=self.session_id, snapshot=snapshot, state=state, visits=visits,
            )
            self._written_at = asyncio.get_running_loop().time()
            if event is not None:
                self.feed.session_changed("context", url=event.url, title=event.title)
            if state is not None:
                self.feed.session_changed("state", state=state)
