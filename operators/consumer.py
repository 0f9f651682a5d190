"""The watch socket: live session rows and one session's frames, for staff.

The channel layer only says "session X changed" (``watch.event``, published
by aitp.live to the tenant's group and to the all-tenants group); this
consumer reads the row again from the database, through the watcher's own
tenant scope, and sends that. Superusers join the all-tenants group,
operators the groups of the tenants they are members of.

Messages from the browser (JSON objects):
  {"type": "list"}                          -> {"type": "sessions", "sessions": [row, ...]}
  {"type": "subscribe", "session_id": id}   -> {"type": "subscribed", "session": row}
                                               then {"type": "frame", ...} as they pass
                                               ("subscribed" once the connection holding
                                               the session publishes its frames)
  {"type": "unsubscribe"}                   -> {"type": "unsubscribed"}
Messages to the browser, besides the replies above:
  {"type": "session", "session": row}       a visible session changed
  {"type": "frame", "session_id", "direction": "in"|"out", "text": <AITP frame JSON>}
  {"type": "error", "message": "..."}
Refused (anonymous, not staff, foreign Origin): accepted, then closed with 4403,
so the page can tell "not allowed" from a network failure and stop retrying.
"""
from __future__ import annotations

import asyncio
import json
import logging
from urllib.parse import urlsplit

from channels.generic.websocket import AsyncWebsocketConsumer

from aitp import live, notify, processes
from aitp.close_codes import CLOSE_FORBIDDEN, CLOSE_GOING_AWAY
from operators import selectors
from operators.access import user_watch_group
from runtime.config import config
from runtime.db import DbCallConsumer, db_call
from tenants.selectors import tenant_ids_for_user

logger = logging.getLogger(__name__)

# The longest a subscription waits for the connection holding the session
# to say it publishes its frames before "subscribed" goes out anyway.
SUBSCRIBE_ANSWER_WAIT = 2.0
# Browser messages are tiny; anything larger is not from our page.
MAX_CLIENT_MESSAGE_CHARS = 4096


def origin_allowed(scope) -> bool:
    """A browser always sends Origin: it must be this site (or a trusted
    origin), so another site cannot open the socket with an operator's
    cookie. Clients that send no Origin are not browsers and carry no
    ambient cookie to abuse."""
    headers = dict(scope.get("headers") or [])
    origin = headers.get(b"origin", b"").decode("latin-1")
    if not origin:
        return True
    if origin in config().site.trusted_origins:
        return True
    host = headers.get(b"host", b"").decode("latin-1")
    return bool(host) and urlsplit(origin).netloc == host


