"""The Channels consumer: accept the socket, parse each frame through the
session machine, hand the events to the connection's runner, and tear the
connection down -- nothing else.

What a connection runs (its turn, timers, voice, the session it opens, its
row and watchers) is the runner's (``connection.runner``), given to this
consumer by the site's routing (``AitpConsumer.as_asgi(runner=...)``): the
protocol app imports none of the apps built on it.

Every handler runs through ``dispatch``: whatever one raises, the connection
is closed (1011: our bug, not the page's) and torn down, never left half
alive with its row counted against the key.
"""
from __future__ import annotations

import contextlib
import logging
from typing import Any, Protocol
from urllib.parse import parse_qs

from channels.exceptions import StopConsumer
from channels.generic.websocket import AsyncWebsocketConsumer
from django.db import DatabaseError

from aitp import processes
from aitp.close_codes import CLOSE_GOING_AWAY, CLOSE_INTERNAL_ERROR, CLOSE_TRY_AGAIN_LATER
from aitp.limits import ConnectionLimits
from aitp.session import Event, SessionMachine, State
from runtime.db import DbCallConsumer

logger = logging.getLogger(__name__)


class Runner(Protocol):
    """What a connection runs, as the consumer drives it (``connection.runner``)."""

    machine: SessionMachine
    rate_limits: ConnectionLimits
    closed: bool

    def start(self) -> None: ...

    async def handle(self, event: Event) -> None: ...

    async def flush(self) -> None: ...

    async def command(self, event: dict) -> None: ...

    async def recheck_key(self) -> None: ...

    def start_teardown(self, code: int, reason: str) -> None: ...

    async def disconnect(self, code: int) -> None: ...

    async def shutdown(self, message: str) -> None: ...


class RunnerFactory(Protocol):
    """Builds a connection's runner and, with it, its session machine."""

    def __call__(self, socket: Any, *, query_api_key: str | None, origin: str,
                 preview_ticket: str | None = None) -> Runner: ...


