"""The deployed client's frame check, for tests (protocol.md §1).

OwlLayerClient validates every frame it receives against a strict schema and
silently drops the ones that fail, so a server bug shows up as "nothing
happened". assert_client_accepts() applies the same rules independently of
aitp.protocol, so tests catch a frame the real client would drop.
"""

from __future__ import annotations

import json
import math
from typing import Any

MESSAGE_TYPES = frozenset({
    "HANDSHAKE_INIT", "HANDSHAKE_ACK", "CONTEXT_UPDATE", "USER_INPUT", "TOOL_CALL",
    "TOOL_RESULT", "APPROVAL_REQUEST", "APPROVAL_RESPONSE", "AGENT_RESPONSE",
    "AUDIO_STREAM", "VOICE_INPUT_END", "VOICE_INTERRUPT", "VOICE_STATE_EVENT", "SYSTEM_EVENT",
})
SERVER_TYPES = frozenset({
    "HANDSHAKE_ACK", "TOOL_CALL", "APPROVAL_REQUEST", "AGENT_RESPONSE",
    "AUDIO_STREAM", "VOICE_STATE_EVENT", "SYSTEM_EVENT",
})
SYSTEM_EVENT_KINDS = frozenset({
    "error", "waiting", "approval_required", "tools_effective",
    "transcript", "reload", "redirect", "disconnect",
})
RISKS = ("none", "low", "high", "critical")


class _Rejected(Exception):
    pass


# Field checks. Each takes the value (known to be present and not null).

def _string(value: Any) -> None:
    if not isinstance(value, str):
        raise _Rejected("must be a string")


def _non_empty_string(value: Any) -> None:
    if not isinstance(value, str) or not value:
        raise _Rejected("must be a non-empty string")


def _boolean(value: Any) -> None:
    if not isinstance(value, bool):
        raise _Rejected("must be a boolean")


def _object(value: Any) -> None:
    if not isinstance(value, dict):
        raise _Rejected("must be an object")


def _anything(value: Any) -> None:
    return None


def _positive_integer(value: Any) -> None:
    # JavaScript numbers: 30 and 30.0 are the same integer; true is not.
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _Rejected("must be an integer >= 1")
    if isinstance(value, float) and not value.is_integer():
        raise _Rejected("must be an integer >= 1")
    if value < 1:
        raise _Rejected("must be an integer >= 1")


def _string_list(value: Any) -> None:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise _Rejected("must be a list of strings")


def _object_list(value: Any) -> None:
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise _Rejected("must be a list of objects")


def _one_of(*allowed: str):
    def check(value: Any) -> None:
        if not isinstance(value, str) or value not in allowed:
            raise _Rejected(f"must be one of {', '.join(allowed)}")
    return check


REQUIRED, OPTIONAL, NULLABLE = "required", "optional", "nullable"

