"""AITP frames: parsing what a peer sent, serializing what we send.

Pure and synchronous: no Django, no Channels, no asyncio, no I/O. The
messages themselves are ``aitp.messages``' models and the values no later
layer could hold ``aitp.storable``'s; both are named here too, so that the
rest of the server reads the wire through this one module. The rules quoted
in comments are the protocol's, as docs/protocol.md describes them (what
this server implements and what the deployed clients do).
"""

from __future__ import annotations

import enum
import json
import math
import re
import time
from collections.abc import Callable
from typing import Any, cast

from pydantic import BaseModel, ValidationError

from aitp.messages import (
    CLIENT_TYPES,
    PAYLOAD_MODELS,
    PROTOCOL_VERSION,
    SERVER_TYPES,
    SYSTEM_EVENT_KINDS,
    TYPES_BY_VALUE,
    AgentResponse,
    ApprovalRequest,
    ApprovalResponse,
    AudioStream,
    ContextUpdate,
    HandshakeAck,
    HandshakeInit,
    Message,
    MessageType,
    Payload,
    SystemEvent,
    ToolCall,
    ToolResult,
    UserInput,
    VoiceInputEnd,
    VoiceInterrupt,
    VoiceStateEvent,
)
from aitp.storable import (
    BAD_TEXT,
    DEFAULT_MAX_DEPTH,
    MAX_INTEGER,
    RESULT_LEVEL,
    OutOfRange,
    bounded_int,
    find_unstorable,
    find_unstorable_result,
    storable_text,
    text_problem,
)
from runtime import ids

__all__ = [
    "CLIENT_TYPES", "DEFAULT_MAX_BYTES", "DEFAULT_MAX_DEPTH", "MAX_INTEGER", "PAYLOAD_MODELS",
    "PROTOCOL_VERSION", "RESULT_LEVEL", "SERVER_TYPES", "SYSTEM_EVENT_KINDS",
    "AgentResponse", "ApprovalRequest", "ApprovalResponse", "AudioStream", "ContextUpdate",
    "HandshakeAck", "HandshakeInit", "Message", "MessageType", "Payload", "ProtocolError",
    "SystemEvent", "ToolCall", "ToolResult", "UserInput", "VoiceInputEnd", "VoiceInterrupt",
    "VoiceStateEvent",
    "agent_response", "approval_request", "compact_json", "describe_validation_error",
    "error_event", "find_unstorable", "find_unstorable_result", "handshake_ack", "make_message",
    "parse_client_frame", "parse_server_frame", "serialize", "storable_text", "system_event",
    "text_problem", "tool_call", "voice_state",
]

# protocol.md §11: "one frame: 1 MiB (daphne's default limit)".
DEFAULT_MAX_BYTES = 1024 * 1024


class ProtocolError(Exception):
    """The peer broke the protocol.

    code is stable and machine-readable (invalid_json, invalid_message,
    invalid_text, invalid_number, too_deep, unknown_type, wrong_direction,
    too_large); message is a short sentence
    safe to show to the peer. message_id and type are those of the offending
    frame when they could be read.
    """

    def __init__(self, code: str, message: str, *,
                 message_id: str | None = None, type: str | None = None):
        super().__init__(message)
        self.code = code
        self.message = message
        self.message_id = message_id
        self.type = type

    def __repr__(self) -> str:
        return f"ProtocolError({self.code!r}, {self.message!r})"


def parse_client_frame(text: str | bytes, *, max_bytes: int,
                       max_depth: int = DEFAULT_MAX_DEPTH) -> Message:
    """Parse one frame received from a client; raise ProtocolError.

    Every value of a frame that parses can go everywhere a value goes next
    (UTF-8, SQLite JSON, PostgreSQL jsonb, the model request): text with a
    lone surrogate or U+0000 is refused (invalid_text), so are integers
    beyond 64 bits and non-finite numbers (invalid_number) and nesting deeper
    than max_depth (too_deep).
    """
    data = _client_json(_frame_text(text, max_bytes), max_depth)
    return _message(data, CLIENT_TYPES)


def parse_server_frame(text: str | bytes, *, max_bytes: int = DEFAULT_MAX_BYTES) -> Message:
    """Parse one frame received from a server (our own Python client, tests)."""
    data = _loads(_frame_text(text, max_bytes), parse_constant=_reject_constant,
                  parse_float=_finite_float)
    return _message(data, SERVER_TYPES)


