"""AITP wire format: the 14 message types, frame parsing, serialization.

Pure and synchronous: no Django, no Channels, no asyncio, no I/O. The rules
quoted in comments are the protocol's, as docs/protocol.md describes them
(what this server implements and what the deployed clients do).
"""

from __future__ import annotations

import enum
import json
import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, cast

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from aitp import ids

PROTOCOL_VERSION = "1.0.0"

# protocol.md §11: "one frame: 1 MiB (daphne's default limit)".
DEFAULT_MAX_BYTES = 1024 * 1024
# Objects and lists inside one frame, the envelope counting as 1. A page's
# context is a few levels deep; thousands of levels only break the layers
# after us (recursive encoders, the admin's pages).
DEFAULT_MAX_DEPTH = 32
# Integers must fit in 64 bits: the database columns, the JSON parsers of
# PostgreSQL drivers and SDKs, and Python's own int/str conversion limit
# (4,300 digits) all refuse or mangle bigger ones. Floats must be finite.
MAX_INTEGER = 2**63 - 1


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

SYSTEM_EVENT_KINDS = (
    "error", "waiting", "approval_required", "tools_effective",
    "transcript", "reload", "redirect", "disconnect",
)

_TYPES_BY_VALUE = {t.value: t for t in MessageType}


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


class HandshakeInit(Payload):
    apiKey: str | None = None
    userAgent: str | None = None
    viewport: str | None = None
    sdkVersion: str | None = None
    protocolVersion: str


class HandshakeAck(Payload):
    sessionId: str
    serverVersion: str
    protocolVersion: str
    capabilities: list[str]
    # protocol.md §1: any value but an integer >= 1 invalidates the whole ACK.
    maxActiveTools: int | None = Field(default=None, ge=1)


class ContextUpdate(Payload):
    url: str = ""
    title: str = ""
    # Tool declarations are checked by aitp.tools; here only "objects".
    activeTools: list[dict] = Field(default_factory=list)
    context: dict = Field(default_factory=dict)


class UserInput(Payload):
    modality: Literal["text", "audio"]
    content: str
    mimeType: str | None = None


class ToolCall(Payload):
    callId: str = Field(min_length=1)
    name: str
    args: dict


class ToolResult(Payload):
    callId: str = Field(min_length=1)
    status: Literal["success", "error", "pending_approval"]
    result: Any = None
    error: str | None = None


class ApprovalRequest(Payload):
    callId: str = Field(min_length=1)
    toolName: str
    risk: Literal["none", "low", "high", "critical"]
    args: dict
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
    kind: Literal[
        "error", "waiting", "approval_required", "tools_effective",
        "transcript", "reload", "redirect", "disconnect",
    ]
    message: str | None = None
    data: dict | None = None


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
    meta: dict | None = None


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
    return _parse_frame(text, max_bytes=max_bytes, allowed=CLIENT_TYPES, max_depth=max_depth,
                        strict_values=True)


def parse_server_frame(text: str | bytes, *, max_bytes: int = DEFAULT_MAX_BYTES) -> Message:
    """Parse one frame received from a server (our own Python client, tests)."""
    return _parse_frame(text, max_bytes=max_bytes, allowed=SERVER_TYPES,
                        max_depth=None, strict_values=False)


