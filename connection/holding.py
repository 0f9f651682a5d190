"""A session held past its socket (docs/protocol.md §3a).

When the socket of a client that offered ``resume`` drops (any close but
the page's own 1000: a reload, a lost network), the connection's runner is
not torn down: this process holds the session. Its turn goes on; the frames
it sends are numbered and kept (``aitp.outbox``) instead of written to a
socket; its row stays open, its heartbeat goes on, and a channel of its own
in the session's and key's groups carries what operators and key changes
ask of it (an end, an approval decided, a newer socket on another process
asking it to let go).

The client's next socket on this process continues it (``continue_held``):
the claim of the row (``aitp.store.resuming``, the held case), the new
socket's HANDSHAKE_ACK numbered where the client left off, then the held
runner becomes that socket's: the frames after the client's ``lastSeq`` are
sent again, in order, and a page call whose frame the client had handled
but not answered ends ``disconnected`` (it may have run; the model is told).

Held while the turn runs (at most the resume window after the drop) and
``OWLLAYER_RESUME_HOLD_SECONDS`` more; then the connection ends as a drop
ends it today, with the drop's code (a later resume continues it from the
database). A newer socket on another process, an operator's end, a revoked
key or the process's drain end it at once.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any

from django.utils import timezone

from aitp import notify, processes, resume, store
from aitp import protocol as p
from aitp.close_codes import CLOSE_ABNORMAL, CLOSE_CONTINUED_ELSEWHERE, CLOSE_NORMAL
from aitp.consumer import take_frame
from aitp.operator_commands import CONTINUED_ELSEWHERE, RELAY, SUPERSEDED
from runtime.config import config
from runtime.db import db_call

# connection.runner.ConnectionRunner, which imports this module: named, not imported.
ConnectionRunner = Any

logger = logging.getLogger(__name__)

# The sessions this process holds, by id.
_held: dict[str, HeldSocket] = {}

# How often a held session whose turn runs checks whether its hold is over.
CHECK_EVERY = 1.0
# A relay is taken up only this long before the asking socket gives up.
ANSWER_MARGIN = 0.5


def may_hold(runner: ConnectionRunner, code: int) -> bool:
    hold = config().protocol
    return (runner.next_token is not None and runner.feed is not None and not runner.closed
            and code != CLOSE_NORMAL and hold.resume_window > 0 and hold.resume_hold > 0
            and runner.machine.outbox is not None and runner.teardown_task is None)


async def hold(runner: ConnectionRunner, code: int) -> bool:
    """The runner's socket dropped: the runner goes on with a held socket.
    False when it cannot (the channel layer failed): the connection ends
    as any other does."""
    gone = runner.socket
    layer = gone.channel_layer
    try:
        held = HeldSocket(runner, layer, await layer.new_channel(), code)
        await notify.join(layer, runner.groups_joined, held.channel_name)
    except Exception:
        logger.exception("session %s: could not hold the session past its socket", runner.session_row.id)
        return False
    with contextlib.suppress(Exception):  # the old channel is gone with its socket either way
        await notify.leave(layer, runner.groups_joined, gone.channel_name)
    runner.socket = held
    _held[runner.session_row.id] = held
    processes.connection_opened(held)
    held.start()
    logger.info("session %s: socket closed (%s); held for its next socket", runner.session_row.id, code)
    return True


def holding(session_id: str) -> bool:
    return session_id in _held


async def superseded(runner: ConnectionRunner, event: dict) -> bool:
    """A newer socket on this process offered the session's token while this
    socket still looked open (a network drop the server has not seen yet, a
    reload, a copy of the tab): this socket is told and closed (4409), and
    the session held for the newer one, which then gets what this one
    missed. True when done here; False: the command is carried out as any
    other (a newer socket on another process: the session ends here)."""
    relay = event.get("command") == RELAY
    if not relay and (event.get("command") != SUPERSEDED or event.get("process") != processes.current_id()):
        return False
    if isinstance(runner.socket, HeldSocket):
        if relay and event.get("gone"):
            await runner.socket.relayed_socket_gone(runner, event)
        elif relay:
            await runner.socket.relay(event)
        return True  # held already: the newer socket takes it
    if relay and event.get("gone"):
        return True
    if not may_hold(runner, CLOSE_CONTINUED_ELSEWHERE):
        return relay  # unanswered: the newer socket asks this one to let go
    old = runner.socket
    goodbye = p.serialize(p.system_event("disconnect", message=CONTINUED_ELSEWHERE))
    with contextlib.suppress(Exception):  # a socket that is gone hears nothing
        await old.send(text_data=goodbye)
        await old.close(code=CLOSE_CONTINUED_ELSEWHERE, reason="continued on another socket")
    if not await hold(runner, CLOSE_CONTINUED_ELSEWHERE):
        return False
    old.let_go()
    if relay:
        await runner.socket.relay(event)
    return True


class HeldSocket:
    """What a held runner has for a socket: frames sent to it are kept only
    in the outbox; its close ends the connection; its channel reads the
    session's commands."""

    def __init__(self, runner: ConnectionRunner, layer: Any, channel: str, code: int) -> None:
        self.runner: ConnectionRunner | None = runner
        self.channel_layer = layer
        self.channel_name = channel
        self.code = code
        self.dropped_at = timezone.now()
        self.opened_at = asyncio.get_running_loop().time()
        self.tasks: list[asyncio.Task] = []
        # The channel of the socket on another process the session is relayed to, if any.
        self.relay_to: str | None = None

    def start(self) -> None:
        self.tasks = [asyncio.create_task(self._read()), asyncio.create_task(self._expire())]

    @property
    def last_socket(self) -> dict:
        return {"closed_at": self.dropped_at.isoformat(), "code": self.code,
                "reason": "client disconnected"}

    async def send(self, text_data: str) -> None:
        """Kept in the outbox already: the client's next socket gets it (a
        socket on another process the session is relayed to, at once)."""
        if self.relay_to is not None:
            await self.channel_layer.send(self.relay_to, {"type": "relay.outbound", "text": text_data})

    async def close(self, code: int, reason: str) -> None:
        """The connection ends (an operator's end, a revoked key, a newer
        socket elsewhere): the runner tears itself down after this."""
        await self._cut_relay(code, reason)
        self._release()

    async def _cut_relay(self, code: int, reason: str, message: str | None = None) -> None:
        """The socket the session is relayed to, if any, is closed (told ``message`` first)."""
        relay_to, self.relay_to = self.relay_to, None
        if relay_to is None:
            return
        with contextlib.suppress(Exception):  # gone already: nothing to tell
            if message is not None:
                await self.channel_layer.send(relay_to, {"type": "relay.outbound", "text": p.serialize(
                    p.system_event("disconnect", message=message))})
            await self.channel_layer.send(relay_to, {"type": "relay.close", "code": code, "reason": reason})

    async def relay(self, event: dict) -> None:
        """A socket on another process offered the session's token
        (``connection.relay``): the session goes on here and that socket
        relays, once the row is claimed for it as a socket here would claim
        it. Its HANDSHAKE_ACK is numbered where the client left off, then the
        frames it missed follow, as ``_attach`` sends them to a socket here.
        Not answered (the asker then has the session let go) when the claim fails."""
        runner = self.runner
        if runner is None or time.time() > event["answerBy"] - ANSWER_MARGIN:
            return
        token = resume.ResumeToken("", event["sessionId"], event["tokenHash"])
        info = replace(store.HandshakeInfo(**event["info"]), process=processes.current_id(),
                       channel_name=self.channel_name)
        outcome = await db_call(store.current().session_resume, raw_key=event["apiKey"], token=token,
                                next_hash=info.resume_token_hash, info=info,
                                window=config().protocol.resume_window, held=self.last_socket)
        if outcome.refusal is not None:
            refusal = outcome.refusal
            await self.channel_layer.send(event["reply"], {"type": "relay.refused", "code": refusal.code,
                                                           "message": refusal.message, "reason": refusal.reason})
            return
        # Too late (the asker has given up: its token is spent all the same,
        # and it opens a new session), or the hold ended meanwhile.
        if outcome.session is None or self.runner is None or time.time() > event["answerBy"] - ANSWER_MARGIN:
            return
        await self._cut_relay(CLOSE_CONTINUED_ELSEWHERE, "continued on another socket", CONTINUED_ELSEWHERE)
        outbox = runner.machine.outbox
        position = outbox.position(event.get("lastSeq"))
        await self.channel_layer.send(event["reply"], {
            "type": "relay.accepted", "position": position, "lastInput": outbox.last_input,
            "capabilities": list(runner.machine.capabilities), "holder": self.channel_name})
        channel = event["channel"]
        await _replay(runner, position, lambda text: self.channel_layer.send(
            channel, {"type": "relay.outbound", "text": text}))
        self.relay_to = channel
        self.opened_at = asyncio.get_running_loop().time()
        logger.info("session %s: relayed to a socket on another process from frame %d",
                    runner.session_row.id, position + 1)
        if runner.turns.agent is not None:
            await runner.turns.agent.page_tools.calls_lost(outbox.calls_through(position))
        await runner.flush()

    async def relayed_socket_gone(self, runner: ConnectionRunner, event: dict) -> None:
        """The socket the session was relayed to closed: held again, as at
        a drop (the page's own 1000 ends it)."""
        if event.get("channel") != self.relay_to:
            return
        self.relay_to, code = None, int(event.get("code") or CLOSE_ABNORMAL)
        if code == CLOSE_NORMAL:
            self._release()
            runner.closed = True
            runner.machine.close_now(code, "client disconnected")
            runner.start_teardown(code, "client disconnected")
            return
        self.code, self.dropped_at = code, timezone.now()
        self.opened_at = asyncio.get_running_loop().time()
        logger.info("session %s: relayed socket closed (%s); held for its next socket", runner.session_row.id, code)

    async def shutdown(self, message: str) -> None:
        if self.runner is not None:
            await self.runner.shutdown(message)

    async def _read(self) -> None:
        while self.runner is not None:
            message = await self.channel_layer.receive(self.channel_name)
            runner = self.runner
            if runner is None:
                return
            try:
                kind = message.get("type")
                if kind == "session.command":
                    await runner.command(message)
                elif kind == "key.changed":
                    await runner.recheck_key()
                elif kind == "relay.inbound" and self.relay_to is not None:
                    await take_frame(runner, message["text"])
                elif kind == "relay.gone":
                    await self.relayed_socket_gone(runner, message)
            except Exception:
                logger.exception("session %s: a held session could not act on %s",
                                 runner.machine.session_id, message.get("type"))

    async def _expire(self) -> None:
        """The hold's end when no socket continued the session: the
        connection ends as the drop would have ended it."""
        protocol = config().protocol
        loop = asyncio.get_running_loop()
        quiet_since = loop.time()
        while True:
            runner = self.runner
            if runner is None:
                return
            now = loop.time()
            if self.relay_to is not None or (runner.turns.task is not None and not runner.turns.task.done()):
                quiet_since = now
            if now - quiet_since >= protocol.resume_hold or (
                    self.relay_to is None and now - self.opened_at >= protocol.resume_window):
                break
            await asyncio.sleep(min(CHECK_EVERY, protocol.resume_hold))
        self._release()
        runner.closed = True
        runner.machine.close_now(self.code, "client disconnected")
        runner.start_teardown(self.code, "client disconnected")

    def _release(self) -> None:
        """No longer held: out of the registry; the reader and the timer stop."""
        runner, self.runner = self.runner, None
        if runner is not None and _held.get(runner.session_row.id) is self:
            del _held[runner.session_row.id]
        processes.connection_closed(self)
        current = asyncio.current_task()
        tasks, self.tasks = self.tasks, []
        for task in tasks:
            if task is not current:
                task.cancel()