# How far into an unread frame its type is looked for: the clients write
# ``{"id": ..., "type": ..., ...}``, the type within the first few dozen characters.
_TYPE_NEAR_START = 256
_USER_INPUT_TYPE = re.compile(r'"type"\s*:\s*"USER_INPUT"')


def names_user_input(text: str | bytes) -> bool:
    """Whether a frame left unparsed (dropped by a rate limit) says near its
    start that it is a USER_INPUT: a look at a few hundred characters, never a parse."""
    head = text[:_TYPE_NEAR_START]
    if isinstance(head, bytes):
        head = head.decode("utf-8", "replace")
    return _USER_INPUT_TYPE.search(head) is not None


def _frame_text(text: str | bytes, max_bytes: int) -> str:
    """The frame as text, refused when it is larger than ``max_bytes`` in UTF-8."""
    if isinstance(text, str):
        if _utf8_length_exceeds(text, max_bytes):
            raise _too_large(max_bytes)
        return text
    raw = bytes(text)
    if len(raw) > max_bytes:
        raise _too_large(max_bytes)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ProtocolError("invalid_json", "frame is not valid utf-8") from None


def _loads(text: str, **hooks: Any) -> dict[str, Any]:
    try:
        data = json.loads(text, **hooks)
    except RecursionError:
        raise ProtocolError("too_deep", "frame is nested too deeply") from None
    except ValueError:
        # JSONDecodeError, NaN/Infinity, integers too long to convert.
        raise ProtocolError("invalid_json", "frame is not valid json") from None
    if not isinstance(data, dict):
        raise ProtocolError("invalid_message", "frame must be a json object")
    return data


def _client_json(text: str, max_depth: int | None) -> dict[str, Any]:
    """A client frame's JSON, refused (naming the field) when a value in it
    is one no later layer could hold. Out-of-range numbers are kept as
    markers so that the refusal can name the field and the frame's id."""
    out_of_range: list[bool] = []
    integer, real = _number_checks(out_of_range)
    data = _loads(text, parse_constant=_reject_constant, parse_float=real, parse_int=integer)
    # The walk runs only when the text, the numbers or the nesting say
    # there may be something to find: nearly every frame holds nothing.
    if out_of_range or _text_may_be_unstorable(text) or _may_be_deeper(text, max_depth):
        problem = find_unstorable(data, max_depth=max_depth)
        if problem is not None:
            raise _unstorable(data, *problem)
    return data


def _unstorable(data: dict[str, Any], code: str, path: str, fact: str) -> ProtocolError:
    message_id = data.get("id")
    if not isinstance(message_id, str) or not message_id or text_problem(message_id) is not None:
        message_id = None  # never echo text the peer could not store either
    raw_type = data.get("type")
    shown_type = raw_type[:64] if isinstance(raw_type, str) and not BAD_TEXT.search(raw_type) else None
    return ProtocolError(code, f"field '{path}' {fact}" if path else f"frame {fact}",
                         message_id=message_id, type=shown_type)


def _message(data: dict[str, Any], allowed: frozenset[MessageType]) -> Message:
    """The message of a parsed frame whose type ``allowed`` holds."""
    message_id = data.get("id")
    if not isinstance(message_id, str) or not message_id:
        raise ProtocolError("invalid_message", "field 'id' must be a non-empty string")
    type_name = data.get("type")
    if not isinstance(type_name, str):
        raise ProtocolError("invalid_message", "field 'type' must be a string",
                            message_id=message_id)
    # Keep what we echo back short: the type comes from the peer.
    shown_type = type_name[:64]
    problem = _envelope_problem(data)
    if problem is not None:
        raise ProtocolError("invalid_message", problem, message_id=message_id, type=shown_type)
    message_type = _message_type(type_name, allowed, message_id, shown_type)
    try:
        model = PAYLOAD_MODELS[message_type].model_validate(data["payload"])
    except ValidationError as exc:
        raise ProtocolError("invalid_message", describe_validation_error(exc, prefix="payload"),
                            message_id=message_id, type=shown_type) from None
    return Message(type=message_type, payload=model, id=message_id,
                   timestamp=int(data["timestamp"]), meta=data.get("meta"))


