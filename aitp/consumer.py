"""The thin Channels consumer: authenticate, pump frames through the session
machine, own the turn task, and carry out what the machine decides.

``receive()`` never awaits a turn: the TOOL_RESULT the turn waits for arrives
through this same handler, and Channels runs one handler at a time.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
from urllib.parse import parse_qs

from channels.exceptions import StopConsumer
from channels.generic.websocket import AsyncWebsocketConsumer
from django.conf import settings
from django.db import DatabaseError
from django.utils import timezone

from aitp import live, notify, processes, services
from aitp import protocol as p
from aitp.agent import Agent, AgentConfig, PageSnapshot
from aitp.agent_store import AgentStore
from aitp.limits import connection_limits
from aitp.db import DbCallConsumer, db_call
from aitp.llm import get_backend
from aitp.session import (
    CLOSE_GOING_AWAY,
    CLOSE_INTERNAL_ERROR,
    CLOSE_POLICY,
    CLOSE_TRY_AGAIN_LATER,
    ApprovalRequestReceived,
    ApprovalResponseReceived,
    ContextChanged,
    HandshakeRequested,
    Limits,
    SessionMachine,
    State,
    ToolResultReceived,
    UserTextReceived,
)
from aitp.tools import ToolSurface

logger = logging.getLogger(__name__)

CAPABILITIES = ("text", "tools")
# The session row (page snapshot, turn state) is written at most this often;
# the connection holds the live values, the row is for watchers and the record.
ROW_WRITE_INTERVAL = 0.25


def limits_from_settings() -> Limits:
    return Limits(
        max_message_bytes=settings.OWLLAYER_MAX_MESSAGE_BYTES,
        max_active_tools=settings.OWLLAYER_MAX_ACTIVE_TOOLS,
        max_context_bytes=settings.OWLLAYER_MAX_CONTEXT_BYTES,
        max_invalid_frames=settings.OWLLAYER_MAX_INVALID_FRAMES,
        max_input_chars=settings.OWLLAYER_MAX_INPUT_CHARS,
        max_json_depth=settings.OWLLAYER_MAX_JSON_DEPTH,
    )


def agent_config_from_settings() -> AgentConfig:
    return AgentConfig(
        model=settings.OWLLAYER_MODEL,
        max_tokens=settings.OWLLAYER_MAX_TOKENS,
        tool_timeout=settings.OWLLAYER_TOOL_TIMEOUT,
        approval_timeout=settings.OWLLAYER_APPROVAL_TIMEOUT,
        max_tool_rounds=settings.OWLLAYER_MAX_TOOL_ROUNDS,
        history_messages=settings.OWLLAYER_HISTORY_MESSAGES,
        stream_interval=settings.OWLLAYER_STREAM_INTERVAL,
    )


def new_session_id() -> str:
    return "ses_" + secrets.token_hex(12)


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
            limits=limits_from_settings(),
            server_version=settings.OWLLAYER_SERVER_VERSION,
            capabilities=CAPABILITIES,
            query_api_key=(query.get("apiKey") or [None])[0],
        )
        self.session_row = None
        self.agent: Agent | None = None
        self.turn_task: asyncio.Task | None = None
        self.teardown_task: asyncio.Task | None = None
        self.row_writer: asyncio.Task | None = None
        self.live: live.LivePublisher | None = None
        self.pending_snapshot: ContextChanged | None = None
        self.pending_state: str | None = None
        self.row_written_at: float | None = None
        self.row_flush = asyncio.Event()
        self.last_url = ""
        self.visits: list[dict] = []
        self.groups_joined: list[str] = []
        self.closed = False
        self.state = "idle"
        self.rate_limits = connection_limits()
        # Accept first: every refusal is an AITP error frame + 1008, never an
        # HTTP 403 the browser would retry forever (wire-compat.md section 2).
        await self.accept()
        self.timers = [
            self._own(asyncio.create_task(self._handshake_deadline()), "handshake timer"),
        ]
        await self._join_process()

    # --- frames in ----------------------------------------------------------

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        if not await self.rate_limits.allow_frame(self.machine):
            await self._flush()  # dropped, not parsed
            return
        data = text_data if text_data is not None else bytes_data
        for event in self.machine.receive_text(data or ""):
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
        if not isinstance(event, HandshakeRequested):
            self.live.frame("in", lambda: _describe_inbound(event))
        if isinstance(event, HandshakeRequested):
            await self._open_session(event)
        elif isinstance(event, ContextChanged):
            self._context_changed(event)
        elif isinstance(event, UserTextReceived):
            tenant_id = self.session_row.tenant_id
            if await self.rate_limits.allow_user_input(self.machine, tenant_id=tenant_id):
                self._start_turn(event.text)
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
        if not await self.rate_limits.allow_session_open(self.machine, event.api_key):
            return
        init = event.init
        info = services.HandshakeInfo(
            session_id=new_session_id(),
            origin=self.origin,
            user_agent=init.userAgent or "",
            viewport=init.viewport or "",
            sdk_version=init.sdkVersion or "",
            protocol_version=init.protocolVersion,
            channel_name=self.channel_name,
            process=processes.current_id(),
        )
        session, refusal = await db_call(
            services.session_open, raw_key=event.api_key, info=info
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
        for group in (notify.session_group(session.id), notify.key_group(session.api_key_id)):
            await self.channel_layer.group_add(group, self.channel_name)
            self.groups_joined.append(group)
        if await self._handshake_abandoned():
            return
        self.agent = Agent(
            session_id=session.id,
            tenant_id=session.tenant_id,
            system_prompt=session.tenant.system_prompt,
            backend=get_backend(),
            config=agent_config_from_settings(),
            io=self,
            store=AgentStore(session_id=session.id, tenant_id=session.tenant_id),
            server_tools={tool.spec.name: tool for tool in server_tools},
            limits=self.rate_limits,
        )
        self.machine.accept_handshake(session.id)
        self.timers.append(self._own(asyncio.create_task(self._heartbeat()), "heartbeat"))
        logger.info("session %s: opened for tenant %s", session.id, session.tenant_id)
        self.live = live.LivePublisher(session)
        self.live.start()
        self.live.session_changed("opened")

    async def _handshake_abandoned(self) -> bool:
        """True when the handshake deadline passed (or the page left) while
        the key was looked up: the connection is ending and its teardown
        ends the row -- or, when that teardown already finished, this does."""
        if self.machine.state is State.AWAITING_HANDSHAKE:
            return False
        if self.teardown_task is not None and self.teardown_task.done():
            await self._end_row_and_groups(CLOSE_POLICY, "handshake timeout")
        return True

    # --- the session row, written behind the connection ------------------------

    def _context_changed(self, event: ContextChanged) -> None:
        if event.url and event.url != self.last_url:
            self.last_url = event.url
            self.visits.append({"url": event.url, "title": event.title, "at": timezone.now().isoformat()})
        self.pending_snapshot = event
        self._kick_row_writer()

    def _kick_row_writer(self) -> None:
        if self.row_writer is None or self.row_writer.done():
            self.row_writer = self._own(asyncio.create_task(self._write_row()), "row writer")

    async def _write_row(self) -> None:
        """Write the page snapshot and the turn state to the session row.

        The session machine and the agent hold the live values, so neither
        the page's next frame nor the turn waits for this write: only the
        latest values are written, every URL visited in between is kept for
        the page history, and watchers are told after the row changed."""
        while self.pending_snapshot is not None or self.pending_state is not None:
            if self.row_written_at is not None and not self.row_flush.is_set():
                # At most one write per interval: a page sending updates
                # back to back costs one write, not one per frame.
                wait = self.row_written_at + ROW_WRITE_INTERVAL - asyncio.get_running_loop().time()
                if wait > 0:
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(self.row_flush.wait(), wait)
            event, self.pending_snapshot = self.pending_snapshot, None
            state, self.pending_state = self.pending_state, None
            visits, self.visits = self.visits, []
            snapshot = None
            if event is not None:
                snapshot = {
                    "url": event.url, "title": event.title, "context": event.context,
                    "tools": [tool.to_wire() for tool in event.tools],
                }
            await db_call(
                services.session_write_live,
                session_id=self.session_row.id, snapshot=snapshot, state=state, visits=visits,
            )
            self.row_written_at = asyncio.get_running_loop().time()
            if event is not None:
                self.live.session_changed("context", url=event.url, title=event.title)
            if state is not None:
                self.live.session_changed("state", state=state)

    # --- the turn -------------------------------------------------------------

    def _start_turn(self, text: str) -> None:
        self.turn_task = self._own(asyncio.create_task(self._run_turn(text)), "turn")

    async def _run_turn(self, text: str) -> None:
        try:
            await self.agent.run_turn(text)
        finally:
            # The done frame may already have ended this turn and the page
            # started the next one: never end that one.
            if self.turn_task is asyncio.current_task():
                self.machine.end_turn()

    # --- AgentIO --------------------------------------------------------------

    async def send_message(self, message: p.Message) -> None:
        if message.type is p.MessageType.AGENT_RESPONSE and message.payload.done:
            # The page may send its next message as soon as it reads this
            # frame (wire-compat 6): the turn is over before the frame leaves.
            self.machine.end_turn()
        self.machine.send(message)
        await self._flush()

    def surface(self) -> ToolSurface:
        return self.machine.surface

    def page(self) -> PageSnapshot:
        return PageSnapshot(self.machine.url, self.machine.title, self.machine.context)

    async def set_state(self, state: str) -> None:
        if state == self.state or self.session_row is None:
            return
        self.state = state
        self.pending_state = state
        self._kick_row_writer()

    # --- frames out -------------------------------------------------------------

    async def _flush(self) -> None:
        for frame in self.machine.data_to_send():
            if self.closed:
                return
            await self.send(text_data=frame)
            if self.live is not None:
                self.live.frame("out", frame)
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
        command = event.get("command")
        if command == "end":
            self.machine.send(p.system_event(
                "disconnect", message=event.get("message") or "An operator ended this session."
            ))
            self.machine.close_now(CLOSE_POLICY, "ended by operator")
        elif command == "reload":
            self.machine.send(p.system_event("reload", message=event.get("message") or None))
        elif command == "redirect" and event.get("url"):
            self.machine.send(p.system_event(
                "redirect", message=event.get("message") or None, data={"url": str(event["url"])}
            ))
        elif command == "approval_decided" and self.agent is not None:
            await self.agent.on_approval_decided(int(event["approval_id"]))
        elif command == live.WATCHERS_COMMAND and self.live is not None:
            await self.live.watchers_changed(event)
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

    async def _handshake_deadline(self) -> None:
        await asyncio.sleep(settings.OWLLAYER_HANDSHAKE_TIMEOUT)
        self.machine.handshake_timed_out()
        await self._flush()

    async def _heartbeat(self) -> None:
        while True:
            await asyncio.sleep(settings.OWLLAYER_HEARTBEAT_INTERVAL)
            # Seen, and the key re-checked: gathered with the other sessions'.
            refusal = await processes.session_heartbeat(self.session_row.id)
            if refusal is not None and self.machine.state is State.OPEN:
                self.machine.refuse(refusal.code, refusal.message, refusal.reason)
                await self._flush()

    # --- teardown -------------------------------------------------------------------

    async def disconnect(self, code: int) -> None:
        if not self.closed:
            self.closed = True
            self.machine.close_now(code, "client disconnected")
        self._start_teardown(code, "client disconnected")
        await self.teardown_task
        processes.connection_closed(self)

    def _start_teardown(self, code: int, reason: str) -> None:
        if getattr(self, "teardown_task", None) is None:
            self.teardown_task = self._own(asyncio.create_task(self._end(code, reason)), "teardown")

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
        timers = getattr(self, "timers", [])
        for timer in timers:
            timer.cancel()
        for timer in timers:
            with _teardown_step(self, "timer"), contextlib.suppress(asyncio.CancelledError):
                await timer
        if self.row_writer is not None:
            # Let the last snapshot and state land, now, before the session is closed.
            self.row_flush.set()
            with contextlib.suppress(Exception):
                await self.row_writer
        await self._end_row_and_groups(code, reason)

    async def _end_row_and_groups(self, code: int, reason: str) -> None:
        for group in self.groups_joined:
            with _teardown_step(self, "group"):
                await self.channel_layer.group_discard(group, self.channel_name)
        self.groups_joined = []
        if self.session_row is not None:
            await db_call(
                services.session_close, session_id=self.session_row.id, code=code, reason=reason
            )
            if self.live is not None:
                self.live.session_changed("closed", code=code)
                await self.live.aclose()
            logger.info("session %s: closed (%s)", self.session_row.id, code)

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

    def _own(self, task: asyncio.Task, what: str) -> asyncio.Task:
        def done(t: asyncio.Task) -> None:
            if not t.cancelled() and t.exception() is not None:
                logger.error("%s task failed", what, exc_info=t.exception())

        task.add_done_callback(done)
        return task


@contextlib.contextmanager
def _teardown_step(consumer, what: str):
    """One step of a teardown: logged when it fails, never stopping the rest."""
    try:
        yield
    except Exception:
        logger.exception("session %s: teardown step %r failed",
                         getattr(consumer.machine, "session_id", None), what)


def _describe_inbound(event) -> str:
    """The inbound message behind an event, as JSON text for watchers."""
    if isinstance(event, ContextChanged):
        body = {"type": "CONTEXT_UPDATE", "payload": {
            "url": event.url, "title": event.title, "context": event.context,
            "activeTools": [tool.to_wire() for tool in event.tools]}}
    elif isinstance(event, UserTextReceived):
        body = {"type": "USER_INPUT", "payload": {"modality": "text", "content": event.text}}
    elif isinstance(event, ToolResultReceived):
        body = {"type": "TOOL_RESULT", "payload": event.result.model_dump(exclude_none=True)}
    elif isinstance(event, ApprovalRequestReceived):
        body = {"type": "APPROVAL_REQUEST", "payload": event.request.model_dump(exclude_none=True)}
    else:
        body = {"type": "APPROVAL_RESPONSE", "payload": event.response.model_dump(exclude_none=True)}
    return json.dumps(body, ensure_ascii=False, default=str)


async def _load_server_tools(tenant_id: int) -> list:
    from approvals.server_tools import load_server_tools

    return await load_server_tools(tenant_id)
