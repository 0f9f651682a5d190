"""The work of one AITP connection, behind its consumer.

The consumer parses each frame (``aitp.session``) and hands the events here,
one at a time: ``handle()`` is the connection's inbox. The runner owns what
the connection runs -- its turn (``connection.turns``: the task, the
microphone's utterance, the agent's way back), the timers, the watcher feed
and the row written behind -- opens the session (``connection.opening`` puts
the agent together), sends the frames and tears the connection down.

``handle()`` never awaits a turn: the TOOL_RESULT the turn waits for arrives
through this same inbox, and Channels runs one handler at a time.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine
from typing import Any, Protocol

from django.utils import timezone

from agent.loop import Agent
from aitp import live, notify, processes, resume, services, store
from aitp import protocol as p
from aitp.close_codes import CLOSE_GOING_AWAY, CLOSE_POLICY
from aitp.limits import connection_limits
from aitp.messages import ResumeOffer
from aitp.operator_commands import OperatorCommands
from aitp.row_writer import SessionRowWriter
from aitp.session import (
    ContextChanged,
    Event,
    HandshakeRequested,
    SessionMachine,
    State,
)
from aitp.store.admission import Refusal
from aitp.watch_feed import WatcherFeed
from connection import handoff, holding, opening, relay
from connection.turns import TurnOwner
from runtime import logs, metrics
from runtime.config import config
from runtime.db import db_call
from runtime.group_write import GroupWrite
from speech.utterance import AudioBudget

logger = logging.getLogger(__name__)

# The session rows this process's connections close: closes that meet in time
# go to the database together (runtime.group_write).
SESSION_CLOSES = GroupWrite(lambda closes: store.current().sessions_close(closes),
                            name="session_closes")


class Socket(Protocol):
    """The consumer, as the runner uses it: its channel and its socket."""

    channel_layer: Any
    channel_name: str

    async def send(self, text_data: str) -> None: ...

    async def close(self, code: int, reason: str) -> None: ...

    def take_over(self, runner: ConnectionRunner) -> None: ...

    def let_go(self) -> None: ...


class ConnectionRunner:
    def __init__(self, socket: Socket, *, query_api_key: str | None, origin: str,
                 preview_ticket: str | None = None) -> None:
        self.socket: Socket | None = socket
        self.machine = machine = SessionMachine(
            limits=opening.session_limits(),
            server_version=config().protocol.server_version,
            capabilities=opening.CAPABILITIES,
            query_api_key=query_api_key,
        )
        self.origin = origin
        # The console's preview of a key's widget (aitp.preview); None: a page's own socket.
        self.preview_ticket = preview_ticket
        self.session_row = None
        self.teardown_task: asyncio.Task | None = None
        self.feed: WatcherFeed | None = None
        self.row_writer = SessionRowWriter(own=own_task)
        self.commands = OperatorCommands(machine)
        self.groups_joined: list[str] = []
        self.closed = False
        # The token the client is given for its next socket (None: it cannot resume).
        self.next_token: resume.ResumeToken | None = None
        self.rate_limits = connection_limits()
        self.turns = TurnOwner(machine, rate_limits=self.rate_limits, row_writer=self.row_writer,
                               flush=self.flush, own=own_task)
        # Timer handles, and the tasks they started: a connection waiting for
        # its deadline or its next heartbeat holds a timer, not a task.
        self.timers: list[asyncio.TimerHandle | asyncio.Task] = []

    def start(self) -> None:
        self._after(config().protocol.handshake_timeout, self._handshake_deadline, "handshake timer")

    # --- the inbox -------------------------------------------------------------

    async def handle(self, event: Event) -> None:
        if isinstance(event, HandshakeRequested):
            await self._open_session(event)
            return
        if isinstance(event, ContextChanged):
            self.row_writer.context_changed(event)
        else:
            await self.turns.handle(event)

    def show_watchers(self, events: list[Event], frame: str | bytes) -> None:
        """A frame the page sent, and the events the session machine made of it."""
        if self.feed is not None:
            with _watch_step(self.machine):
                self.feed.inbound(events, frame)

    # --- opening the session ---------------------------------------------------------

    async def _open_session(self, event: HandshakeRequested) -> None:
        offer = event.init.resume if config().protocol.resume_window > 0 else None
        # A new session's id: a session the client's token names takes its
        # place once the token is found to name it.
        session_id = opening.new_session_id()
        self.next_token = resume.new_token(session_id) if offer is not None else None
        # The session's groups (and its key's, when this process knows the
        # key) are joined while the opens of the key are counted: a page
        # refused leaves them in its teardown.
        known_key_id = store.current().remembered_key_id(event.api_key)
        groups = [notify.session_group(session_id)]
        if known_key_id is not None:
            groups.append(notify.key_group(known_key_id))
        # Counted as joined first: whatever the join raises, the teardown leaves them.
        self.groups_joined.extend(groups)
        joining = asyncio.ensure_future(notify.join(
            self.socket.channel_layer, groups, self.socket.channel_name,
            ask=live.session_watch_group(session_id)))
        try:
            allowed = await self.rate_limits.allow_session_open(self.machine, event.api_key)
        finally:
            watched = await joining
        if not allowed:
            return
        ticket = None
        if self.preview_ticket is not None:
            ticket = await opening.good_preview_ticket(self.preview_ticket, origin=self.origin)
            if ticket is None:
                self._refuse_handshake(opening.PREVIEW_REFUSAL)
                return
        info = opening.handshake_info(session_id, event.init, origin=self.origin,
                                      channel_name=self.socket.channel_name, token=self.next_token,
                                      preview_ticket=ticket)
        opened = await self._continue_or_open(event.api_key, offer, info)
        if opened is None:
            return
        session, refusal, following = opened
        if refusal is not None:
            self._refuse_handshake(refusal)
            return
        # Held from now on, so that whatever happens next the teardown ends it.
        self.session_row = session
        if following is not None:
            self.next_token = following
            watched = await self.regroup(session_id, session.id)
        # Every line this connection's work logs from now on names the session.
        logs.bind_session(session.id, session.tenant_id)
        if await self._handshake_abandoned():
            return
        server_tools = handoff.offered(await opening.load_server_tools(session.tenant_id), session.api_key,
                                       self.turns)
        self.machine.set_server_tools(tuple(tool.spec for tool in server_tools))
        if session.api_key_id != known_key_id:
            key_group = notify.key_group(session.api_key_id)
            self.groups_joined.append(key_group)
            await notify.join(self.socket.channel_layer, [key_group], self.socket.channel_name)
        if await self._handshake_abandoned():
            return
        agent, visitor_refused = await opening.session_agent(session, server_tools, self.turns, self.rate_limits,
                                                             event.init.visitorToken, continued=following is not None)
        await self._accept(session, agent, watched, continued=following is not None)
        if visitor_refused is not None:  # told after the ACK: the session opened, unlinked
            self.machine.error(visitor_refused.code, visitor_refused.message)

    def _refuse_handshake(self, refusal: Refusal) -> None:
        logger.info("handshake refused: %s (origin %r)", refusal.code, self.origin)
        self.machine.refuse(refusal.code, refusal.message, refusal.reason)

    async def _continue_or_open(self, api_key: str, offer: ResumeOffer | None, info: store.HandshakeInfo):
        """What ``opening.continue_or_open`` gives this socket: the session its
        token names or a new one; None when the session went on through this
        socket already (held by this process, or relayed to the one holding it)."""
        token = resume.parse(offer.token) if offer is not None else None
        for _ in range(3):  # the session may become held here while this socket waits for it
            if token is not None and (await holding.continue_held(self, api_key, token, offer.lastSeq, info)
                                      or await relay.relayed(self, api_key, token, offer.lastSeq, info)):
                return None
            opened = await opening.continue_or_open(api_key, token, info)
            if opened is not opening.HELD_HERE:
                return opened
        return await opening.continue_or_open(api_key, None, info)

    async def regroup(self, joined: str, continued: str) -> bool | None:
        """The continued session's group in place of the one joined for a new
        session (only a session found to be the token's is joined); whether it is watched."""
        layer, channel = self.socket.channel_layer, self.socket.channel_name
        self.groups_joined[0] = notify.session_group(continued)
        await notify.leave(layer, [notify.session_group(joined)], channel)
        return await notify.join(layer, [self.groups_joined[0]], channel,
                                 ask=live.session_watch_group(continued))

    async def _accept(self, session, agent: Agent, watched: bool, *, continued: bool) -> None:
        self.machine.capabilities = await opening.capabilities()
        budget = AudioBudget(config().voice.limits.bytes_per_second,
                             asyncio.get_running_loop().time()) if self.machine.audio else None
        self.turns.open(agent, tenant_id=session.tenant_id, owner=session.api_key_id, audio_budget=budget,
                        operator=session.operator_name if session.operator_id is not None else None)
        token = self.next_token
        self.machine.accept_handshake(session.id, resume_token=token and token.text,
                                      resumed=continued if token is not None else None)
        self._after(config().store.heartbeat_interval, self._heartbeat, "heartbeat")
        # One INFO line per session, at its close (with its tenant and length).
        logger.debug("session %s: opened for tenant %s", session.id, session.tenant_id)
        self.feed = WatcherFeed(session)
        metrics.session_opened()
        self.feed.start(watched)
        self.row_writer.open(session.id, self.feed)
        self.feed.session_changed("opened")

    async def _handshake_abandoned(self) -> bool:
        """True when the handshake deadline passed (or the page left) while
        the key was looked up: the connection is ending and its teardown
        ends the row -- or, when that teardown already finished, this does."""
        if self.machine.state is State.AWAITING_HANDSHAKE:
            return False
        if self.teardown_task is not None and self.teardown_task.done():
            await self._end_row_and_groups(CLOSE_POLICY, "handshake timeout")
        return True

    # --- frames out ----------------------------------------------------------------------

    async def flush(self) -> None:
        for frame in self.machine.data_to_send():
            if self.closed:
                return
            await self.socket.send(text_data=frame)
            self.show_sent(frame)
        if self.machine.close is not None and not self.closed:
            self.closed = True
            await self.socket.close(code=self.machine.close.code, reason=self.machine.close.reason)
            # Teardown cancels the turn and the timers, and this flush may be
            # running inside one of them: do it in a task of its own.
            self.start_teardown(self.machine.close.code, self.machine.close.reason)

    def show_sent(self, frame: str) -> None:
        if self.feed is not None:
            with _watch_step(self.machine):
                self.feed.outbound(frame)

    # --- notifications from the channel layer ---------------------------------------------

    async def command(self, event: dict) -> None:
        if await holding.superseded(self, event):
            return
        await self.commands.handle(event, turns=self.turns, feed=self.feed)
        await self.flush()

    async def recheck_key(self) -> None:
        if self.session_row is None or self.machine.state is not State.OPEN:
            return
        refusal = await db_call(services.session_still_allowed, session_id=self.session_row.id)
        if refusal is not None:
            self.machine.refuse(refusal.code, refusal.message, refusal.reason)
            await self.flush()

    # --- timers ------------------------------------------------------------------------------

    def _after(self, delay: float, work: Callable[[], Coroutine[Any, Any, None]], what: str) -> None:
        """Run ``work()`` in a task of its own in ``delay`` seconds, unless
        the teardown cancels it first."""
        # The handle reaches ``due`` through a list it leaves when it fires:
        # a fired handle and its callback are then no reference cycle.
        handle: list[asyncio.TimerHandle] = []

        def due() -> None:
            _forget(self.timers, handle.pop())
            if self.teardown_task is None:
                self.timers.append(own_task(asyncio.create_task(work()), what))

        handle.append(asyncio.get_running_loop().call_later(delay, due))
        self.timers.append(handle[0])

    async def _handshake_deadline(self) -> None:
        self.machine.handshake_timed_out()
        await self.flush()

    async def _heartbeat(self) -> None:
        # Seen, and the key re-checked: gathered with the other sessions'.
        refusal = await processes.session_heartbeat(self.session_row.id)
        if refusal is not None and self.machine.state is State.OPEN:
            self.machine.refuse(refusal.code, refusal.message, refusal.reason)
            await self.flush()
        _forget(self.timers, asyncio.current_task())
        if self.teardown_task is None:
            self._after(config().store.heartbeat_interval, self._heartbeat, "heartbeat")

    # --- teardown ------------------------------------------------------------------------------

    async def disconnect(self, code: int) -> None:
        if holding.may_hold(self, code) and await holding.hold(self, code):
            return
        if not self.closed:
            self.closed = True
            self.machine.close_now(code, "client disconnected")
        self.start_teardown(code, "client disconnected")
        await self.teardown_task
        # The runner reaches back to the consumer (and its turn's owner to the
        # runner: ``TurnOwner.left``): once the connection is over, the links
        # are dropped, so all it held is freed at once by reference counting,
        # never left to the cycle collector, whose passes over thousands of
        # closed connections would stall every other page.
        self.socket = None

    def give_up_socket(self) -> tuple[Socket, list[str]]:
        """The socket and its groups, for the session this process held that
        it continues (``connection.holding``); this runner is then done."""
        for timer in self.timers:
            timer.cancel()
        socket, groups, self.socket, self.groups_joined, self.timers = self.socket, self.groups_joined, None, [], []
        return socket, groups

    async def shutdown(self, message: str) -> None:
        """The server is stopping: tell the page, close with 1001 (the client
        reconnects, to another process), and end the turn (every call gets
        its final status) and the row, as a disconnect does."""
        if not self.closed:
            self.machine.send(p.system_event("disconnect", message=message))
            self.machine.close_now(CLOSE_GOING_AWAY, "server shutting down")
            await self.flush()
        if self.teardown_task is not None:
            await asyncio.shield(self.teardown_task)

    def start_teardown(self, code: int, reason: str) -> None:
        if self.teardown_task is None:
            self.teardown_task = own_task(asyncio.create_task(self._teardown(code, reason)), "teardown")

    async def _teardown(self, code: int, reason: str) -> None:
        """Stop everything this connection owns: the turn (its pending calls
        become 'disconnected'), the timers, the groups, the row."""
        if self.session_row is not None:
            # Started by the page's close or by the drain of a stopping
            # process (whose task knows no session): its lines name the session.
            logs.bind_session(self.session_row.id, self.session_row.tenant_id)
        # Each step runs whatever the one before raised: the row must end.
        with _step(self.machine, "turn"):
            await self.turns.left()
        timers, self.timers = self.timers, []
        for timer in timers:
            timer.cancel()
        for timer in timers:
            if isinstance(timer, asyncio.Task):
                with _step(self.machine, "timer"), contextlib.suppress(asyncio.CancelledError):
                    await timer
        # The refusals counted and not logged yet are, once.
        with _step(self.machine, "flood log"):
            self.rate_limits.close()
        # The last snapshot and state the row is owed go with its close.
        owed = await self.row_writer.finish()
        await self._end_row_and_groups(code, reason, owed)
        if self.feed is not None:
            metrics.session_closed()
        else:
            # Never opened: the error it was given, or it left before that.
            metrics.session_refused(self.machine.refused or "left_before_open")

    async def _end_row_and_groups(self, code: int, reason: str, owed: dict | None = None) -> None:
        groups, self.groups_joined = self.groups_joined, []
        if groups:
            with _step(self.machine, "group"):
                await notify.leave(self.socket.channel_layer, groups, self.socket.channel_name)
        if self.session_row is not None:
            await SESSION_CLOSES.write(session_id=self.session_row.id, code=code, reason=reason,
                                       live=owed)
            if self.feed is not None:
                if owed is not None:
                    self.row_writer.announce(owed)
                self.feed.session_changed("closed", code=code)
                await self.feed.aclose()
            row = self.session_row
            logger.info("session %s: closed (%s) for tenant %s after %.1f s", row.id, code,
                        row.tenant_id, (timezone.now() - row.started_at).total_seconds())



@contextlib.contextmanager
def _watch_step(machine: SessionMachine):
    """Showing a frame to the watchers: when it fails, it is logged and
    the page's session goes on as if nobody watched."""
    try:
        yield
    except Exception:
        logger.exception("session %s: the watchers could not be shown a frame", machine.session_id)


@contextlib.contextmanager
def _step(machine: SessionMachine, what: str):
    """One step of a teardown: logged when it fails, never stopping the rest."""
    try:
        yield
    except Exception:
        logger.exception("session %s: teardown step %r failed", machine.session_id, what)


def own_task(task: asyncio.Task, what: str) -> asyncio.Task:
    """``task``, whose failure is logged (a connection's turn, timers, teardown, row writes)."""
    def done(t: asyncio.Task) -> None:
        if not t.cancelled() and t.exception() is not None:
            logger.error("%s task failed", what, exc_info=t.exception())

    task.add_done_callback(done)
    return task


def _forget(timers: list, timer) -> None:
    with contextlib.suppress(ValueError):  # the teardown took the list meanwhile
        timers.remove(timer)