class AitpConsumer(DbCallConsumer, AsyncWebsocketConsumer):
    def __init__(self, *args: Any, runner: RunnerFactory, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.new_runner = runner
        self.machine: SessionMachine | None = None
        self.runner: Runner | None = None
        # The channel of the process its session runs on, when it is relayed there.
        self.relayed_to: str | None = None

    async def dispatch(self, message) -> None:
        try:
            await super().dispatch(message)
        except StopConsumer:
            raise
        except Exception:
            logger.exception("session %s: %s handler failed; closing the connection",
                             getattr(self.machine, "session_id", None), message.get("type"))
            await self._fail()
            if message.get("type") == "websocket.disconnect":
                raise StopConsumer() from None

    async def _fail(self) -> None:
        machine, runner = self.machine, self.runner
        if machine is None or runner is None:  # connect() failed before anything was set up
            with contextlib.suppress(Exception):
                await self.close(code=CLOSE_INTERNAL_ERROR)
            return
        machine.refuse("internal_error", "Something went wrong on the server.", "internal error",
                       close_code=CLOSE_INTERNAL_ERROR)
        try:
            await runner.flush()
        except Exception:
            logger.exception("session %s: could not send the close", machine.session_id)
            if not runner.closed:
                runner.closed = True
                with contextlib.suppress(Exception):
                    await self.close(code=CLOSE_INTERNAL_ERROR)
        code = machine.close.code if machine.close is not None else CLOSE_INTERNAL_ERROR
        runner.start_teardown(code, "internal error")

    async def connect(self) -> None:
        query = parse_qs(self.scope.get("query_string", b"").decode("latin-1"))
        headers = dict(self.scope.get("headers") or [])
        self.runner = self.new_runner(self, query_api_key=(query.get("apiKey") or [None])[0],
                                      origin=headers.get(b"origin", b"").decode("latin-1"),
                                      preview_ticket=(query.get("previewTicket") or [None])[0])
        self.machine = self.runner.machine
        # Accept first: every refusal is an AITP error frame + 1008, never an
        # HTTP 403 the browser would retry forever (protocol.md §10).
        await self.accept()
        self.runner.start()
        processes.connection_opened(self)
        if processes.draining():
            await self.shutdown(processes.SHUTDOWN_MESSAGE)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        data = text_data if text_data is not None else bytes_data
        if self.relayed_to is not None:
            await self.channel_layer.send(self.relayed_to, {"type": "relay.inbound", "text": data or ""})
            return
        if self.runner is None:
            return  # let go of its session, closing
        await take_frame(self.runner, data or "")

    def let_go(self) -> None:
        """Its session is held for a newer socket (``connection.holding``):
        whatever this socket still sends or is told, it is no longer the session's."""
        self.runner = None

    def relay_through(self, holder: str) -> None:
        """Its session runs on another process (``connection.relay``): the
        page's frames go to ``holder``, that process's channel for it, and
        what it sends comes back as ``relay.outbound`` and ``relay.close``."""
        self.runner, self.relayed_to = None, holder

    async def relay_outbound(self, event: dict) -> None:
        if self.relayed_to is not None:  # a relay this socket gave up on sends it nothing
            await self.send(text_data=event["text"])

    async def relay_close(self, event: dict) -> None:
        if self.relayed_to is not None:
            self.relayed_to = None
            await self.close(code=event["code"], reason=event.get("reason") or None)

    def take_over(self, runner: Runner) -> None:
        """The session this socket continues was held by another runner of
        this process (``connection.holding``): that runner is this
        connection's from now on."""
        self.runner, self.machine = runner, runner.machine

    # --- notifications from the channel layer -----------------------------------

    async def key_changed(self, event: dict) -> None:
        if self.runner is not None:
            await self.runner.recheck_key()

    async def session_command(self, event: dict) -> None:
        if self.runner is not None:
            await self.runner.command(event)

    # --- teardown -------------------------------------------------------------------

    async def websocket_disconnect(self, message) -> None:
        """Channels' own, without its ``aclose_old_connections`` on the shared
        sync thread at every close: this consumer's database work runs
        through ``db_call``, which tidies around each call (``DbCallConsumer``).
        Its groups are left in the runner's teardown."""
        await self.disconnect(message["code"])
        raise StopConsumer()

    async def disconnect(self, code: int) -> None:
        relayed_to, self.relayed_to = self.relayed_to, None
        if relayed_to is not None:
            with contextlib.suppress(Exception):  # that process's hold ends the session by itself
                await self.channel_layer.send(relayed_to, {"type": "relay.gone", "code": code,
                                                           "channel": self.channel_name})
        if self.runner is not None:
            await self.runner.disconnect(code)
        processes.connection_closed(self)

    async def shutdown(self, message: str) -> None:
        """The server is stopping (``aitp.processes`` drains every live
        connection): the page is told, the socket closes with 1001 and the
        connection ends as a disconnect does."""
        if self.runner is not None:
            await self.runner.shutdown(message)
        elif self.relayed_to is not None:
            await self.close(code=CLOSE_GOING_AWAY)  # the page comes back on a process that stays


async def take_frame(runner: Runner, data: str | bytes) -> None:
    """One frame of the page, through the runner's session machine: the
    frame limits, the events it makes, what they send back."""
    machine = runner.machine
    if not await runner.rate_limits.allow_frame(machine):
        machine.frame_dropped(data)  # dropped, not parsed
        await runner.flush()
        return
    events = machine.receive_text(data)
    runner.show_watchers(events, data)
    for event in events:
        try:
            await runner.handle(event)
        except DatabaseError:
            logger.exception("session %s: database error", machine.session_id)
            _database_unavailable(machine)
        except Exception:
            # Our bug, not the page's: log it, tell the page, keep the
            # connection -- unless the handshake failed: it completes or
            # is refused, never stays pending without a key.
            logger.exception("session %s: failed to handle %s", machine.session_id, type(event).__name__)
            _internal_error(machine)
    await runner.flush()


def _internal_error(machine: SessionMachine) -> None:
    if machine.state is State.AWAITING_HANDSHAKE:
        machine.refuse("internal_error", "Something went wrong on the server.",
                       "internal error", close_code=CLOSE_INTERNAL_ERROR)
    else:
        machine.error("internal_error", "Something went wrong on the server.")


def _database_unavailable(machine: SessionMachine) -> None:
    if machine.state is State.AWAITING_HANDSHAKE:
        # Worth retrying: 1013 makes the client reconnect later.
        machine.refuse(
            "temporarily_unavailable", "The service is briefly unavailable; retrying.",
            "try again later", close_code=CLOSE_TRY_AGAIN_LATER,
        )
    else:
        machine.error("temporarily_unavailable", "The service is briefly unavailable.")