def _parse_frame(text: str | bytes, *, max_bytes: int, allowed: frozenset[MessageType],
                 max_depth: int | None, strict_values: bool) -> Message:
    if isinstance(text, (bytes, bytearray, memoryview)):
        raw = bytes(text)
        if len(raw) > max_bytes:
            raise _too_large(max_bytes)
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise ProtocolError("invalid_json", "frame is not valid utf-8") from None
    elif _utf8_length_exceeds(text, max_bytes):
        raise _too_large(max_bytes)

    out_of_range: list[bool] = []
    try:
        if strict_values:
            # Out-of-range numbers are kept as markers so that the refusal
            # below can name the field and the frame's id.
            integer, real = _number_checks(out_of_range)
            data = json.loads(text, parse_constant=_reject_constant, parse_float=real,
                              parse_int=integer)
        else:
            data = json.loads(text, parse_constant=_reject_constant, parse_float=_finite_float)
    except RecursionError:
        raise ProtocolError("too_deep", "frame is nested too deeply") from None
    except ValueError:
        # JSONDecodeError, NaN/Infinity, integers too long to convert.
        raise ProtocolError("invalid_json", "frame is not valid json") from None

    if not isinstance(data, dict):
        raise ProtocolError("invalid_message", "frame must be a json object")

    message_id = data.get("id")
    if strict_values and (out_of_range or _text_may_be_unstorable(text)
                          or _deeper_than(data, max_depth)):
        problem = find_unstorable(data, max_depth=max_depth)
        if problem is not None:
            code, path, fact = problem
            if isinstance(message_id, str) and text_problem(message_id) is not None:
                message_id = None  # never echo text the peer could not store either
            raw_type = data.get("type")
            raise ProtocolError(
                code, f"field '{path}' {fact}" if path else f"frame {fact}",
                message_id=message_id if isinstance(message_id, str) and message_id else None,
                type=raw_type[:64] if isinstance(raw_type, str) and not _BAD_TEXT.search(raw_type)
                else None,
            )
    if not isinstance(message_id, str) or not message_id:
        raise ProtocolError("invalid_message", "field 'id' must be a non-empty string")

    type_name = data.get("type")
    if not isinstance(type_name, str):
        raise ProtocolError("invalid_message", "field 'type' must be a string",
                            message_id=message_id)
    # Keep what we echo back short: the type comes from the peer.
    shown_type = type_name[:64]

    def invalid(reason: str) -> ProtocolError:
        return ProtocolError("invalid_message", reason, message_id=message_id, type=shown_type)

    timestamp = data.get("timestamp")
    if isinstance(timestamp, bool) or not isinstance(timestamp, (int, float)):
        raise invalid("field 'timestamp' must be a number")
    payload = data.get("payload")
    if not isinstance(payload, dict):
        raise invalid("field 'payload' must be an object")
    meta = data.get("meta")
    if meta is not None and not isinstance(meta, dict):
        raise invalid("field 'meta' must be an object")

    message_type = _TYPES_BY_VALUE.get(type_name)
    if message_type is None:
        raise ProtocolError("unknown_type", f"unknown message type '{shown_type}'",
                            message_id=message_id, type=shown_type)
    if message_type not in allowed:
        raise ProtocolError("wrong_direction",
                            f"message type '{shown_type}' cannot be sent by this peer",
                            message_id=message_id, type=shown_type)

    try:
        model = PAYLOAD_MODELS[message_type].model_validate(payload)
    except ValidationError as exc:
        raise invalid(describe_validation_error(exc, prefix="payload")) from None

    return Message(type=message_type, payload=model, id=message_id,
                   timestamp=int(timestamp), meta=meta)


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
                   ) -> tuple[Callable[[str], int | _OutOfRange], Callable[[str], float]]:
    """json.loads' number hooks for a client frame: values as json makes them
    (an integer too long to convert kept as a marker), and an entry in
    ``out_of_range`` for each one ``find_unstorable`` refuses."""
    def integer(literal: str) -> int | _OutOfRange:
        # 18 digits are always in range; int() of 5,000 digits is itself refused.
        if len(literal) - (literal[0] == "-") <= 18:
            return int(literal)
        value = _bounded_int(literal)
        if type(value) is not int or abs(value) > MAX_INTEGER:
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


def _deeper_than(value: Any, max_depth: int | None) -> bool:
    """Whether the parsed frame nests objects and arrays more than
    ``max_depth`` levels deep (the frame itself is level 1)."""
    if max_depth is None:
        return False
    stack: list[tuple[Any, int]] = [(value, 1)]
    pop, push = stack.pop, stack.append
    while stack:
        item, depth = pop()
        if depth > max_depth:
            return True
        depth += 1
        for child in (item.values() if type(item) is dict else item):
            if type(child) is dict or type(child) is list:
                push((child, depth))
    return False


class _OutOfRange:
    """An integer literal too long to convert, kept until it is reported."""

    __slots__ = ()


def _bounded_int(text: str) -> int | _OutOfRange:
    # Decide on the length first: int() of 5,000 digits is itself refused.
    if len(text) - (text[0] == "-") > 20:
        return _OutOfRange()
    return int(text)


# U+0000 (PostgreSQL text and jsonb refuse it) and lone surrogates (no UTF-8
# encoding exists for them; JSON.stringify emits one after a .slice() through
# an emoji). Every other character, control characters included, is stored
# and sent on unchanged.
_BAD_TEXT = re.compile("[\x00\ud800-\udfff]")


def text_problem(text: str) -> str | None:
    """Why this string cannot be stored faithfully, or None."""
    found = _BAD_TEXT.search(text)
    if found is None:
        return None
    if found.group() == "\x00":
        return "contains a NUL character (U+0000)"
    return f"contains a lone surrogate (U+{ord(found.group()):04X}); text must be valid Unicode"


def storable_text(text: str) -> str:
    """``text`` with each character ``text_problem`` refuses (U+0000, a lone
    surrogate) replaced by U+FFFD, as a UTF-8 decoder replaces bytes it
    cannot read; the same string when there is none."""
    if _BAD_TEXT.search(text) is None:
        return text
    return _BAD_TEXT.sub("\ufffd", text)


