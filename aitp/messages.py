"""AITP's vocabulary: the 14 message types, who sends each, their payloads.

The pydantic models here are the one description of what a frame holds:
the server parses with them, and ``aitp.wire_schema`` writes the JSON
Schema the Python client and the browser client's tests check frames
against. Pure: no Django, no I/O.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, model_validator

PROTOCOL_VERSION = "1.0.0"


class MessageType(str, enum.Enum):
    HANDSHAKE_INIT = "HANDSHAKE_INIT"
    HANDSHAKE_ACK = "HANDSHAKE_ACK"
    CONTEXT_UPDATE = "CONTEXT_UPDATE"
    USER_INPUT = "USER_INPUT"
    TOOL_CALL = "TOOL_CALL"
    TOOL_RESULT = "TOOL_RESULT"
    APPROVAL_REQUEST = "APPROVAL_REQUEST"
    APPROVAL_RESPONSE = "APPROVAL_RESPONSE"
    AGENT_RESPONSE = "AGENT_RESPONSE"
    AUDIO_STREAM = "AUDIO_STREAM"
    VOICE_INPUT_END = "VOICE_INPUT_END"
    VOICE_INTERRUPT = "VOICE_INTERRUPT"
    VOICE_STATE_EVENT = "VOICE_STATE_EVENT"
    SYSTEM_EVENT = "SYSTEM_EVENT"


# The spec's direction column. APPROVAL_REQUEST and AUDIO_STREAM go both ways.
CLIENT_TYPES: frozenset[MessageType] = frozenset({
    MessageType.HANDSHAKE_INIT,
    MessageType.CONTEXT_UPDATE,
    MessageType.USER_INPUT,
    MessageType.TOOL_RESULT,
    MessageType.APPROVAL_REQUEST,
    MessageType.APPROVAL_RESPONSE,
    MessageType.AUDIO_STREAM,
    MessageType.VOICE_INPUT_END,
    MessageType.VOICE_INTERRUPT,
})
SERVER_TYPES: frozenset[MessageType] = frozenset({
    MessageType.HANDSHAKE_ACK,
    MessageType.TOOL_CALL,
    MessageType.APPROVAL_REQUEST,
    MessageType.AGENT_RESPONSE,
    MessageType.AUDIO_STREAM,
    MessageType.VOICE_STATE_EVENT,
    MessageType.SYSTEM_EVENT,
})

SystemEventKind = Literal[
    "error", "waiting", "approval_required", "tools_effective",
    "transcript", "reload", "redirect", "disconnect",
]
SYSTEM_EVENT_KINDS: tuple[str, ...] = get_args(SystemEventKind)

TYPES_BY_VALUE = {t.value: t for t in MessageType}


# --- payload models -------------------------------------------------------


class Payload(BaseModel):
    """Base of every payload model.

    strict: JSON has real booleans and integers, so "true" is not a bool and a
    bool is not an int. extra="ignore": the client strips unknown keys too.
    """

    # ser_json_inf_nan="constants": a NaN we were handed must fail loudly in
    # serialize() (JSON has no NaN), not turn silently into a null.
    model_config = ConfigDict(extra="ignore", strict=True, frozen=True,
                              ser_json_inf_nan="constants")

    @model_validator(mode="before")
    @classmethod
    def _null_means_default(cls, data: Any) -> Any:
        # Be liberal in what we accept: an explicit null for an optional field
        # with a non-null default ("url": null) means "not given".
        if not isinstance(data, dict):
            return data
        fields = cls.model_fields
        drop = [
            key for key, value in data.items()
            if value is None and key in fields and not fields[key].is_required()
            and (fields[key].default is not None or fields[key].default_factory is not None)
        ]
        if not drop:
            return data
        return {k: v for k, v in data.items() if k not in drop}


class ResumeOffer(Payload):
    # protocol.md §3a: absent on a client's first socket; the token its last
    # HANDSHAKE_ACK gave it on the next.
    token: str | None = Field(default=None, max_length=200)
    # The ``meta.seq`` of the last frame the client handled on its previous
    # socket: a session still held by this process sends it what followed.
    lastSeq: int | None = Field(default=None, ge=0, le=2**53 - 1)


class HandshakeInit(Payload):
    apiKey: str | None = None
    userAgent: str | None = None
    viewport: str | None = None
    sdkVersion: str | None = None
    protocolVersion: str
    # Present (even empty) when the client can continue its session on a new socket.
    resume: ResumeOffer | None = None
    # protocol.md §3c: the tenant's backend vouching for the visitor (a JWT).
    visitorToken: str | None = Field(default=None, max_length=4096)


class HandshakeAck(Payload):
    sessionId: str
    serverVersion: str
    protocolVersion: str
    capabilities: list[str]
    # protocol.md §1: any value but an integer >= 1 invalidates the whole ACK.
    maxActiveTools: int | None = Field(default=None, ge=1)
    # Only to a client that offered ``resume``: the token for its next
    # socket, and whether this socket continued the session it named.
    resumeToken: str | None = None
    resumed: bool | None = None


class ContextUpdate(Payload):
    url: str = ""
    title: str = ""
    # Tool declarations are checked by aitp.tools; here only "objects".
    activeTools: list[dict[str, Any]] = Field(default_factory=list)
    context: dict[str, Any] = Field(default_factory=dict)


class UserInput(Payload):
    modality: Literal["text", "audio"]
    content: str
    mimeType: str | None = None


class ToolCall(Payload):
    callId: str = Field(min_length=1)
    name: str
    args: dict[str, Any]


class ToolResult(Payload):
    callId: str = Field(min_length=1)
    status: Literal["success", "error", "pending_approval"]
    result: Any = None
    error: str | None = None


class ApprovalRequest(Payload):
    callId: str = Field(min_length=1)
    toolName: str
    risk: Literal["none", "low", "high", "critical"]
    args: dict[str, Any]
    # protocol.md §1: an empty message makes the client drop the frame.
    message: str = Field(min_length=1)


class ApprovalResponse(Payload):
    callId: str = Field(min_length=1)
    approved: bool
    result: Any = None
    error: str | None = None


class AgentResponse(Payload):
    chunk: str
    done: bool
    # Whose words these are when a person answers in the agent's place
    # (protocol.md section 5b): the operator's display name.
    operator: str | None = None


class AudioStream(Payload):
    data: str
    mimeType: str | None = None


class VoiceInputEnd(Payload):
    reason: Literal["user_stop", "vad", "timeout"]


class VoiceInterrupt(Payload):
    reason: str = "barge_in"


class VoiceStateEvent(Payload):
    event: Literal["turn_complete", "interrupted", "waiting_for_input"]
    reason: str | None = None


class SystemEvent(Payload):
    kind: SystemEventKind
    message: str | None = None
    data: dict[str, Any] | None = None


PAYLOAD_MODELS: dict[MessageType, type[BaseModel]] = {
    MessageType.HANDSHAKE_INIT: HandshakeInit,
    MessageType.HANDSHAKE_ACK: HandshakeAck,
    MessageType.CONTEXT_UPDATE: ContextUpdate,
    MessageType.USER_INPUT: UserInput,
    MessageType.TOOL_CALL: ToolCall,
    MessageType.TOOL_RESULT: ToolResult,
    MessageType.APPROVAL_REQUEST: ApprovalRequest,
    MessageType.APPROVAL_RESPONSE: ApprovalResponse,
    MessageType.AGENT_RESPONSE: AgentResponse,
    MessageType.AUDIO_STREAM: AudioStream,
    MessageType.VOICE_INPUT_END: VoiceInputEnd,
    MessageType.VOICE_INTERRUPT: VoiceInterrupt,
    MessageType.VOICE_STATE_EVENT: VoiceStateEvent,
    MessageType.SYSTEM_EVENT: SystemEvent,
}


# --- envelope ---------------------------------------------------------------


@dataclass(frozen=True)
class Message:
    type: MessageType
    payload: BaseModel
    id: str
    timestamp: int
    meta: dict[str, Any] | None = None