class OperatorWatchConsumer(DbCallConsumer, AsyncWebsocketConsumer):
    async def connect(self) -> None:
        self.accepted = False
        self.user_id: int | None = None
        self.watch_groups: list[str] = []
        self.watching: str | None = None
        self.pending_subscription: tuple[str, dict] | None = None
        self.subscribe_timer: asyncio.Task | None = None
        self.recheck_task: asyncio.Task | None = None
        user = self.scope.get("user")
        if not origin_allowed(self.scope):
            logger.warning("watch socket refused: foreign origin")
            await self._refuse()
            return
        if user is None or not selectors.is_watcher(user):
            await self._refuse()
            return
        tenant_ids = await db_call(tenant_ids_for_user, user)
        # The user's own group first: a change of the user's access from now
        # on reaches this socket (operators.access).
        groups = [user_watch_group(user.pk), *_tenant_groups(tenant_ids)]
        self.watch_groups.extend(groups)
        await notify.join(self.channel_layer, groups, self.channel_name)
        live.watch_groups_joined(groups)
        self.user_id = user.pk
        # Accepted once in the groups: from the moment the page sees the
        # socket open, no change can slip past it.
        await self.accept()
        self.accepted = True
        processes.connection_opened(self)
        if processes.draining():
            await self.shutdown(processes.SHUTDOWN_MESSAGE)
            return
        self.recheck_task = asyncio.create_task(self._recheck_every(config().store.heartbeat_interval))
        self.recheck_task.add_done_callback(_log_failure)
        logger.info("watch socket opened for user %s (%d groups)", user.pk, len(groups))

    async def disconnect(self, code: int) -> None:
        processes.connection_closed(self)
        task, self.recheck_task = self.recheck_task, None
        if task is not None:
            task.cancel()
        await self._unsubscribe()
        groups, self.watch_groups = self.watch_groups, []
        if groups:
            await notify.leave(self.channel_layer, groups, self.channel_name)

    # --- from the browser ---------------------------------------------------

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        if self.user_id is None:
            return  # refused; the close is on its way
        if text_data is None or len(text_data) > MAX_CLIENT_MESSAGE_CHARS:
            await self._error("send a json object as text")
            return
        try:
            message = json.loads(text_data)
        except ValueError:
            await self._error("send a json object as text")
            return
        if not isinstance(message, dict):
            await self._error("send a json object as text")
            return
        kind = message.get("type")
        if kind == "list":
            await self._send_list()
        elif kind == "subscribe":
            await self._subscribe(message.get("session_id"))
        elif kind == "unsubscribe":
            await self._unsubscribe()
            await self._send({"type": "unsubscribed"})
        else:
            await self._error("unknown message type")

    async def _send_list(self) -> None:
        rows = await db_call(selectors.watcher_live_rows, user_id=self.user_id)
        if rows is None:
            await self._refuse()
            return
        await self._send({"type": "sessions", "sessions": rows})

    async def _subscribe(self, session_id) -> None:
        """Watch one session's frames (one at a time per socket). Membership is
        checked here, with the same read as the pages: the session group
        carries every frame, so only a member may join it."""
        if not isinstance(session_id, str) or not session_id:
            await self._error("subscribe needs a session_id")
            return
        row = await db_call(
            selectors.watched_session_row, user_id=self.user_id, session_id=session_id
        )
        if row is None:
            await self._error("no such session")
            return
        await self._unsubscribe()
        await self.channel_layer.group_add(live.session_watch_group(session_id), self.channel_name)
        self.watching = session_id
        # The page's connection publishes its frames only while watched:
        # "subscribed" goes out once it answers (watch_ready), so the page's
        # next frame reaches this socket; a connection that never answers
        # (its process is gone, the session ended) holds it up for
        # SUBSCRIBE_ANSWER_WAIT at most.
        self.pending_subscription = (session_id, row)
        await live.watchers_changed(session_id, watching=True, reply_to=self.channel_name)
        self.subscribe_timer = asyncio.create_task(self._subscribed_anyway(session_id))

    async def watch_ready(self, message: dict) -> None:
        if message.get("session_id") == self.watching:
            await self._confirm_subscription()

    async def _subscribed_anyway(self, session_id: str) -> None:
        await asyncio.sleep(SUBSCRIBE_ANSWER_WAIT)
        if self.watching == session_id:
            await self._confirm_subscription(from_timer=True)

    async def _confirm_subscription(self, from_timer: bool = False) -> None:
        pending, self.pending_subscription = self.pending_subscription, None
        if pending is None or pending[0] != self.watching:
            return
        timer, self.subscribe_timer = self.subscribe_timer, None
        if timer is not None and not from_timer:
            timer.cancel()
        await self._send({"type": "subscribed", "session": pending[1]})

    async def _unsubscribe(self) -> None:
        self.pending_subscription = None
        timer, self.subscribe_timer = self.subscribe_timer, None
        if timer is not None:
            timer.cancel()
        if self.watching is not None:
            session_id, self.watching = self.watching, None
            await self.channel_layer.group_discard(
                live.session_watch_group(session_id), self.channel_name
            )
            await live.watchers_changed(session_id, watching=False)

    # --- from the channel layer (types built by aitp.live, never by a client) --

    async def watch_event(self, message: dict) -> None:
        if self.user_id is None:
            return
        event = message.get("event")
        session_id = event.get("session_id") if isinstance(event, dict) else None
        if not isinstance(session_id, str):
            return
        row = await db_call(
            selectors.watched_session_row, user_id=self.user_id, session_id=session_id
        )
        if row is None:
            # No longer visible to this user (membership or staff status
            # removed): stop its frames too.
            if session_id == self.watching:
                await self._unsubscribe()
                await self._error("no such session")
            return
        await self._send({"type": "session", "session": row})

    async def watch_access(self, message: dict) -> None:
        """The user's access may have changed (operators.access), or the
        periodic re-check is due: read the user again. No longer a watcher
        (staff flag removed, deactivated, deleted): closed 4403. Otherwise the
        socket leaves the groups of tenants it may no longer see and joins the
        new ones, drops a subscription it may no longer see, and, after a
        change, sends the list again, so the page shows only what it may."""
        if self.user_id is None:
            return
        user = await db_call(selectors.watcher, self.user_id)
        if user is None:
            logger.info("watch socket of user %s closed: no longer allowed to watch", self.user_id)
            await self._refuse()
            return
        tenant_ids = await db_call(tenant_ids_for_user, user)
        wanted = [user_watch_group(self.user_id), *_tenant_groups(tenant_ids)]
        gone = [group for group in self.watch_groups if group not in wanted]
        added = [group for group in wanted if group not in self.watch_groups]
        if gone:
            await notify.leave(self.channel_layer, gone, self.channel_name)
        if added:
            await notify.join(self.channel_layer, added, self.channel_name)
            live.watch_groups_joined(added)
        self.watch_groups = wanted
        if self.watching is not None and await db_call(
            selectors.watched_session_row, user_id=self.user_id, session_id=self.watching
        ) is None:
            await self._unsubscribe()
            await self._error("no such session")
        if gone or added or message.get("changed", True):
            await self._send_list()

    async def _recheck_every(self, interval: float) -> None:
        """The re-check that catches a change no notice announced: through this
        socket's own channel, so it runs between the socket's other handlers."""
        while True:
            await asyncio.sleep(interval)
            await self.channel_layer.send(self.channel_name, {"type": "watch.access", "changed": False})

    async def watch_frame(self, message: dict) -> None:
        session_id = message.get("session_id")
        if self.user_id is None or session_id != self.watching:
            return
        direction = message.get("direction")
        await self._send({
            "type": "frame",
            "session_id": session_id,
            "direction": direction if direction in ("in", "out") else "out",
            "text": str(message.get("text", "")),
        })

    # --- helpers -------------------------------------------------------------

    async def _send(self, message: dict) -> None:
        await self.send(text_data=json.dumps(message, ensure_ascii=False))

    async def _error(self, text: str) -> None:
        await self._send({"type": "error", "message": text})

    async def shutdown(self, message: str) -> None:
        """The server is stopping (aitp.processes): close as going away."""
        await self.close(code=CLOSE_GOING_AWAY)

    async def _refuse(self) -> None:
        """Accept, then close with our own code: a refused upgrade reaches the
        page as a bare 1006, indistinguishable from a network failure."""
        self.user_id = None
        if not self.accepted:
            await self.accept()
        await self.close(code=CLOSE_FORBIDDEN)


def _tenant_groups(tenant_ids: set[int] | None) -> list[str]:
    """The watch groups of the tenants a user may see (None: every tenant)."""
    if tenant_ids is None:
        return [notify.ALL_WATCH_GROUP]
    return [notify.tenant_watch_group(tenant_id) for tenant_id in sorted(tenant_ids)]


def _log_failure(task: asyncio.Task) -> None:
    if not task.cancelled() and task.exception() is not None:
        logger.error("watch socket re-check failed", exc_info=task.exception())