def find_unstorable(value: Any, *, max_depth: int | None = DEFAULT_MAX_DEPTH
                    ) -> tuple[str, str, str] | None:
    """The first value in a parsed JSON tree no later layer could hold.

    Returns (code, path, fact) -- e.g. ("invalid_text", "payload.context.name",
    "contains a NUL character (U+0000)") -- or None when every value can be
    stored. Iterative, so any depth is walked without recursion; the path is
    only spelled out for the value refused.

    The tree may come from anywhere (a frame, a server tool's answer, a
    Python tool's return value): anything JSON has no value for (a set,
    bytes, an object, a name that is not text) is ``invalid_value``. A
    frame's parse never makes one.
    """
    # Nearly every frame holds nothing to refuse: a walk that only answers
    # whether it does comes first, and the one that names the path runs
    # only when there is something to name.
    if not _any_unstorable(value, max_depth):
        return None
    return _first_unstorable(value, max_depth)


# A tool's result is the third level of its TOOL_RESULT frame (the envelope,
# its payload, the result itself), as a call's arguments are of its TOOL_CALL.
RESULT_LEVEL = 3


def find_unstorable_result(value: Any, *, max_depth: int | None = DEFAULT_MAX_DEPTH
                           ) -> tuple[str, str, str] | None:
    """``find_unstorable`` of a tool's answer, whatever it came from (a
    server tool's webhook or Python handler): the check a page's TOOL_RESULT
    result gets inside its frame of at most ``max_depth`` levels, at the
    same depth. The arguments the model writes for a call get it too: they
    sit at the same level of their TOOL_CALL."""
    depth = None if max_depth is None else max(1, max_depth - (RESULT_LEVEL - 1))
    return find_unstorable(value, max_depth=depth)


def _first_unstorable(value: Any, max_depth: int | None) -> tuple[str, str, str] | None:
    """``find_unstorable``'s answer, walked with the way to each value."""
    # A node: (value, parent node, key or index in the parent, depth).
    stack: list[tuple] = [(value, None, None, 1)]
    while stack:
        node = stack.pop()
        item, _, _, depth = node
        if isinstance(item, str):
            fact = text_problem(item)
            if fact is not None:
                return "invalid_text", _path_of(node), fact
        elif isinstance(item, float):
            if not math.isfinite(item):  # 1e400 parses to inf
                return "invalid_number", _path_of(node), "is out of range (not a finite number)"
        elif isinstance(item, _OutOfRange) or (isinstance(item, int) and not isinstance(item, bool)):
            if isinstance(item, _OutOfRange) or abs(item) > MAX_INTEGER:
                return ("invalid_number", _path_of(node),
                        f"is out of range (at most {MAX_INTEGER} in magnitude)")
        elif isinstance(item, (dict, list)):
            if max_depth is not None and depth > max_depth:
                return "too_deep", _path_of(node), f"is nested more than {max_depth} levels deep"
            if isinstance(item, dict):
                for key, child in item.items():
                    if not isinstance(key, str):
                        return ("invalid_value", _path_of(node),
                                "has a name that is not text (JSON names are strings)")
                    if text_problem(key) is not None:
                        return ("invalid_text", _path_of((None, node, key, depth + 1)),
                                f"has a name that {text_problem(key)}")
                    stack.append((child, node, key, depth + 1))
            else:
                stack.extend((child, node, index, depth + 1) for index, child in enumerate(item))
        elif item is not None and not isinstance(item, bool):
            return "invalid_value", _path_of(node), "is not a JSON value"
    return None


def _any_unstorable(value: Any, max_depth: int | None) -> bool:
    """Whether ``find_unstorable`` finds anything: the same checks, without
    keeping the way to each value. The values json.loads makes are told by
    their exact type and checked where their container is walked; anything
    else is stacked and checked as the detailed walk checks it."""
    search = _BAD_TEXT.search
    isfinite = math.isfinite
    stack: list[tuple[Any, int]] = [(value, 1)]
    pop, push = stack.pop, stack.append
    while stack:
        item, depth = pop()
        if type(item) is dict or type(item) is list:
            children = item.values() if type(item) is dict else item
        elif isinstance(item, str):
            if search(item) is not None:
                return True
            continue
        elif isinstance(item, float):
            if not isfinite(item):
                return True
            continue
        elif isinstance(item, _OutOfRange) or (isinstance(item, int) and not isinstance(item, bool)):
            if isinstance(item, _OutOfRange) or abs(item) > MAX_INTEGER:
                return True
            continue
        elif isinstance(item, (dict, list)):
            children = item.values() if isinstance(item, dict) else item
        elif item is None or isinstance(item, bool):
            continue
        else:
            return True  # not a JSON value at all
        if max_depth is not None and depth > max_depth:
            return True
        if isinstance(item, dict):
            for key in item:
                if not isinstance(key, str) or search(key) is not None:
                    return True
        depth += 1
        for child in children:
            kind = type(child)
            if kind is str:
                if search(child) is not None:
                    return True
            elif kind is int:
                if child > MAX_INTEGER or child < -MAX_INTEGER:
                    return True
            elif kind is float:
                if not isfinite(child):
                    return True
            elif child is not None and kind is not bool:
                push((child, depth))
    return False


