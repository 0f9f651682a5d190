"""Strict checks of AITP frames, as the deployed client applies them.

The browser client (OwlLayerClient 0.4.x) validates every frame it receives
against a strict schema and silently drops a frame that fails
(protocol.md §1). A dropped frame looks like "nothing happened",
so this module names every reason a frame would be dropped instead.

``frame_problems()`` returns the list of problems (empty when the frame is
accepted); ``check_frame()`` raises ``InvalidFrame`` with all of them.
Pure Python: no I/O, no Django, no asyncio.
"""
from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any, TypeGuard

MESSAGE_TYPES = frozenset(
    {
        "HANDSHAKE_INIT",
        "HANDSHAKE_ACK",
        "CONTEXT_UPDATE",
        "USER_INPUT",
        "TOOL_CALL",
        "TOOL_RESULT",
        "APPROVAL_REQUEST",
        "APPROVAL_RESPONSE",
        "AGENT_RESPONSE",
        "AUDIO_STREAM",
        "VOICE_INPUT_END",
        "VOICE_INTERRUPT",
        "VOICE_STATE_EVENT",
        "SYSTEM_EVENT",
    }
)

# Who may send each type (docs/protocol.md §2).
SERVER_TYPES = frozenset(
    {
        "HANDSHAKE_ACK",
        "TOOL_CALL",
        "APPROVAL_REQUEST",
        "AGENT_RESPONSE",
        "AUDIO_STREAM",
        "VOICE_STATE_EVENT",
        "SYSTEM_EVENT",
    }
)
CLIENT_TYPES = frozenset(
    {
        "HANDSHAKE_INIT",
        "CONTEXT_UPDATE",
        "USER_INPUT",
        "TOOL_RESULT",
        "APPROVAL_REQUEST",
        "APPROVAL_RESPONSE",
        "AUDIO_STREAM",
        "VOICE_INPUT_END",
        "VOICE_INTERRUPT",
    }
)

SYSTEM_EVENT_KINDS = frozenset(
    {
        "error",
        "waiting",
        "approval_required",
        "tools_effective",
        "transcript",
        "reload",
        "redirect",
        "disconnect",
    }
)
VOICE_STATE_EVENTS = frozenset({"turn_complete", "interrupted", "waiting_for_input"})
VOICE_INPUT_END_REASONS = frozenset({"user_stop", "vad", "timeout"})
RISKS = frozenset({"none", "low", "high", "critical"})
TOOL_RESULT_STATUSES = frozenset({"success", "error", "pending_approval"})
USER_INPUT_MODALITIES = frozenset({"text", "audio"})

# An epoch in milliseconds is past 10**12 since 2001; a value below it is
# almost certainly seconds, which the client would read as January 1970.
_MIN_EPOCH_MS = 10**12


class InvalidFrame(ValueError):
    """The frame would be dropped by the client; ``problems`` says why."""

    def __init__(self, problems: list[str], frame: Any = None) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems
        self.frame = frame


def check_frame(frame: Any, *, sender: str = "server") -> dict:
    """Return ``frame`` when it is acceptable, else raise ``InvalidFrame``."""
    problems = frame_problems(frame, sender=sender)
    if problems:
        raise InvalidFrame(problems, frame)
    return frame


def frame_problems(frame: Any, *, sender: str = "server") -> list[str]:
    """Every reason the receiving side would drop ``frame`` (empty: accepted).

    ``sender`` is "server" for frames the browser client receives, "client"
    for frames a page sends to the server.
    """
    if sender not in ("server", "client"):
        raise ValueError(f"sender must be 'server' or 'client', got {sender!r}")
    if not isinstance(frame, dict):
        return [f"frame is {_kind(frame)}, not an object"]
    problems: list[str] = []
    _check_envelope(frame, problems)
    frame_type = frame.get("type")
    payload = frame.get("payload")
    if frame_type in MESSAGE_TYPES:
        allowed = SERVER_TYPES if sender == "server" else CLIENT_TYPES
        if frame_type not in allowed:
            problems.append(f"type {frame_type} is never sent by the {sender}")
        elif isinstance(payload, dict):
            checker = _PAYLOAD_CHECKS[(sender, frame_type)]
            checker(_Payload(payload, problems, strict_nulls=sender == "server"))
    return problems


