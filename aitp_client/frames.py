"""AITP frames as the client builds and reads them: the envelope of a frame
it sends, and the predicates and texts a caller picks out of those received
(``aitp_client.client`` names them too)."""
from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterable


def new_message_id() -> str:
    return f"msg_{uuid.uuid4()}"


def envelope(frame_type: str, payload: dict, *, meta: dict | None = None) -> dict:
    frame = {
        "id": new_message_id(),
        "type": frame_type,
        "timestamp": int(time.time() * 1000),
        "payload": payload,
    }
    if meta is not None:
        frame["meta"] = meta
    return frame


def system_event(kind: str) -> Callable[[dict], bool]:
    """A ``recv_until`` predicate for one SYSTEM_EVENT kind."""

    def matches(frame: dict) -> bool:
        return frame.get("type") == "SYSTEM_EVENT" and frame["payload"].get("kind") == kind

    return matches


def turn_done(frame: dict) -> bool:
    """A ``recv_until`` predicate for the AGENT_RESPONSE that ends a turn."""
    return frame.get("type") == "AGENT_RESPONSE" and frame["payload"].get("done") is True


def final_text(frames: Iterable[dict]) -> str:
    """The complete answer: the chunk of the last ``done:true`` AGENT_RESPONSE."""
    finals = [frame for frame in frames if turn_done(frame)]
    if not finals:
        raise ValueError("no AGENT_RESPONSE with done:true among the frames")
    return finals[-1]["payload"]["chunk"]


def streamed_text(frames: Iterable[dict]) -> str:
    """The text of the ``done:false`` deltas, joined as a delta reader would."""
    return "".join(
        frame["payload"]["chunk"]
        for frame in frames
        if frame.get("type") == "AGENT_RESPONSE" and frame["payload"].get("done") is False
    )


def describe(frame: dict) -> str:
    """A frame's type, and its kind for a SYSTEM_EVENT: for error messages."""
    if frame.get("type") == "SYSTEM_EVENT":
        return f"SYSTEM_EVENT:{frame['payload'].get('kind')}"
    return str(frame.get("type"))
