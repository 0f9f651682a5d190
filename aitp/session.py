"""The AITP connection state machine, sans I/O.

No awaits, no clock, no ORM: the consumer feeds it the text of each frame and
the connection's runner (``connection.runner``) carries out what it decides
(frames to send, a close). Everything the spec says about what may happen in
which state lives in this one file, but where the turn is: the turn machine
(``aitp.turn``) it holds.

    AWAITING_HANDSHAKE --HANDSHAKE_INIT ok--> OPEN --refuse/close--> CLOSED
            |                                   ^
            +------- refuse / timeout ----------+--> CLOSED

A HANDSHAKE_INIT that passes the pure checks (protocol version, key present
and consistent) becomes a ``HandshakeRequested`` event: the key lookup is I/O,
so the connection's runner answers with ``accept_handshake()`` or ``refuse()``.

Voice (AUDIO_STREAM, VOICE_INPUT_END, VOICE_INTERRUPT, USER_INPUT modality
"audio") is accepted only when ``capabilities`` holds "audio"; the audio is
checked here (``aitp.voice.inbound``) and comes out as events. Otherwise each
gets ``voice_unavailable``, and no voice frame is ever sent.
"""
from __future__ import annotations

import enum
import json
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, cast

from aitp import protocol as p
from aitp.close_codes import CLOSE_POLICY, MAX_CLOSE_REASON_BYTES
from aitp.outbox import Outbox
from aitp.tools import ToolError, ToolSpec, ToolSurface, parse_client_tools
from aitp.turn import PageMistake, TurnEvent, TurnMachine
from aitp.voice import inbound
from aitp.voice.audio import AudioRefused
from aitp.voice.base import Audio


class State(enum.Enum):
    AWAITING_HANDSHAKE = "awaiting_handshake"
    OPEN = "open"
    CLOSED = "closed"


@dataclass(frozen=True)
class Limits:
    max_message_bytes: int = 1024 * 1024
    max_active_tools: int = 30
    max_context_bytes: int = 64 * 1024
    max_invalid_frames: int = 20
    max_input_chars: int = 8000
    max_json_depth: int = p.DEFAULT_MAX_DEPTH
    # The longest audio message (USER_INPUT modality "audio"), in seconds.
    max_audio_seconds: float = 30.0


# --- events the consumer acts on ---------------------------------------------


@dataclass(frozen=True)
class HandshakeRequested:
    api_key: str
    init: p.HandshakeInit


@dataclass(frozen=True)
class ContextChanged:
    url: str
    title: str
    context: dict[str, Any]
    tools: tuple[ToolSpec, ...]
    surface: ToolSurface
    # The tools' declarations as a JSON array (the surface's client_tools_json; None: not written).
    tools_json: str | None = None


@dataclass(frozen=True)
class UserTextReceived:
    text: str


@dataclass(frozen=True)
class ToolResultReceived:
    result: p.ToolResult


@dataclass(frozen=True)
class ApprovalRequestReceived:
    request: p.ApprovalRequest


@dataclass(frozen=True)
class ApprovalResponseReceived:
    response: p.ApprovalResponse


@dataclass(frozen=True)
class UserAudioReceived:
    """A whole audio message (USER_INPUT modality "audio"), checked; a turn starts."""

    audio: Audio


@dataclass(frozen=True)
class AudioChunkReceived:
    """One checked chunk of the live microphone (AUDIO_STREAM), 16 kHz PCM."""

    pcm: bytes


@dataclass(frozen=True)
class VoiceInputEnded:
    reason: str  # user_stop, vad or timeout


@dataclass(frozen=True)
class VoiceInterrupted:
    reason: str


# Frames only a session offered "audio" may send.
VOICE_IN = frozenset({p.MessageType.AUDIO_STREAM, p.MessageType.VOICE_INPUT_END,
                      p.MessageType.VOICE_INTERRUPT})
# Frames (besides SYSTEM_EVENT transcript) only a session offered "audio" is sent.
VOICE_OUT = frozenset({p.MessageType.AUDIO_STREAM, p.MessageType.VOICE_STATE_EVENT})

Event = (
    HandshakeRequested
    | ContextChanged
    | UserTextReceived
    | UserAudioReceived
    | AudioChunkReceived
    | VoiceInputEnded
    | VoiceInterrupted
    | ToolResultReceived
    | ApprovalRequestReceived
    | ApprovalResponseReceived
)


@dataclass
class Close:
    code: int
    reason: str


def _is_voice(message: p.Message) -> bool:
    if message.type in VOICE_OUT:
        return True
    return (message.type is p.MessageType.SYSTEM_EVENT
            and cast(p.SystemEvent, message.payload).kind == "transcript")