def _check_envelope(frame: dict, problems: list[str]) -> None:
    frame_id = frame.get("id")
    if not isinstance(frame_id, str) or not frame_id:
        problems.append(f"id must be a non-empty string, got {_show(frame_id)}")
    frame_type = frame.get("type")
    if frame_type not in MESSAGE_TYPES:
        problems.append(f"type {_show(frame_type)} is not one of the 14 AITP types")
    timestamp = frame.get("timestamp")
    if not _is_number(timestamp):
        problems.append(f"timestamp must be a number, got {_show(timestamp)}")
    elif timestamp < _MIN_EPOCH_MS:
        problems.append(f"timestamp {timestamp} is not in epoch milliseconds")
    if not isinstance(frame.get("payload"), dict):
        problems.append(f"payload must be an object, got {_show(frame.get('payload'))}")
    if "meta" in frame:
        meta = frame["meta"]
        if not isinstance(meta, dict):
            problems.append(f"meta must be an object when present, got {_show(meta)}")
        elif "sessionId" in meta and not isinstance(meta["sessionId"], str):
            problems.append(f"meta.sessionId must be a string, got {_show(meta['sessionId'])}")


class _Payload:
    """Field checks on one payload, appending to a shared problem list."""

    def __init__(self, payload: dict, problems: list[str], *, strict_nulls: bool) -> None:
        self.payload = payload
        self.problems = problems
        self.strict_nulls = strict_nulls
        if strict_nulls:
            # protocol.md §1: "Never send null for an optional field." No
            # server payload field is nullable, so any top-level null fails.
            for key, value in payload.items():
                if value is None:
                    problems.append(f"payload.{key} is null (leave the key out instead)")

    def _get(self, key: str, required: bool) -> tuple[bool, Any]:
        """(present, value); a null already reported or tolerated counts as absent."""
        if key not in self.payload:
            if required:
                self.problems.append(f"payload.{key} is missing")
            return False, None
        value = self.payload[key]
        if value is None and (self.strict_nulls or not required):
            return False, None
        return True, value

    def string(self, key: str, *, required: bool = True, non_empty: bool = False) -> None:
        present, value = self._get(key, required)
        if not present:
            return
        if not isinstance(value, str):
            self.problems.append(f"payload.{key} must be a string, got {_show(value)}")
        elif non_empty and not value:
            self.problems.append(f"payload.{key} must not be empty")

    def boolean(self, key: str, *, required: bool = True) -> None:
        present, value = self._get(key, required)
        if present and not isinstance(value, bool):
            self.problems.append(f"payload.{key} must be a boolean, got {_show(value)}")

    def choice(self, key: str, choices: Iterable[str], *, required: bool = True) -> None:
        present, value = self._get(key, required)
        if present and value not in choices:
            self.problems.append(
                f"payload.{key} must be one of {', '.join(sorted(choices))}, got {_show(value)}"
            )

    def obj(self, key: str, *, required: bool = True) -> None:
        present, value = self._get(key, required)
        if present and not isinstance(value, dict):
            self.problems.append(f"payload.{key} must be an object, got {_show(value)}")

    def string_list(self, key: str, *, required: bool = True) -> None:
        present, value = self._get(key, required)
        if present and (
            not isinstance(value, list) or not all(isinstance(item, str) for item in value)
        ):
            self.problems.append(f"payload.{key} must be an array of strings, got {_show(value)}")

    def positive_int(self, key: str, *, required: bool = True) -> None:
        present, value = self._get(key, required)
        if present and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            self.problems.append(f"payload.{key} must be an integer >= 1, got {_show(value)}")


# --- server -> client ---------------------------------------------------


def _handshake_ack(p: _Payload) -> None:
    p.string("sessionId", non_empty=True)
    p.string("serverVersion")
    p.string("protocolVersion")
    p.string_list("capabilities")
    # protocol.md §1: any value other than an integer >= 1 voids the whole ACK.
    p.positive_int("maxActiveTools", required=False)


def _tool_call(p: _Payload) -> None:
    p.string("callId", non_empty=True)
    p.string("name", non_empty=True)
    p.obj("args")


def _approval_request(p: _Payload) -> None:
    p.string("callId", non_empty=True)
    p.string("toolName", non_empty=True)
    p.choice("risk", RISKS)
    p.obj("args")
    p.string("message", non_empty=True)


