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
from dataclasses import replace
from typing import Any

from django.utils import timezone

from aitp import notify, processes, resume, store
from aitp import protocol as p
from aitp.close_codes import CLOSE_CONTINUED_ELSEWHERE, CLOSE_NORMAL
from aitp.operator_commands import CONTINUED_ELSEWHERE, SUPERSEDED
from runtime.config import config
from runtime.db import db_call

# connection.runner.ConnectionRunner, which imports this module: named, not imported.
ConnectionRunner = Any

logger = logging.getLogger(__name__)

# The sessions this process holds, by id.
_held: dict[str, HeldSocket] = {}

# How often a held session whose turn runs checks whether its hold is over.
CHECK_EVERY = 1.0


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
    if event.get("command") != SUPERSEDED or event.get("process") != processes.current_id():
        return False
    if isinstance(runner.socket, HeldSocket):
        return True  # held already: the newer socket takes it
    if not may_hold(runner, CLOSE_CONTINUED_ELSEWHERE):
        return False
    old = runner.socket
    goodbye = p.serialize(p.system_event("disconnect", message=CONTINUED_ELSEWHERE))
    with contextlib.suppress(Exception):  # a socket that is gone hears nothing
        await old.send(text_data=goodbye)
        await old.close(code=CLOSE_CONTINUED_ELSEWHERE, reason="continued on another socket")
    if not await hold(runner, CLOSE_CONTINUED_ELSEWHERE):
        return False
    old.let_go()
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

    def start(self) -> None:
        self.tasks = [asyncio.create_task(self._read()), asyncio.create_task(self._expire())]

    @property
    def last_socket(self) -> dict:
        return {"closed_at": self.dropped_at.isoformat(), "code": self.code,
                "reason": "client disconnected"}

    async def send(self, text_data: str) -> None:
        """Kept in the outbox already: the client's next socket gets it."""

    async def close(self, code: int, reason: str) -> None:
        """The connection ends (an operator's end, a revoked key, a newer
        socket elsewhere): the runner tears itself down after this."""
        self._release()

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
                if message.get("type") == "session.command":
                    await runner.command(message)
                elif message.get("type") == "key.changed":
                    await runner.recheck_key()
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
            if runner.turns.task is not None and not runner.turns.task.done():
                quiet_since = now
            if now - quiet_since >= protocol.resume_hold or now - self.opened_at >= protocol.resume_window:
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
    # Until the socket is the runner's, what the turn sends is only kept: the
    # frames go out from the outbox, in order, until none is left to send.
    outbox = runner.machine.outbox
    sent = position
    while True:
        for text in runner.machine.data_to_send():
            runner.show_sent(text)  # kept in the outbox; the watchers see it now
        missed = outbox.after(sent)
        if not missed:
            break
        for _, text in missed:
            await socket.send(text_data=text)
        sent = missed[-1][0]
    runner.socket = socket
    if runner.turns.agent is not None:
        await runner.turns.agent.page_tools.calls_lost(outbox.calls_through(position))
    await runner.flush()