def _short_reason(reason: str) -> str:
    encoded = reason.encode("utf-8")[:MAX_CLOSE_REASON_BYTES]
    return encoded.decode("utf-8", errors="ignore")


@dataclass
class SessionMachine:
    limits: Limits
    server_version: str
    capabilities: tuple[str, ...] = ("text", "tools")
    query_api_key: str | None = None

    state: State = State.AWAITING_HANDSHAKE
    session_id: str | None = None
    handshake_pending: bool = False
    # Where the connection's turn is (aitp.turn): a second USER_INPUT is
    # refused while one runs.
    turn: TurnMachine = field(default_factory=TurnMachine)
    invalid_in_a_row: int = 0
    # Every invalid frame of the connection (its flood log counts them).
    invalid_frames: int = 0
    close: Close | None = None
    # The error code of a permanent refusal (``refuse``), once given.
    refused: str | None = None
    url: str = ""
    title: str = ""
    context: dict[str, Any] = field(default_factory=dict)
    client_tools: tuple[ToolSpec, ...] = ()
    server_tools: tuple[ToolSpec, ...] = ()
    outbox: Outbox | None = None  # a client that can resume: its numbered frames
    _outgoing: list[str] = field(default_factory=list)
    _surface: ToolSurface | None = field(default=None, repr=False, compare=False)

    # --- input -----------------------------------------------------------

    def receive_text(self, data: str | bytes) -> list[Event]:
        """Feed one frame; returns the events for the consumer. Replies and a
        close, if any, are queued (``data_to_send()``, ``close``)."""
        if self.state is State.CLOSED:
            return []
        try:
            message = p.parse_client_frame(data, max_bytes=self.limits.max_message_bytes,
                                           max_depth=self.limits.max_json_depth)
        except p.ProtocolError as exc:
            # A frame too large or too broken to parse says what it is near its start.
            if exc.type == p.MessageType.USER_INPUT.value or (exc.type is None and p.names_user_input(data)):
                self._refuse_input(exc.code, exc.message, message_id=exc.message_id)
            else:
                self._invalid(exc.code, exc.message, message_id=exc.message_id)
            return []
        return self._dispatch(message)

    def frame_dropped(self, data: str | bytes) -> None:
        """A frame a rate limit dropped unread. The page waits for a done
        after every USER_INPUT it sends, dropped or not (protocol.md §5)."""
        if self.state is State.OPEN and p.names_user_input(data):
            self._input_refused()

    def _dispatch(self, message: p.Message) -> list[Event]:
        if self.state is State.AWAITING_HANDSHAKE:
            return self._awaiting_handshake(message)
        if message.type in VOICE_IN and not self.audio:
            # HANDSHAKE_ACK did not offer "audio".
            self.invalid_in_a_row = 0
            self.error("voice_unavailable", "voice is not available on this server",
                       message_id=message.id)
            return []
        if message.type is p.MessageType.USER_INPUT and self.outbox is not None and self.outbox.repeated(message.id):
            return []  # sent again on a new socket, but taken once already (aitp.outbox)
        return _OPEN_HANDLERS[message.type](self, message)

    def _awaiting_handshake(self, message: p.Message) -> list[Event]:
        if message.type is p.MessageType.HANDSHAKE_INIT and not self.handshake_pending:
            self.invalid_in_a_row = 0
            return self._handshake(cast(p.HandshakeInit, message.payload))
        self._invalid("handshake_required", "send HANDSHAKE_INIT before any other message", message_id=message.id)
        return []

    def _already_open(self, message: p.Message) -> list[Event]:
        self._invalid("already_open", "the session is already open", message_id=message.id)
        return []

    def _passed_on(self, message: p.Message) -> list[Event]:
        """A frame the machine checks no further: the turn's business."""
        self.invalid_in_a_row = 0
        return [_PASSED_ON[message.type](message.payload)]

    def _audio_stream(self, message: p.Message) -> list[Event]:
        chunk = cast(p.AudioStream, message.payload)
        try:
            pcm = inbound.stream_chunk(chunk.data, chunk.mimeType)
        except AudioRefused as exc:
            self._invalid(exc.code, exc.message, message_id=message.id)
            return []
        self.invalid_in_a_row = 0
        return [AudioChunkReceived(pcm)]

    @property
    def audio(self) -> bool:
        """Whether this session speaks the voice messages (HANDSHAKE_ACK offers "audio")."""
        return "audio" in self.capabilities

    def _handshake(self, init: p.HandshakeInit) -> list[Event]:
        if init.protocolVersion != p.PROTOCOL_VERSION:
            self.refuse("protocol_version_mismatch", f"protocol version {init.protocolVersion} is not "
                        f"supported; this server speaks {p.PROTOCOL_VERSION}", "protocol version mismatch")
            return []
        query_key = self.query_api_key or None
        init_key = init.apiKey or None
        if query_key and init_key and query_key != init_key:
            self.refuse("api_key_mismatch", "the API key in the URL and in HANDSHAKE_INIT differ",
                        "api key mismatch")
            return []
        api_key = init_key or query_key
        if not api_key:
            self.refuse("missing_api_key", "an API key is required", "missing api key")
            return []
        self.handshake_pending = True
        return [HandshakeRequested(api_key=api_key, init=init)]

    def _context_update(self, message: p.Message) -> list[Event]:
        update = cast(p.ContextUpdate, message.payload)
        if len(update.activeTools) > self.limits.max_active_tools:
            self._invalid(
                "too_many_tools",
                f"{len(update.activeTools)} tools declared; at most "
                f"{self.limits.max_active_tools} are allowed",
                message_id=message.id,
            )
            return []
        context_bytes = len(
            json.dumps(update.context, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
        )
        if context_bytes > self.limits.max_context_bytes:
            self._invalid(
                "context_too_large",
                f"context is {context_bytes} bytes; at most {self.limits.max_context_bytes} are allowed",
                message_id=message.id,
            )
            return []
        try:
            # The frame was parsed for this call alone: its schemas are the specs' own.
            tools = tuple(parse_client_tools(update.activeTools, owned=True))
        except ToolError as exc:
            self._invalid(exc.code, exc.message, message_id=message.id)
            return []
        self.invalid_in_a_row = 0
        self.url, self.title, self.context, self.client_tools = (
            update.url, update.title, update.context, tools,
        )
        surface = self.surface
        self.send(p.system_event("tools_effective", data=surface.to_event_data()))
        return [ContextChanged(update.url, update.title, update.context, tools, surface,
                               surface.client_tools_json)]

    def _user_input(self, message: p.Message) -> list[Event]:
        user_input = cast(p.UserInput, message.payload)
        if user_input.modality == "audio":
            return self._user_audio(message, user_input)
        text = user_input.content
        if not text.strip():
            self._refuse_input("empty_input", "the message is empty", message_id=message.id)
            return []
        if len(text) > self.limits.max_input_chars:
            self._refuse_input("input_too_long", f"the message has {len(text)} characters; at most "
                               f"{self.limits.max_input_chars} are allowed", message_id=message.id)
            return []
        self.invalid_in_a_row = 0
        return [UserTextReceived(text)] if self._turn_starts(TurnEvent.TYPED, message) else []

    def _user_audio(self, message: p.Message, user_input: p.UserInput) -> list[Event]:
        if not self.audio:
            self.invalid_in_a_row = 0
            self.error("voice_unavailable", "audio input is not available on this server", message_id=message.id)
            self._input_refused()
            return []
        try:
            audio = inbound.whole_message(user_input.content, user_input.mimeType,
                                          max_seconds=self.limits.max_audio_seconds)
        except AudioRefused as exc:
            self._refuse_input(exc.code, exc.message, message_id=message.id)
            return []
        self.invalid_in_a_row = 0
        return [UserAudioReceived(audio)] if self._turn_starts(TurnEvent.AUDIO_MESSAGE, message) else []

    def _turn_starts(self, event: TurnEvent, message: p.Message) -> bool:
        """The page's input takes the turn, or is refused while one runs."""
        try:
            self.turn.step(event)
        except PageMistake as exc:
            self.error(exc.code, exc.message, message_id=message.id)
            return False
        return True

    # --- decisions from the consumer ------------------------------------------

    def accept_handshake(self, session_id: str, *, resume_token: str | None = None,
                         resumed: bool | None = None, numbered_from: int = 0,
                         last_input: str | None = None) -> None:
        """``resume_token`` (and ``resumed``): only to a client that offered
        to resume, whose frames are numbered after ``numbered_from``."""
        assert self.state is State.AWAITING_HANDSHAKE and self.handshake_pending
        self.session_id = session_id
        self.state = State.OPEN
        self.handshake_pending = False
        ack = p.handshake_ack(
            session_id, self.server_version, list(self.capabilities), self.limits.max_active_tools,
            resume_token=resume_token, resumed=resumed,
        )
        if resume_token is not None:
            self.outbox = Outbox(seq=numbered_from)
            ack = replace(ack, meta=self.outbox.ack_meta(last_input))  # where the numbers start
        self._outgoing.append(p.serialize(ack))

    def refuse(self, code: str, message: str, reason: str, *, close_code: int = CLOSE_POLICY) -> None:
        """A permanent refusal: an error the client can show, then a close it
        will not retry (protocol.md §10)."""
        if self.state is State.CLOSED:
            return
        self.refused = code
        self._queue(p.error_event(code, message))
        self.close_now(close_code, reason)

    def close_now(self, code: int, reason: str) -> None:
        if self.state is State.CLOSED:
            return
        self.state = State.CLOSED
        self.close = Close(code, _short_reason(reason))

    def handshake_timed_out(self) -> None:
        """The handshake deadline passed. A handshake still being looked up
        times out too: a handshake always completes or times out, so a
        lookup that failed or hangs can never leave the socket open without
        a key. The consumer checks the state after its lookup."""
        if self.state is State.AWAITING_HANDSHAKE:
            self.handshake_pending = False
            self.refuse("handshake_timeout", "the handshake did not complete in time", "handshake timeout")

    def set_server_tools(self, tools: tuple[ToolSpec, ...]) -> None:
        self.server_tools = tuple(tools)

    @property
    def surface(self) -> ToolSurface:
        """The same object while the page's and the server's tools stay the
        same (the agent keys its model-ready tool list on it)."""
        built = self._surface
        if built is None or built.server_tools is not self.server_tools or (
            built.client_tools is not self.client_tools
        ):
            built = self._surface = ToolSurface.build(self.server_tools, self.client_tools)
        return built

    # --- output --------------------------------------------------------------

    def send(self, message: p.Message, *, text: str | None = None) -> None:
        """Queue a frame for the peer (``text``: the message written
        already); nothing is sent once closed, and no voice frame to a
        session that was not offered "audio"."""
        if not self.audio and _is_voice(message):
            return
        if self.state is State.OPEN or (
            self.state is State.AWAITING_HANDSHAKE and message.type is p.MessageType.SYSTEM_EVENT
        ):
            self._queue(message, text)

    def error(self, code: str, message: str, **data: Any) -> None:
        self.send(p.error_event(code, message, **{k: v for k, v in data.items() if v is not None}))

    def data_to_send(self) -> list[str]:
        out, self._outgoing = self._outgoing, []
        return out

    def _queue(self, message: p.Message, text: str | None = None) -> None:
        outbox = self.outbox
        if outbox is None:
            self._outgoing.append(p.serialize(message) if text is None else text)
            return
        self._outgoing.append(outbox.numbered(message))

    def _refuse_input(self, code: str, message: str, *, message_id: str | None = None) -> None:
        """A USER_INPUT that starts no turn: its error, then the empty done
        frame the client waits for after every USER_INPUT (protocol.md §5)."""
        self._invalid(code, message, message_id=message_id)
        self._input_refused()

    def _input_refused(self) -> None:
        # While a turn runs, its own done frame ends the page's wait.
        if not self.turn.busy:
            self.send(p.agent_response("", True))

    def _invalid(self, code: str, message: str, *, message_id: str | None = None) -> None:
        """The peer sent something we cannot use: tell it, keep the
        connection, but not forever."""
        self.invalid_in_a_row += 1
        self.invalid_frames += 1
        if self.invalid_in_a_row >= self.limits.max_invalid_frames:
            self.refuse(
                "too_many_invalid_frames",
                f"{self.invalid_in_a_row} invalid messages in a row",
                "too many invalid frames",
            )
            return
        data = {"messageId": message_id} if message_id else {}
        self._queue(p.error_event(code, message, **data))


# The frames an open session passes on as they are, each as its event.
_PASSED_ON: dict[p.MessageType, Callable[[Any], Event]] = {
    p.MessageType.TOOL_RESULT: ToolResultReceived,
    p.MessageType.APPROVAL_REQUEST: ApprovalRequestReceived,
    p.MessageType.APPROVAL_RESPONSE: ApprovalResponseReceived,
    p.MessageType.VOICE_INPUT_END: lambda payload: VoiceInputEnded(payload.reason),
    p.MessageType.VOICE_INTERRUPT: lambda payload: VoiceInterrupted(payload.reason),
}

# What an open session does with each kind of frame the page may send.
_OPEN_HANDLERS: dict[p.MessageType, Callable[[SessionMachine, p.Message], list[Event]]] = {
    p.MessageType.HANDSHAKE_INIT: SessionMachine._already_open,
    p.MessageType.CONTEXT_UPDATE: SessionMachine._context_update,
    p.MessageType.USER_INPUT: SessionMachine._user_input,
    p.MessageType.AUDIO_STREAM: SessionMachine._audio_stream,
    **dict.fromkeys(_PASSED_ON, SessionMachine._passed_on),
}