def _agent_response(p: _Payload) -> None:
    p.string("chunk")
    p.boolean("done")


def _audio_stream(p: _Payload) -> None:
    p.string("data")
    p.string("mimeType", non_empty=True)


def _voice_state_event(p: _Payload) -> None:
    p.choice("event", VOICE_STATE_EVENTS)
    p.string("reason", required=False)


def _system_event(p: _Payload) -> None:
    p.choice("kind", SYSTEM_EVENT_KINDS)
    p.string("message", required=False)
    p.obj("data", required=False)


# --- client -> server ---------------------------------------------------
# Nulls are not rejected wholesale here: TOOL_RESULT.result may be null.


def _handshake_init(p: _Payload) -> None:
    p.string("apiKey", required=False)
    p.string("userAgent", required=False)
    p.string("viewport", required=False)
    p.string("sdkVersion", required=False)
    p.string("protocolVersion", non_empty=True)


def _tool_declarations(p: _Payload) -> None:
    tools = p.payload.get("activeTools")
    if not isinstance(tools, list):
        p.problems.append(f"payload.activeTools must be an array, got {_show(tools)}")
        return
    for index, tool in enumerate(tools):
        where = f"payload.activeTools[{index}]"
        if not isinstance(tool, dict):
            p.problems.append(f"{where} must be an object, got {_show(tool)}")
            continue
        if not isinstance(tool.get("name"), str) or not tool.get("name"):
            p.problems.append(f"{where}.name must be a non-empty string")
        if not isinstance(tool.get("description"), str):
            p.problems.append(f"{where}.description must be a string")
        if "parameters" in tool and not isinstance(tool["parameters"], dict):
            p.problems.append(f"{where}.parameters must be an object")
        if "risk" in tool and tool["risk"] not in RISKS:
            p.problems.append(f"{where}.risk must be one of none, low, high, critical")


def _context_update(p: _Payload) -> None:
    p.string("url")
    p.string("title")
    _tool_declarations(p)
    p.obj("context")


def _user_input(p: _Payload) -> None:
    p.choice("modality", USER_INPUT_MODALITIES)
    p.string("content")
    p.string("mimeType", required=p.payload.get("modality") == "audio")


def _tool_result(p: _Payload) -> None:
    p.string("callId", non_empty=True)
    p.choice("status", TOOL_RESULT_STATUSES)
    if p.payload.get("status") == "error":
        p.string("error")


def _approval_response(p: _Payload) -> None:
    p.string("callId", non_empty=True)
    p.boolean("approved")
    p.string("error", required=False)


def _voice_input_end(p: _Payload) -> None:
    p.choice("reason", VOICE_INPUT_END_REASONS)


def _voice_interrupt(p: _Payload) -> None:
    p.string("reason", required=False)


_PAYLOAD_CHECKS = {
    ("server", "HANDSHAKE_ACK"): _handshake_ack,
    ("server", "TOOL_CALL"): _tool_call,
    ("server", "APPROVAL_REQUEST"): _approval_request,
    ("server", "AGENT_RESPONSE"): _agent_response,
    ("server", "AUDIO_STREAM"): _audio_stream,
    ("server", "VOICE_STATE_EVENT"): _voice_state_event,
    ("server", "SYSTEM_EVENT"): _system_event,
    ("client", "HANDSHAKE_INIT"): _handshake_init,
    ("client", "CONTEXT_UPDATE"): _context_update,
    ("client", "USER_INPUT"): _user_input,
    ("client", "TOOL_RESULT"): _tool_result,
    ("client", "APPROVAL_REQUEST"): _approval_request,
    ("client", "APPROVAL_RESPONSE"): _approval_response,
    ("client", "AUDIO_STREAM"): _audio_stream,
    ("client", "VOICE_INPUT_END"): _voice_input_end,
    ("client", "VOICE_INTERRUPT"): _voice_interrupt,
}


def _is_number(value: Any) -> TypeGuard[int | float]:
    return (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(value)
    )


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean"}.get(
        type(value), type(value).__name__
    )


def _show(value: Any) -> str:
    if value is None or isinstance(value, (dict, list)):
        return _kind(value)
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
