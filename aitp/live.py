"""What operators watching live sessions are told (a notification, never the
record: the watcher re-reads the database for anything it shows in full)."""
from __future__ import annotations

import asyncio
import logging

from django.utils import timezone

from aitp import notify

logger = logging.getLogger(__name__)


def session_watch_group(session_id: str) -> str:
    return f"aitp.watch.session.{session_id}"


async def publish_frame(session, direction: str, text: str) -> None:
    """One AITP frame of a session as JSON text ("in" from the page, "out" to
    it), for operators watching that session live."""
    if session is None:
        return
    await notify.asend(
        session_watch_group(session.id), "watch.frame",
        session_id=session.id, direction=direction, text=text,
    )


async def publish_session(session, what: str, **fields) -> None:
    """Tell watchers of this session's tenant (and superusers) that it changed."""
    if session is None:
        return
    event = {
        "session_id": session.id,
        "tenant_id": session.tenant_id,
        "what": what,
        "at": timezone.now().isoformat(),
        **fields,
    }
    await notify.asend(notify.tenant_watch_group(session.tenant_id), "watch.event", event=event)
    await notify.asend(notify.ALL_WATCH_GROUP, "watch.event", event=event)


class LivePublisher:
    """One connection's notifications to watchers, sent in order by a task of
    its own.

    The turn and the receive handler only queue: they never wait on the
    channel layer, whose Redis round trips would sit on the hot path, and
    whose group_send can swallow a cancellation that lands inside it (a turn
    cancelled there would run on after its page left). If watchers fall far
    behind, the oldest notifications are dropped: they are hints to re-read
    the database, never the record.
    """

    MAX_QUEUED = 500

    def __init__(self, session) -> None:
        self.session = session
        self.queue: asyncio.Queue = asyncio.Queue()
        self.task: asyncio.Task | None = None
        self.dropped = 0

    def frame(self, direction: str, text: str) -> None:
        self._put(publish_frame, self.session, direction, text)

    def session_changed(self, what: str, **fields) -> None:
        self._put(publish_session, self.session, what, **fields)

    def _put(self, send, *args, **kwargs) -> None:
        if self.queue.qsize() >= self.MAX_QUEUED:
            self.queue.get_nowait()
            self.dropped += 1
        self.queue.put_nowait((send, args, kwargs))
        if self.task is None:
            self.task = asyncio.create_task(self._run())
            self.task.add_done_callback(self._done)

    async def _run(self) -> None:
        while True:
            send, args, kwargs = await self.queue.get()
            if send is None:
                return
            try:
                await send(*args, **kwargs)
            except Exception:
                # A watcher notification must never end a session.
                logger.warning("session %s: watcher notification failed", self.session.id,
                               exc_info=True)

    def _done(self, task: asyncio.Task) -> None:
        if not task.cancelled() and task.exception() is not None:
            logger.error("session %s: watcher publisher failed", self.session.id,
                         exc_info=task.exception())

    async def aclose(self, timeout: float = 2.0) -> None:
        """Send what is queued (bounded in time), then stop."""
        if self.task is None:
            return
        self.queue.put_nowait((None, (), {}))
        await asyncio.wait({self.task}, timeout=timeout)
        if not self.task.done():
            self.task.cancel()
            await asyncio.wait({self.task}, timeout=timeout)
