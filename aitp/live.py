"""What operators watching live sessions are told (a notification, never the
record: the watcher re-reads the database for anything it shows in full).

Nothing is published that nobody watches: a session's frames go out only
while an operator is subscribed to that session (the watch socket tells the
connection holding it, through the session's group, when one joins or
leaves), and session events only while a watch group has members: known
exactly on the in-memory layer; on Redis as this process last asked (at most
once per ``WATCH_PRESENCE_TTL`` per group, and at once for a watcher of this
process). A watcher of another process that joined within that time may miss
an event: the live list re-reads every session at least every heartbeat
interval. A page's frame costs no channel-layer message, no JSON and no task
switch while nobody looks.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable

from channels.layers import InMemoryChannelLayer, get_channel_layer
from django.utils import timezone

from aitp import notify
from runtime.recent import RecentAnswers

logger = logging.getLogger(__name__)

# session.command (notify.session_command) sent by the watch socket to the
# connection holding a session when a watcher subscribes to it or leaves it.
WATCHERS_COMMAND = "watchers"


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


# Sent back to a watcher's channel (reply_to) by the connection holding the
# session once it publishes its frames: the watcher says "subscribed" then.
WATCH_READY = "watch.ready"


async def watchers_changed(session_id: str, *, watching: bool, reply_to: str | None = None) -> None:
    """Tell the connection holding a session that a watcher joined (it
    publishes its frames from now on, and answers ``reply_to`` with
    WATCH_READY) or left (it checks whether any is left). Sent after the
    watcher's group_add or group_discard."""
    fields = {"reply_to": reply_to} if reply_to else {}
    await notify.asend(
        notify.session_group(session_id), "session.command",
        command=WATCHERS_COMMAND, watching=watching, **fields,
    )


async def group_has_members(group: str) -> bool:
    """Whether anyone is in a group; True when that cannot be known (no such
    question on this layer, or its server is away): a notification too many
    is harmless, one too few is a watcher missing something."""
    layer = get_channel_layer()
    if layer is None:
        return False
    if isinstance(layer, InMemoryChannelLayer):
        return _local_group_has_members(layer, group)
    ask = getattr(layer, "group_has_members", None)
    if ask is None:
        return True
    try:
        return await ask(group)
    except Exception:
        logger.debug("could not tell whether group %s has members", group, exc_info=True)
        return True


def _local_group_has_members(layer: InMemoryChannelLayer, group: str) -> bool:
    # The in-memory layer keeps {group: {channel: joined_at}} and forgets
    # expired members lazily: an expired one only costs a message.
    return bool(layer.groups.get(group))


def session_events_watched(tenant_id: int) -> bool:
    """Whether a session event of this tenant may have a watcher: exact on the
    in-memory layer (every watcher is in this process); on Redis, False only
    when this process learned less than WATCH_PRESENCE_TTL ago that neither
    group has members, else the publisher asks (``publish_session``)."""
    layer = get_channel_layer()
    if layer is None:
        return False
    groups = (notify.ALL_WATCH_GROUP, notify.tenant_watch_group(tenant_id))
    if not isinstance(layer, InMemoryChannelLayer):
        return any(_watch_presence.known(group, True) for group in groups)
    return any(_local_group_has_members(layer, group) for group in groups)


# How long this process trusts what it learned of a watch group's members.
WATCH_PRESENCE_TTL = 1.0
# {watch group: has members}, as last learned
_watch_presence: RecentAnswers[bool] = RecentAnswers(lambda: WATCH_PRESENCE_TTL)


def watch_groups_joined(groups: Iterable[str]) -> None:
    """A watcher of this process joined these groups: events go to them from now on."""
    for group in groups:
        _watch_presence.learned(group, True)


async def _watch_group_watched(group: str) -> bool:
    return await _watch_presence.get(group, lambda: group_has_members(group))


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
    for group in (notify.tenant_watch_group(session.tenant_id), notify.ALL_WATCH_GROUP):
        if await _watch_group_watched(group):
            await notify.asend(group, "watch.event", event=event)


class LivePublisher:
    """One connection's notifications to watchers, sent in order by a task of
    its own.

    The turn and the receive handler only queue: they never wait on the
    channel layer, whose Redis round trips would sit on the hot path, and
    whose group_send can swallow a cancellation that lands inside it (a turn
    cancelled there would run on after its page left). If watchers fall far
    behind, the oldest notifications are dropped: they are hints to re-read
    the database, never the record.

    Frames are published only while ``watched`` (see the module's opening):
    a connection starts unwatched (its session id is new, nobody can have
    subscribed yet), ``watchers_joined`` turns it on, ``watchers_left``
    checks the group again, off the hot path, and turns it off when empty.
    """

    MAX_QUEUED = 500

    def __init__(self, session) -> None:
        self.session = session
        self.queue: asyncio.Queue = asyncio.Queue()
        self.task: asyncio.Task | None = None
        self.watched = False
        # Bumped by every join: a check of the group started before a join
        # must not turn the frames off after it.
        self.joins = 0

    def frame(self, direction: str, text: str | Callable[[], str]) -> None:
        """One frame for watchers; ``text`` may be a function that makes it,
        called only when someone watches."""
        if not self.watched:
            return
        self._put(publish_frame, self.session, direction, text() if callable(text) else text)

    def session_changed(self, what: str, **fields) -> None:
        if not session_events_watched(self.session.tenant_id):
            return
        self._put(publish_session, self.session, what, **fields)

    def start(self, watched: bool | None = None) -> None:
        """Once the connection is in its session's group: a watcher that
        subscribed before could not tell it, so ask the group once --
        unless ``watched`` already says (the join asked it, in the same
        round trip)."""
        if watched is not None:
            if watched:
                self.watchers_joined()
            return
        layer = get_channel_layer()
        if isinstance(layer, InMemoryChannelLayer):
            if _local_group_has_members(layer, session_watch_group(self.session.id)):
                self.watchers_joined()
        elif layer is not None:
            self._put(self._check_watchers, self.joins, stop=True)

    async def watchers_changed(self, event: dict) -> None:
        """The WATCHERS_COMMAND session command sent by ``watchers_changed``."""
        if not event.get("watching"):
            self.watchers_left()
            return
        reply_to = event.get("reply_to")
        if isinstance(reply_to, str) and reply_to:
            # Answered first: no frame of this connection can reach the
            # watcher before it learns that it is subscribed.
            layer = get_channel_layer()
            if layer is not None:
                try:
                    await layer.send(reply_to, {"type": WATCH_READY, "session_id": self.session.id})
                except Exception:
                    logger.warning("session %s: could not answer a watcher", self.session.id,
                                   exc_info=True)
        self.watchers_joined()

    def watchers_joined(self) -> None:
        self.joins += 1
        self.watched = True

    def watchers_left(self) -> None:
        if self.watched:
            self._put(self._check_watchers, self.joins)

    async def _check_watchers(self, joins: int, stop: bool = False) -> None:
        watched = await group_has_members(session_watch_group(self.session.id))
        if self.joins == joins:
            self.watched = watched
        if stop and not self.watched and self.queue.empty():
            # Nothing to publish: no task waits for frames nobody watches.
            self.queue.put_nowait((None, (), {}))

    def _put(self, send, *args, **kwargs) -> None:
        if self.queue.qsize() >= self.MAX_QUEUED:
            self.queue.get_nowait()
        self.queue.put_nowait((send, args, kwargs))
        if self.task is None or self.task.done():
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