def _envelope_problem(data: dict[str, Any]) -> str | None:
    timestamp = data.get("timestamp")
    if isinstance(timestamp, bool) or not isinstance(timestamp, (int, float)):
        return "field 'timestamp' must be a number"
    if not isinstance(data.get("payload"), dict):
        return "field 'payload' must be an object"
    meta = data.get("meta")
    if meta is not None and not isinstance(meta, dict):
        return "field 'meta' must be an object"
    return None


def _message_type(type_name: str, allowed: frozenset[MessageType], message_id: str,
                  shown_type: str) -> MessageType:
    message_type = TYPES_BY_VALUE.get(type_name)
    if message_type is None:
        raise ProtocolError("unknown_type", f"unknown message type '{shown_type}'",
                            message_id=message_id, type=shown_type)
    if message_type not in allowed:
        raise ProtocolError("wrong_direction",
                            f"message type '{shown_type}' cannot be sent by this peer",
                            message_id=message_id, type=shown_type)
    return message_type


def _utf8_length_exceeds(text: str, max_bytes: int) -> bool:
    # A code point takes 1 to 4 bytes: decide without encoding when we can.
    if len(text) > max_bytes:
        return True
    if len(text) * 4 <= max_bytes:
        return False
    # surrogatepass: a lone surrogate must not turn a size check into a crash.
    return len(text.encode("utf-8", "surrogatepass")) > max_bytes


def _too_large(max_bytes: int) -> ProtocolError:
    return ProtocolError("too_large", f"frame is larger than {max_bytes} bytes")


def _reject_constant(name: str) -> Any:
    # NaN and Infinity are not JSON; JSON.stringify never produces them.
    raise ValueError(f"{name} is not json")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e400 parses to inf
        raise ValueError("number out of range")
    return value


def _number_checks(out_of_range: list[bool]
                   ) -> tuple[Callable[[str], int | OutOfRange], Callable[[str], float]]:
    """json.loads' number hooks for a client frame: values as json makes them
    (an integer too long to convert kept as a marker), and an entry in
    ``out_of_range`` for each one ``find_unstorable`` refuses."""
    def integer(literal: str) -> int | OutOfRange:
        # 18 digits are always in range; int() of 5,000 digits is itself refused.
        if len(literal) - (literal[0] == "-") <= 18:
            return int(literal)
        value = bounded_int(literal)
        if not isinstance(value, int) or abs(value) > MAX_INTEGER:
            out_of_range.append(True)
        return value

    def real(literal: str) -> float:
        value = float(literal)
        if not math.isfinite(value):  # 1e400 parses to inf
            out_of_range.append(True)
        return value

    return integer, real


def _text_may_be_unstorable(text: str) -> bool:
    """Whether the frame's text may hold a string ``find_unstorable`` refuses:
    U+0000 or a lone surrogate, as it is or escaped (an escaped surrogate
    pair, or an escaped backslash before a 'u', only looks like one)."""
    if "\\u" in text or "\x00" in text:
        return True
    if text.isascii():
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _may_be_deeper(text: str, max_depth: int | None) -> bool:
    """Whether the frame's text may nest objects and arrays more than
    ``max_depth`` levels deep: each level opens with a bracket of its own."""
    return max_depth is not None and text.count("{") + text.count("[") > max_depth


_ERROR_TEXT = {
    "missing": "is required",
    "string_type": "must be a string",
    "bool_type": "must be a boolean",
    "int_type": "must be an integer",
    "float_type": "must be a number",
    "dict_type": "must be an object",
    "model_type": "must be an object",
    "list_type": "must be a list",
    "string_too_short": "must not be empty",
}


def describe_validation_error(exc: ValidationError, *, prefix: str = "") -> str:
    """A short message from the first pydantic error: "field 'payload.callId' is required".

    Pydantic's own text is not sent to peers: it is long and changes between versions.
    """
    error = exc.errors(include_url=False)[0]
    path = prefix
    for part in error["loc"]:
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            path = f"{path}.{part}" if path else str(part)
    kind = error["type"]
    ctx = error.get("ctx") or {}
    if kind in _ERROR_TEXT:
        fact = _ERROR_TEXT[kind]
    elif kind == "literal_error":
        fact = f"must be {ctx.get('expected', 'one of the allowed values')}"
    elif kind == "greater_than_equal":
        fact = f"must be >= {ctx.get('ge')}"
    else:
        fact = "is invalid"
    return f"field '{path}' {fact}" if path else f"payload {fact}"



# --- building and serializing -----------------------------------------------