async def continue_held(new: ConnectionRunner, raw_key: str, token: resume.ResumeToken,
                        last_seq: int | None, info: store.HandshakeInfo) -> bool:
    """Continue the session ``token`` names when this process holds it: True
    when the handshake was answered (continued, or refused); False when the
    session is not held here, or the token is not its current one."""
    held = _held.pop(token.session_id, None)
    if held is None:
        return False
    following = resume.new_token(token.session_id)
    try:
        outcome = await db_call(
            store.current().session_resume, raw_key=raw_key, token=token,
            next_hash=following.secret_hash,
            info=replace(info, session_id=token.session_id, resume_token_hash=following.secret_hash),
            window=config().protocol.resume_window, held=held.last_socket)
    finally:
        if held.runner is not None:
            _held.setdefault(token.session_id, held)
    if outcome.refusal is not None:
        new.machine.refuse(outcome.refusal.code, outcome.refusal.message, outcome.refusal.reason)
        return True
    runner = held.runner
    if outcome.session is None or runner is None:
        return False  # not this token, or the hold ended meanwhile: the rest is the database's
    # The new socket's groups and HANDSHAKE_ACK, numbered where the client goes on.
    await new.regroup(info.session_id, token.session_id)
    key_group = notify.key_group(runner.session_row.api_key_id)
    if key_group not in new.groups_joined:
        new.groups_joined.append(key_group)
        await notify.join(new.socket.channel_layer, [key_group], new.socket.channel_name)
    if new.teardown_task is not None or new.closed:
        return True  # the new socket is gone already: the session stays held
    await held._cut_relay(CLOSE_CONTINUED_ELSEWHERE, "continued on another socket", CONTINUED_ELSEWHERE)
    held._release()
    try:
        position = runner.machine.outbox.position(last_seq)
        new.machine.capabilities = runner.machine.capabilities
        new.machine.accept_handshake(token.session_id, resume_token=following.text, resumed=True,
                                     numbered_from=position, last_input=runner.machine.outbox.last_input)
        await new.flush()
        socket, groups = new.give_up_socket()
        socket.take_over(runner)
        await _attach(runner, socket, groups, position, held)
    except BaseException:
        # The session is neither held nor the new socket's: it ends as its drop would have ended it.
        runner.closed = True
        runner.machine.close_now(held.code, "client disconnected")
        runner.start_teardown(held.code, "client disconnected")
        raise
    return True