# type -> {field: (presence, check)}. OPTIONAL fields may be absent but never
# null; NULLABLE ones (a tool result) may be null.
PAYLOAD_SCHEMAS: dict[str, dict[str, tuple[str, Any]]] = {
    "HANDSHAKE_INIT": {
        "apiKey": (OPTIONAL, _string), "userAgent": (OPTIONAL, _string),
        "viewport": (OPTIONAL, _string), "sdkVersion": (OPTIONAL, _string),
        "protocolVersion": (REQUIRED, _string),
    },
    "HANDSHAKE_ACK": {
        "sessionId": (REQUIRED, _string), "serverVersion": (REQUIRED, _string),
        "protocolVersion": (REQUIRED, _string), "capabilities": (REQUIRED, _string_list),
        "maxActiveTools": (OPTIONAL, _positive_integer),
    },
    "CONTEXT_UPDATE": {
        "url": (OPTIONAL, _string), "title": (OPTIONAL, _string),
        "activeTools": (OPTIONAL, _object_list), "context": (OPTIONAL, _object),
    },
    "USER_INPUT": {
        "modality": (REQUIRED, _one_of("text", "audio")), "content": (REQUIRED, _string),
        "mimeType": (OPTIONAL, _string),
    },
    "TOOL_CALL": {
        "callId": (REQUIRED, _non_empty_string), "name": (REQUIRED, _string),
        "args": (REQUIRED, _object),
    },
    "TOOL_RESULT": {
        "callId": (REQUIRED, _non_empty_string),
        "status": (REQUIRED, _one_of("success", "error", "pending_approval")),
        "result": (NULLABLE, _anything), "error": (OPTIONAL, _string),
    },
    "APPROVAL_REQUEST": {
        "callId": (REQUIRED, _non_empty_string), "toolName": (REQUIRED, _string),
        "risk": (REQUIRED, _one_of(*RISKS)), "args": (REQUIRED, _object),
        "message": (REQUIRED, _non_empty_string),
    },
    "APPROVAL_RESPONSE": {
        "callId": (REQUIRED, _non_empty_string), "approved": (REQUIRED, _boolean),
        "result": (NULLABLE, _anything), "error": (OPTIONAL, _string),
    },
    "AGENT_RESPONSE": {"chunk": (REQUIRED, _string), "done": (REQUIRED, _boolean)},
    "AUDIO_STREAM": {"data": (REQUIRED, _string), "mimeType": (OPTIONAL, _string)},
    "VOICE_INPUT_END": {"reason": (REQUIRED, _one_of("user_stop", "vad", "timeout"))},
    "VOICE_INTERRUPT": {"reason": (OPTIONAL, _string)},
    "VOICE_STATE_EVENT": {
        "event": (REQUIRED, _one_of("turn_complete", "interrupted", "waiting_for_input")),
        "reason": (OPTIONAL, _string),
    },
    "SYSTEM_EVENT": {
        "kind": (REQUIRED, _one_of(*sorted(SYSTEM_EVENT_KINDS))),
        "message": (OPTIONAL, _string), "data": (OPTIONAL, _object),
    },
}


def client_rejection(text: str | bytes, *, from_server: bool = True) -> str | None:
    """Why the deployed client would drop this frame, or None when it accepts it.

    from_server also requires a type the server may send.
    """
    try:
        frame = json.loads(text, parse_constant=_no_constant)
    except (ValueError, RecursionError):
        return "not valid json"
    if not isinstance(frame, dict):
        return "frame is not an object"
    return _envelope_rejection(frame, from_server) or _payload_rejection(
        frame["type"], frame["payload"])


def _envelope_rejection(frame: dict, from_server: bool) -> str | None:
    frame_id = frame.get("id")
    if not isinstance(frame_id, str) or not frame_id:
        return "id must be a non-empty string"
    frame_type = frame.get("type")
    if not isinstance(frame_type, str) or frame_type not in MESSAGE_TYPES:
        return f"unknown type {frame_type!r}"
    if from_server and frame_type not in SERVER_TYPES:
        return f"type {frame_type} is not sent by a server"
    timestamp = frame.get("timestamp")
    if (isinstance(timestamp, bool) or not isinstance(timestamp, (int, float))
            or not math.isfinite(timestamp)):
        return "timestamp must be a number"
    if not isinstance(frame.get("payload"), dict):
        return "payload must be an object"
    if "meta" in frame and not isinstance(frame["meta"], dict):
        return "meta must be an object when present (null is rejected)"
    return None


def _payload_rejection(frame_type: str, payload: dict) -> str | None:
    for field, (presence, check) in PAYLOAD_SCHEMAS[frame_type].items():
        if field not in payload:
            if presence == REQUIRED:
                return f"payload.{field} is missing"
            continue
        value = payload[field]
        if value is None:
            if presence == NULLABLE:
                continue
            return f"payload.{field} is null"
        try:
            check(value)
        except _Rejected as exc:
            return f"payload.{field} {exc}"
    return None


def assert_client_accepts(text: str | bytes, *, from_server: bool = True) -> dict:
    """Fail the test when the deployed client would drop this frame; return it parsed."""
    reason = client_rejection(text, from_server=from_server)
    if reason is not None:
        raise AssertionError(f"client would drop frame ({reason}): {_preview(text)}")
    return json.loads(text)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not json")


def _preview(text: str | bytes, limit: int = 300) -> str:
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    return text if len(text) <= limit else text[:limit] + "..."