def make_message(type: MessageType, payload: BaseModel | dict[str, Any], *, meta: dict[str, Any] | None = None,
                 now_ms: int | None = None, id: str | None = None) -> Message:
    """Build a message; dict payloads are validated through the type's model.

    Raises ValueError (pydantic's ValidationError) when our own code builds an
    invalid payload, TypeError when the payload model does not match the type.
    """
    message_type = MessageType(type)
    model_class = PAYLOAD_MODELS[message_type]
    if isinstance(payload, dict):
        model = model_class.model_validate(payload)
    elif isinstance(payload, model_class):
        model = payload
    else:
        raise TypeError(f"payload for {message_type.value} must be {model_class.__name__}")
    if id is None:
        id = f"msg_{ids.uuid4()}"
    if now_ms is None:
        now_ms = int(time.time() * 1000)
    return Message(type=message_type, payload=model, id=id, timestamp=now_ms, meta=meta)


def serialize(message: Message) -> str:
    """Compact JSON for one frame.

    protocol.md §1: the deployed client drops a whole frame when an optional
    field is null, so None-valued payload fields and a None meta are left out.
    Only top-level payload fields are pruned: a null inside args, data or a
    result is data, not an absent field.
    """
    envelope: dict[str, Any] = {
        "id": message.id,
        "type": MessageType(message.type).value,
        "timestamp": message.timestamp,
        "payload": message.payload.model_dump(mode="json", exclude_none=True),
    }
    if message.meta is not None:
        envelope["meta"] = message.meta
    text = compact_json(envelope)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        # A lone surrogate (which a client may legitimately send as "\ud800")
        # cannot be written as UTF-8; escaped JSON carries it unchanged.
        text = json.dumps(envelope, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
    return text


def compact_json(value: Any) -> str:
    """JSON text as a frame writes it (compact, characters as they are)."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


# --- convenience constructors (server -> client) ------------------------------


def system_event(kind: str, message: str | None = None, data: dict[str, Any] | None = None,
                 **kw: Any) -> Message:
    """SYSTEM_EVENT; kw goes to make_message (meta, now_ms, id)."""
    if kind not in SYSTEM_EVENT_KINDS:
        raise ValueError(f"unknown system event kind {kind!r}")
    # Checked just above (and by the model): one of the Literal's values.
    return make_message(MessageType.SYSTEM_EVENT,
                        SystemEvent(kind=cast(Any, kind), message=message, data=data), **kw)


def error_event(code: str, message: str, **data: Any) -> Message:
    """SYSTEM_EVENT kind=error with data={"code": code, **data}; None values are left out."""
    extra = {key: value for key, value in data.items() if value is not None}
    return system_event("error", message, {"code": code, **extra})


def handshake_ack(session_id: str, server_version: str, capabilities: list[str] | tuple[str, ...],
                  max_active_tools: int | None, *, resume_token: str | None = None,
                  resumed: bool | None = None) -> Message:
    """``resume_token`` and ``resumed``: only for a client that offered to resume."""
    return make_message(MessageType.HANDSHAKE_ACK, HandshakeAck(
        sessionId=session_id,
        serverVersion=server_version,
        protocolVersion=PROTOCOL_VERSION,
        capabilities=list(capabilities),
        maxActiveTools=max_active_tools,
        resumeToken=resume_token,
        resumed=resumed,
    ))


def agent_response(chunk: str, done: bool, *, operator: str | None = None) -> Message:
    return make_message(MessageType.AGENT_RESPONSE, AgentResponse(chunk=chunk, done=done, operator=operator))


def tool_call(call_id: str, name: str, args: dict[str, Any]) -> Message:
    return make_message(MessageType.TOOL_CALL, ToolCall(callId=call_id, name=name, args=args))


def approval_request(call_id: str, tool_name: str, risk: str, args: dict[str, Any],
                     message: str) -> Message:
    # risk may be an aitp.tools.Risk (a str enum): send its plain value.
    risk_value = risk.value if isinstance(risk, enum.Enum) else risk
    return make_message(MessageType.APPROVAL_REQUEST, ApprovalRequest(
        callId=call_id, toolName=tool_name, risk=cast(Any, risk_value), args=args, message=message,
    ))


def voice_state(event: str, reason: str | None = None) -> Message:
    return make_message(MessageType.VOICE_STATE_EVENT,
                        VoiceStateEvent(event=cast(Any, event), reason=reason))