async def _attach(runner: ConnectionRunner, socket: Any, groups: list[str], position: int,
                  held: HeldSocket) -> None:
    """The held runner becomes ``socket``'s: its groups are the socket's,
    the frames after ``position`` are sent again, and the calls the client
    had handled but not answered end."""
    with contextlib.suppress(Exception):
        await notify.leave(held.channel_layer, runner.groups_joined, held.channel_name)
    runner.groups_joined = groups
    logger.info("session %s: continued on a new socket from frame %d", runner.session_row.id, position + 1)
    await _replay(runner, position, lambda text: socket.send(text_data=text))
    runner.socket = socket
    if runner.turns.agent is not None:
        await runner.turns.agent.page_tools.calls_lost(runner.machine.outbox.calls_through(position))
    await runner.flush()


async def _replay(runner: ConnectionRunner, position: int, send: Callable[[str], Awaitable[Any]]) -> None:
    """The frames after ``position``, each to ``send``. Until the socket is the
    runner's, what the turn sends is only kept: the frames go out from the
    outbox, in order, until none is left to send."""
    outbox = runner.machine.outbox
    sent = position
    while True:
        for text in runner.machine.data_to_send():
            runner.show_sent(text)  # kept in the outbox; the watchers see it now
        missed = outbox.after(sent)
        if not missed:
            return
        for _, text in missed:
            await send(text)
        sent = missed[-1][0]
