"""The thin Channels consumer: authenticate, pump frames through the session
machine, own the turn task, and carry out what the machine decides.

What it owns besides, each a collaborator in its own module: the session row
written behind the connection (``aitp.row_writer``), the watcher feed
(``aitp.watch_feed``), operators' commands (``aitp.operator_commands``), and
the agent (``aitp.agent``), which reaches back only through ``TurnPort`` --
the one place a turn ends is its ``end_turn``.

``receive()`` never awaits a turn: the TOOL_RESULT the turn waits for arrives
through this same handler, and Channels runs one handler at a time.

Voice (when HANDSHAKE_ACK offered "audio": both speech engines work, checked
once per process off the loop): microphone chunks are counted against the
connection's audio budget and gathered in a ``Listening``; its first chunk
starts a voice turn (the same turn task), or, while another turn runs, the
next one. VOICE_INTERRUPT stops the agent's voice at once, cancels the turn
and answers ``interrupted``.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import asdict
from urllib.parse import parse_qs

from channels.exceptions import StopConsumer
from channels.generic.websocket import AsyncWebsocketConsumer
from django.db import DatabaseError
from django.utils import timezone

from aitp import ids, live, notify, ports, processes, services, store, voice
from aitp import protocol as p
from aitp.agent import Agent, AgentConfig, PageSnapshot
from aitp.agent_store import AgentStore
from aitp.agent_voice import Listening
from aitp.close_codes import CLOSE_GOING_AWAY, CLOSE_INTERNAL_ERROR, CLOSE_POLICY, CLOSE_TRY_AGAIN_LATER
from aitp.db import DbCallConsumer, db_call
from aitp.group_write import GroupWrite
from aitp.limits import connection_limits
from aitp.llm import get_backend
from aitp.operator_commands import OperatorCommands
from aitp.quota import TokenQuota
from aitp.recent import RecentAnswers
from aitp.row_writer import SessionRowWriter
from aitp.session import (
    ApprovalRequestReceived,
    ApprovalResponseReceived,
    AudioChunkReceived,
    ContextChanged,
    HandshakeRequested,
    Limits,
    SessionMachine,
    State,
    ToolResultReceived,
    UserAudioReceived,
    UserTextReceived,
    VoiceInputEnded,
    VoiceInterrupted,
)
from aitp.tools import ToolSurface
from aitp.turn_state import TurnState
from aitp.voice.utterance import AudioBudget
from aitp.watch_feed import WatcherFeed
from runtime.config import config, derived

logger = logging.getLogger(__name__)

# The session rows this process's connections close: closes that meet in time
# go to the database together (aitp.group_write).
SESSION_CLOSES = GroupWrite(lambda closes: store.current().sessions_close(closes))

CAPABILITIES = ("text", "tools")
VOICE_CAPABILITIES = ("text", "audio", "tools")


async def capabilities() -> tuple[str, ...]:
    """What HANDSHAKE_ACK offers: "audio" only when voice is on and both
    speech engines work (checked once per process, in a speech worker)."""
    if config().voice.enabled and await voice.audio_available_async():
        return VOICE_CAPABILITIES
    return CAPABILITIES


@derived
def session_limits() -> Limits:
    protocol = config().protocol
    return Limits(
        max_message_bytes=protocol.max_message_bytes,
        max_active_tools=protocol.max_active_tools,
        max_context_bytes=protocol.max_context_bytes,
        max_invalid_frames=protocol.max_invalid_frames,
        max_input_chars=protocol.max_input_chars,
        max_json_depth=protocol.max_json_depth,
        max_audio_seconds=config().voice.limits.max_utterance_seconds,
    )


@derived
def agent_config() -> AgentConfig:
    return AgentConfig(**asdict(config().agent))


def new_session_id() -> str:
    return "ses_" + ids.token_hex(12)


class AitpConsumer(DbCallConsumer, AsyncWebsocketConsumer):
    async def dispatch(self, message) -> None:
        """Every handler runs through here: connect, receive, disconnect and
        the channel-layer events. Whatever one raises, the connection is
        closed (1011: our bug, not the page's) and torn down -- its turn and
        timers stopped, its row ended -- never left half alive with its row
        counted against the key."""
        try:
            await super().dispatch(message)
        except StopConsumer:
            raise
        except Exception:
            logger.exception("session %s: %s handler failed; closing the connection",
                             getattr(getattr(self, "machine", None), "session_id", None),
                             message.get("type"))
            await self._fail()
            if message.get("type") == "websocket.disconnect":
                raise StopConsumer() from None

    async def _fail(self) -> None:
        machine = getattr(self, "machine", None)
        if machine is None:  # connect() failed before anything was set up
            with contextlib.suppress(Exception):
                await self.close(code=CLOSE_INTERNAL_ERROR)
            return
        machine.refuse("internal_error", "Something went wrong on the server.", "internal error",
                       close_code=CLOSE_INTERNAL_ERROR)
        try:
            await self._flush()
        except Exception:
            logger.exception("session %s: could not send the close", machine.session_id)
            if not self.closed:
                self.closed = True
                with contextlib.suppress(Exception):
                    await self.close(code=CLOSE_INTERNAL_ERROR)
        code = machine.close.code if machine.close is not None else CLOSE_INTERNAL_ERROR
        self._start_teardown(code, "internal error")

    async def connect(self) -> None:
        query = parse_qs(self.scope.get("query_string", b"").decode("latin-1"))
        headers = dict(self.scope.get("headers") or [])
        self.origin = headers.get(b"origin", b"").decode("latin-1")
        self.machine = SessionMachine(
            limits=session_limits(),
            server_version=config().protocol.server_version,
            capabilities=CAPABILITIES,
            query_api_key=(query.get("apiKey") or [None])[0],
        )
        self.session_row = None
        self.agent: Agent | None = None
        self.turn_task: asyncio.Task | None = None
        # The utterance the microphone is filling (None between utterances),
        # and the one the running turn is still listening to.
        self.listening: Listening | None = None
        self.turn_listening: Listening | None = None
        self.audio_budget: AudioBudget | None = None
        # VOICE_STATE_EVENT interrupted, once the cut turn is over.
        self.interrupted: p.Message | None = None
        self.teardown_task: asyncio.Task | None = None
        self.feed: WatcherFeed | None = None
        self.row_writer = SessionRowWriter(own=own_task)
        self.commands = OperatorCommands(self.machine)
        self.groups_joined: list[str] = []
        self.closed = False
        self.rate_limits = connection_limits()
        # Accept first: every refusal is an AITP error frame + 1008, never an
        # HTTP 403 the browser would retry forever (protocol.md §10).
        await self.accept()
        # Timer handles, and the tasks they started: a connection waiting for
        # its deadline or its next heartbeat holds a timer, not a task.
        self.timers: list[asyncio.TimerHandle | asyncio.Task] = []
        self._after(config().protocol.handshake_timeout, self._handshake_deadline, "handshake timer")
        await self._join_process()

    # --- frames in ----------------------------------------------------------

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        if not await self.rate_limits.allow_frame(self.machine):
            await self._flush()  # dropped, not parsed
            return
        data = text_data if text_data is not None else bytes_data
        events = self.machine.receive_text(data or "")
        if self.feed is not None:
            self.feed.inbound(events, data or "")
        for event in events:
            try:
                await self._handle(event)
            except DatabaseError:
                logger.exception("session %s: database error", self.machine.session_id)
                self._database_unavailable()
            except Exception:
                # Our bug, not the page's: log it, tell the page, keep the
                # connection -- unless the handshake failed: it completes or
                # is refused, never stays pending without a key.
                logger.exception("session %s: failed to handle %s", self.machine.session_id,
                                 type(event).__name__)
                if self.machine.state is State.AWAITING_HANDSHAKE:
                    self.machine.refuse("internal_error", "Something went wrong on the server.",
                                        "internal error", close_code=CLOSE_INTERNAL_ERROR)
                else:
                    self.machine.error("internal_error", "Something went wrong on the server.")
        await self._flush()

    def _database_unavailable(self) -> None:
        if self.machine.state is State.AWAITING_HANDSHAKE:
            # Worth retrying: 1013 makes the client reconnect later.
            self.machine.refuse(
                "temporarily_unavailable", "The service is briefly unavailable; retrying.",
                "try again later", close_code=CLOSE_TRY_AGAIN_LATER,
            )
        else:
            self.machine.error("temporarily_unavailable", "The service is briefly unavailable.")

    async def _handle(self, event) -> None:
        if isinstance(event, HandshakeRequested):
            await self._open_session(event)
        elif isinstance(event, ContextChanged):
            self.row_writer.context_changed(event)
        elif isinstance(event, (UserTextReceived, UserAudioReceived)):
            tenant_id = self.session_row.tenant_id
            if not await self.rate_limits.allow_user_input(self.machine, tenant_id=tenant_id):
                self._turn_over(p.agent_response("", True))  # refused: its error, then done
            elif isinstance(event, UserTextReceived):
                self._start_turn(event.text)
            else:
                self._start_voice_turn(Listening(audio=event.audio, owner=self.session_row.api_key_id))
        elif isinstance(event, AudioChunkReceived):
            self._audio_chunk(event.pcm)
        elif isinstance(event, VoiceInputEnded):
            if self.listening is not None:
                self.listening.end(event.reason)
        elif isinstance(event, VoiceInterrupted):
            self._barge_in(event.reason)
        elif isinstance(event, ToolResultReceived):
            await self._answer(self.agent.on_tool_result(event.result))
        elif isinstance(event, ApprovalRequestReceived):
            await self._answer(self.agent.on_approval_request(event.request))
        elif isinstance(event, ApprovalResponseReceived):
            await self._answer(self.agent.on_approval_response(event.response))

    async def _answer(self, pending) -> None:
        reply = await pending
        if reply is not None:
            self.machine.send(reply)

    async def _open_session(self, event: HandshakeRequested) -> None:
        session_id = new_session_id()
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
            self.channel_layer, groups, self.channel_name, ask=live.session_watch_group(session_id)))
        try:
            allowed = await self.rate_limits.allow_session_open(self.machine, event.api_key)
        finally:
            watched = await joining
        if not allowed:
            return
        init = event.init
        info = store.HandshakeInfo(
            session_id=session_id,
            origin=self.origin,
            user_agent=init.userAgent or "",
            viewport=init.viewport or "",
            sdk_version=init.sdkVersion or "",
            protocol_version=init.protocolVersion,
            channel_name=self.channel_name,
            process=processes.current_id(),
        )
        session, refusal = await db_call(
            store.current().session_open, raw_key=event.api_key, info=info
        )
        if refusal is not None:
            logger.info("handshake refused: %s (origin %r)", refusal.code, self.origin)
            self.machine.refuse(refusal.code, refusal.message, refusal.reason)
            return
        # Held from now on, so that whatever happens next the teardown ends it.
        self.session_row = session
        if await self._handshake_abandoned():
            return
        server_tools = await _load_server_tools(session.tenant_id)
        self.machine.set_server_tools(tuple(tool.spec for tool in server_tools))
        if session.api_key_id != known_key_id:
            key_group = notify.key_group(session.api_key_id)
            self.groups_joined.append(key_group)
            await notify.join(self.channel_layer, [key_group], self.channel_name)
        if await self._handshake_abandoned():
            return
        self.agent = Agent(
            session_id=session.id,
            tenant_id=session.tenant_id,
            system_prompt=session.tenant.system_prompt,
            backend=get_backend(),
            config=agent_config(),
            io=TurnPort(self),
            store=AgentStore(session_id=session.id, tenant_id=session.tenant_id),
            server_tools={tool.spec.name: tool for tool in server_tools},
            limits=self.rate_limits,
            quota=self.rate_limits.watch_token_quota(
                TokenQuota(session_id=session.id, tenant_id=session.tenant_id)),
        )
        self.machine.capabilities = await capabilities()
        if self.machine.audio:
            self.audio_budget = AudioBudget(config().voice.limits.bytes_per_second,
                                            asyncio.get_running_loop().time())
        self.machine.accept_handshake(session.id)
        self._after(config().store.heartbeat_interval, self._heartbeat, "heartbeat")
        # One INFO line per session, at its close (with its tenant and length).
        logger.debug("session %s: opened for tenant %s", session.id, session.tenant_id)
        self.feed = WatcherFeed(session)
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

    # --- the turn -------------------------------------------------------------

    def _start_turn(self, text: str) -> None:
        self.turn_task = own_task(asyncio.create_task(self.agent.run_turn(text)), "turn")

    def _start_voice_turn(self, listening: Listening, *, checked: bool = True) -> None:
        listening.claimed = True
        self.turn_listening = listening
        turn = self.agent.run_turn(voice=listening) if checked else self._limited_voice_turn(listening)
        self.turn_task = own_task(asyncio.create_task(turn), "turn")

    async def _limited_voice_turn(self, listening: Listening) -> None:
        """A turn the microphone started: the same input limits and token quota as typing."""
        if await self.rate_limits.allow_user_input(self.machine, tenant_id=self.session_row.tenant_id):
            await self.agent.run_turn(voice=listening)
            return
        self.machine.send(p.voice_state("turn_complete"))
        await self.end_turn(p.agent_response("", True))  # refused: its error, then done

    def _audio_chunk(self, pcm: bytes) -> None:
        if not self.audio_budget.take(len(pcm), asyncio.get_running_loop().time()):
            self.machine.error("audio_too_fast",
                               "Audio is arriving faster than this server accepts; the chunk was dropped.")
            self.rate_limits.audio_refused(self.machine)
            return
        if self.listening is None or self.listening.over:
            self.listening = Listening(config().voice.limits, owner=self.session_row.api_key_id)
        self.listening.add(pcm)
        self._next_voice_turn()

    def _next_voice_turn(self) -> None:
        """An utterance no turn has taken starts one as soon as no other runs."""
        listening = self.listening
        if listening is not None and not listening.claimed and self.machine.start_voice_turn():
            self._start_voice_turn(listening, checked=False)

    def _barge_in(self, reason: str) -> None:
        """The user spoke over the agent: its voice stops now, its turn is
        cancelled (pending calls end as cancelled), and the page hears
        interrupted as soon as the turn is over."""
        running = self.turn_task is not None and not self.turn_task.done()
        still_listening = self.turn_listening is not None and self.turn_listening.utterance is None
        answer = p.voice_state("interrupted", reason=reason or "barge_in")
        if running and not still_listening:
            self.agent.interrupt()
            self.turn_task.cancel()
            # Sent when the turn is over, so the page's next message is a new turn.
            self.interrupted = answer
        else:
            self.machine.send(answer)

    async def end_turn(self, done: p.Message | None) -> None:
        """The agent's turn is over (it calls this last, whatever happened
        to the turn; ``done`` is None when it was cancelled)."""
        self._turn_over(done)
        await self._flush()

    def _turn_over(self, done: p.Message | None) -> None:
        """The one place a turn ends, run or refused. The page may send its
        next message as soon as it reads the done frame (protocol.md §5): the
        turn is over before the frame is queued."""
        self.machine.end_turn()
        self.turn_listening = None
        if self.interrupted is not None:
            self.machine.send(self.interrupted)
            self.interrupted = None
        if done is not None:
            self.machine.send(done)
        self._next_voice_turn()

    # --- frames out -------------------------------------------------------------

    async def _flush(self) -> None:
        for frame in self.machine.data_to_send():
            if self.closed:
                return
            await self.send(text_data=frame)
            if self.feed is not None:
                self.feed.outbound(frame)
        if self.machine.close is not None and not self.closed:
            self.closed = True
            await self.close(code=self.machine.close.code, reason=self.machine.close.reason)
            # Teardown cancels the turn and the timers, and this flush may be
            # running inside one of them: do it in a task of its own.
            self._start_teardown(self.machine.close.code, self.machine.close.reason)

    # --- notifications from the channel layer -----------------------------------

    async def key_changed(self, event: dict) -> None:
        await self._recheck_key()

    async def session_command(self, event: dict) -> None:
        await self.commands.handle(event, agent=self.agent, feed=self.feed)
        await self._flush()

    async def _recheck_key(self) -> None:
        if self.session_row is None or self.machine.state is not State.OPEN:
            return
        refusal = await db_call(
            services.session_still_allowed, session_id=self.session_row.id
        )
        if refusal is not None:
            self.machine.refuse(refusal.code, refusal.message, refusal.reason)
            await self._flush()

    # --- timers -------------------------------------------------------------------

    def _after(self, delay: float, work, what: str) -> None:
        """Run ``work()`` (a coroutine function) in a task of its own in
        ``delay`` seconds, unless the teardown cancels it first."""
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
        await self._flush()

    async def _heartbeat(self) -> None:
        # Seen, and the key re-checked: gathered with the other sessions'.
        refusal = await processes.session_heartbeat(self.session_row.id)
        if refusal is not None and self.machine.state is State.OPEN:
            self.machine.refuse(refusal.code, refusal.message, refusal.reason)
            await self._flush()
        _forget(self.timers, asyncio.current_task())
        if self.teardown_task is None:
            self._after(config().store.heartbeat_interval, self._heartbeat, "heartbeat")

    # --- teardown -------------------------------------------------------------------

    async def websocket_disconnect(self, message) -> None:
        """Channels' own, without its ``aclose_old_connections`` on the shared
        sync thread at every close: this consumer's database work runs
        through ``db_call``, which tidies around each call (``DbCallConsumer``).
        Its groups are left in ``disconnect``."""
        await self.disconnect(message["code"])
        raise StopConsumer()

    async def disconnect(self, code: int) -> None:
        if not self.closed:
            self.closed = True
            self.machine.close_now(code, "client disconnected")
        self._start_teardown(code, "client disconnected")
        await self.teardown_task
        processes.connection_closed(self)
        # The agent reaches back to this consumer (its TurnPort): once the
        # connection is over, the link is dropped, so the consumer and all
        # it held are freed at once by reference counting, never left to
        # the cycle collector, whose passes over thousands of closed
        # connections would stall every other page.
        self.agent = None

    def _start_teardown(self, code: int, reason: str) -> None:
        if getattr(self, "teardown_task", None) is None:
            self.teardown_task = own_task(asyncio.create_task(self._end(code, reason)), "teardown")

    async def _end(self, code: int, reason: str) -> None:
        """Stop everything this connection owns: the turn (its pending calls
        become 'disconnected'), the timers, the groups, the row."""
        # Each step runs whatever the one before raised: the row must end.
        with _teardown_step(self, "turn"):
            if self.turn_task is not None and not self.turn_task.done():
                self.agent.cancel_status = "disconnected"
                self.turn_task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self.turn_task
        timers, self.timers = getattr(self, "timers", []), []
        for timer in timers:
            timer.cancel()
        for timer in timers:
            if isinstance(timer, asyncio.Task):
                with _teardown_step(self, "timer"), contextlib.suppress(asyncio.CancelledError):
                    await timer
        # The refusals counted and not logged yet are, once.
        with _teardown_step(self, "flood log"):
            self.rate_limits.close()
        # The last snapshot and state the row is owed go with its close.
        owed = await self.row_writer.finish()
        await self._end_row_and_groups(code, reason, owed)

    async def _end_row_and_groups(self, code: int, reason: str, owed: dict | None = None) -> None:
        groups, self.groups_joined = self.groups_joined, []
        if groups:
            with _teardown_step(self, "group"):
                await notify.leave(self.channel_layer, groups, self.channel_name)
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

    # --- process shutdown (aitp.processes drains every live connection) ------------

    async def _join_process(self) -> None:
        processes.connection_opened(self)
        if processes.draining():
            await self.shutdown(processes.SHUTDOWN_MESSAGE)

    async def shutdown(self, message: str) -> None:
        """The server is stopping: tell the page, close with 1001 (the client
        reconnects, to another process), and end the turn (every call gets
        its final status) and the row, as a disconnect does."""
        if not self.closed:
            self.machine.send(p.system_event("disconnect", message=message))
            self.machine.close_now(CLOSE_GOING_AWAY, "server shutting down")
            await self._flush()
        if self.teardown_task is not None:
            await asyncio.shield(self.teardown_task)


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


@contextlib.contextmanager
def _teardown_step(consumer, what: str):
    """One step of a teardown: logged when it fails, never stopping the rest."""
    try:
        yield
    except Exception:
        logger.exception("session %s: teardown step %r failed",
                         getattr(consumer.machine, "session_id", None), what)


class TurnPort:
    """The agent's one way back into its connection (``aitp.agent_parts.TurnIO``):
    frames out, the turn's end, the page as the session machine holds it, and
    the turn's state for the row and watchers."""

    def __init__(self, consumer: AitpConsumer) -> None:
        self._consumer = consumer

    async def send_message(self, message: p.Message) -> None:
        self._consumer.machine.send(message)
        await self._consumer._flush()

    async def end_turn(self, done: p.Message | None) -> None:
        await self._consumer.end_turn(done)

    def surface(self) -> ToolSurface:
        return self._consumer.machine.surface

    def page(self) -> PageSnapshot:
        machine = self._consumer.machine
        return PageSnapshot(machine.url, machine.title, machine.context)

    async def set_state(self, state: TurnState) -> None:
        self._consumer.row_writer.state_changed(state)
        if state == TurnState.WAITING_APPROVAL and self._consumer.turn_listening is not None:
            # A voice turn now waits for the user's decision.
            await self.send_message(p.voice_state("waiting_for_input"))


# How long a tenant's server tools, once read, serve its next opens: a change
# to them (the console, the admin) reaches new sessions within this time; at
# fifty opens a second of one tenant, the read happens once instead of fifty
# times. Sessions already open keep the tools they opened with.
SERVER_TOOLS_FRESH_FOR = 1.0
_server_tools: RecentAnswers[list] = RecentAnswers(lambda: SERVER_TOOLS_FRESH_FOR)


async def _load_server_tools(tenant_id: int) -> list:
    return await _server_tools.get(tenant_id, lambda: ports.approvals().load_server_tools(tenant_id))