def _path_of(node: tuple) -> str:
    parts: list[Any] = []
    while node is not None and node[1] is not None:
        parts.append(node[2])
        node = node[1]
    path = ""
    for part in reversed(parts):
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            shown = _shown_key(part)
            path = f"{path}.{shown}" if path else shown
    # What is echoed to the peer stays short, however deep the value was.
    return path if len(path) <= 120 else "..." + path[-100:]


def _shown_key(key: Any) -> str:
    text = str(key)
    text = _BAD_TEXT.sub("?", text)
    return text if len(text) <= 32 else text[:32] + "..."


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


def make_message(type: MessageType, payload: BaseModel | dict, *, meta: dict | None = None,
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
    payload = message.payload
    envelope: dict[str, Any] = {
        "id": message.id,
        "type": MessageType(message.type).value,
        "timestamp": message.timestamp,
        "payload": None,
    }
    if message.meta is not None:
        envelope["meta"] = message.meta
    if type(payload) is SystemEvent:
        # Its data is JSON as the server built it (tools_effective: every
        # declaration of the page): written as it is, without pydantic's
        # walk of each value; what json cannot write goes the long way below.
        envelope["payload"] = _system_event_fields(payload)
        try:
            return _json_text(envelope)
        except (TypeError, ValueError):
            pass
    envelope["payload"] = payload.model_dump(mode="json", exclude_none=True)
    return _json_text(envelope)


def serialize_system_event(message: Message, data_json: str) -> str:
    """``serialize(message)`` of a SYSTEM_EVENT whose data the server has
    written already (``data_json``: ``compact_json`` of the message's data):
    put in as it is, not written again."""
    event = message.payload
    if type(event) is not SystemEvent or message.meta is not None:
        return serialize(message)
    fields: dict[str, Any] = {"kind": event.kind}
    if event.message is not None:
        fields["message"] = event.message
    head = _json_text({"id": message.id, "type": MessageType.SYSTEM_EVENT.value,
                       "timestamp": message.timestamp, "payload": fields})
    # head ends with the payload's "}" and the frame's "}".
    text = f'{head[:-2]},"data":{data_json}}}}}'
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return serialize(message)  # a lone surrogate: written escaped, the long way
    return text


def compact_json(value: Any) -> str:
    """JSON text as a frame writes it (compact, characters as they are)."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def _system_event_fields(event: SystemEvent) -> dict[str, Any]:
    """SYSTEM_EVENT's payload as ``model_dump(exclude_none=True)`` gives it."""
    fields: dict[str, Any] = {"kind": event.kind}
    if event.message is not None:
        fields["message"] = event.message
    if event.data is not None:
        fields["data"] = event.data
    return fields


def _json_text(envelope: dict[str, Any]) -> str:
    text = compact_json(envelope)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        # A lone surrogate (which a client may legitimately send as "\ud800")
        # cannot be written as UTF-8; escaped JSON carries it unchanged.
        text = json.dumps(envelope, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
    return text


# --- convenience constructors (server -> client) ------------------------------


def system_event(kind: str, message: str | None = None, data: dict | None = None,
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
                  max_active_tools: int | None) -> Message:
    return make_message(MessageType.HANDSHAKE_ACK, HandshakeAck(
        sessionId=session_id,
        serverVersion=server_version,
        protocolVersion=PROTOCOL_VERSION,
        capabilities=list(capabilities),
        maxActiveTools=max_active_tools,
    ))


def agent_response(chunk: str, done: bool) -> Message:
    return make_message(MessageType.AGENT_RESPONSE, AgentResponse(chunk=chunk, done=done))


def tool_call(call_id: str, name: str, args: dict) -> Message:
    return make_message(MessageType.TOOL_CALL, ToolCall(callId=call_id, name=name, args=args))


def approval_request(call_id: str, tool_name: str, risk: str, args: dict,
                     message: str) -> Message:
    # risk may be an aitp.tools.Risk (a str enum): send its plain value.
    risk_value = risk.value if isinstance(risk, enum.Enum) else risk
    return make_message(MessageType.APPROVAL_REQUEST, ApprovalRequest(
        callId=call_id, toolName=tool_name, risk=cast(Any, risk_value), args=args, message=message,
    ))


def voice_state(event: str, reason: str | None = None) -> Message:
    return make_message(MessageType.VOICE_STATE_EVENT,
                        VoiceStateEvent(event=cast(Any, event), reason=reason))
