"""The session row, written behind the connection.

The session machine holds the live values (the page, and the turn's state in
its turn machine); ``SessionRowWriter`` writes them to the ``Session`` row at most once
per ``ROW_WRITE_INTERVAL`` (the open's own insert counting as the first
write), in a task of its own started when the write is due (until then a
timer), so neither the page's next frame nor the turn waits for the
database. Only the latest values are written, every URL
visited in between is kept for the page history, and watchers are told
after the row changed. The writes of all connections of the process that
meet in time go to the database in one call (``runtime.group_write``).

When the connection ends, ``finish()`` lets a write already on its way land
and hands back what is still owed: the connection's runner sends it with the row's
close, in the same call and transaction. A page that opens, sends its
context and leaves within the interval costs one write after the open, not
two.
"""
from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from django.utils import timezone

from aitp import store
from aitp.session import ContextChanged
from aitp.store.statements import JsonText
from runtime.group_write import GroupWrite

# The session row (page snapshot, turn state) is written at most this often;
# the connection holds the live values, the row is for watchers and the record.
# A turn passes through three or four states: written each time, they were a
# third of a busy process's database calls; a watcher sees them at most this late.
ROW_WRITE_INTERVAL = 1.0

# The writes of every connection of this process: those asked for while one
# is on its way go together, in one database call.
LIVE_ROWS = GroupWrite(lambda writes: store.current().sessions_write_live(writes), name="session_rows")


class SessionRowWriter:
    def __init__(self, *, own: Callable[[asyncio.Task, str], asyncio.Task]) -> None:
        self._own = own
        self.session_id: str | None = None
        self.feed = None  # the WatcherFeed, once the session is open
        self.state = "idle"
        self._snapshot: ContextChanged | None = None
        self._state: str | None = None
        self._written_at: float | None = None
        self._last_url = ""
        self._visits: list[dict] = []
        # The write on its way, and the timer of the next one: a session
        # waiting for its next write holds a timer, not a task.
        self._task: asyncio.Task | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._finishing = False

    def open(self, session_id: str, feed) -> None:
        self.session_id = session_id
        self.feed = feed
        # The open inserted the row: the next write is an interval away.
        self._written_at = asyncio.get_running_loop().time()

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

    async def finish(self) -> dict | None:
        """The connection is ending: no more writes of their own. A write on
        its way lands; what is still owed comes back (``session_write_live``'s
        arguments but the session id, None when nothing is), for the row's
        close to carry; ``announce()`` it once that is written."""
        self._finishing = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._task is not None:
            with contextlib.suppress(Exception):
                await self._task
        return self._take()

    def announce(self, written: dict) -> None:
        """Tell the watchers what a write of ``_take()``'s values changed."""
        snapshot = written.get("snapshot")
        if snapshot is not None:
            self.feed.session_changed("context", url=snapshot["url"], title=snapshot["title"])
        if written.get("state") is not None:
            self.feed.session_changed("state", state=written["state"])

    def _take(self) -> dict | None:
        """What is owed to the row (and no longer is)."""
        if self._snapshot is None and self._state is None:
            return None
        event, self._snapshot = self._snapshot, None
        state, self._state = self._state, None
        visits, self._visits = self._visits, []
        snapshot = None
        if event is not None:
            snapshot = {
                "url": event.url, "title": event.title, "context": event.context,
                # Written once already, for the page's tools_effective.
                "tools": [tool.wire for tool in event.tools] if event.tools_json is None
                else JsonText(event.tools_json),
            }
        return {"snapshot": snapshot, "state": state, "visits": visits}

    def _kick(self) -> None:
        """Something is owed: write it now, or when the interval since the
        last write is over (at most one write per interval: a page sending
        updates back to back costs one write, not one per frame)."""
        if self._finishing or self._timer is not None:
            return
        if self._task is not None and not self._task.done():
            return  # the write on its way schedules the next when it is back
        loop = asyncio.get_running_loop()
        wait = 0.0 if self._written_at is None else \
            self._written_at + ROW_WRITE_INTERVAL - loop.time()
        if wait > 0:
            self._timer = loop.call_later(wait, self._due)
        else:
            self._task = self._own(loop.create_task(self._write()), "row writer")

    def _due(self) -> None:
        self._timer = None
        self._kick()

    async def _write(self) -> None:
        owed = self._take()
        if owed is None:
            return
        try:
            await LIVE_ROWS.write(session_id=self.session_id, **owed)
        finally:
            self._written_at = asyncio.get_running_loop().time()
        self.announce(owed)
        if self._snapshot is not None or self._state is not None:
            self._task = None  # this write is over: the next may be scheduled
            self._kick()  # owed meanwhile: an interval from now
