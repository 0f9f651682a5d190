"""The baseline: a bare Channels consumer doing the least an AITP server must.

It answers a HANDSHAKE_INIT-shaped frame with a fixed HANDSHAKE_ACK-shaped
frame and echoes every other frame unchanged. Whatever the product spends
above this (key lookup, validation, the session row, the agent) is what the
benchmark ratios show; daphne, Channels and the socket cost the same on both
sides.

Comparable bytes: the product answers one client frame with several frames
(a TOOL_CALL, streamed text, a final AGENT_RESPONSE), the echo with one copy
of what it got. So the benchmark's client may put the sizes of the product's
answer in the frame it sends (``payload.benchReply``, a list of byte counts,
recorded from the product in the same run); the baseline then answers with
that many frames of exactly those sizes, the last one carrying the sent id
(the frame the client waits for). Both sides then move the same bytes.
"""
from __future__ import annotations

import json
import time
import uuid

from channels.generic.websocket import AsyncWebsocketConsumer

SESSION_ID = "ses_baseline"
REPLY_FIELD = "benchReply"
# Bounds on what a client may ask for: the baseline is a bench tool, not an amplifier.
MAX_REPLY_FRAMES = 500
MAX_REPLY_BYTES = 1 << 20

# Built once: the baseline must not pay for building frames the product
# builds per connection. The shape passes the deployed client's schema, so
# the benchmark's client can shake hands with it exactly as with the product.
ACK_TEXT = json.dumps(
    {
        "id": f"msg_{uuid.uuid4()}",
        "type": "HANDSHAKE_ACK",
        "timestamp": int(time.time() * 1000),
        "payload": {
            "sessionId": SESSION_ID,
            "serverVersion": "0.4.0",
            "protocolVersion": "1.0.0",
            "capabilities": ["text", "tools"],
            "maxActiveTools": 30,
        },
    }
)


def _parse(text: str) -> dict | None:
    try:
        frame = json.loads(text)
    except ValueError:
        return None
    return frame if isinstance(frame, dict) else None


def padded_frame(frame_id: str, size: int) -> str:
    """A frame of exactly ``size`` bytes (UTF-8) when ``size`` allows it,
    else the smallest such frame. ASCII only, so characters are bytes."""
    head = '{"id":' + json.dumps(frame_id) + ',"type":"BENCH_ECHO","payload":{"pad":"'
    tail = '"}}'
    return head + "x" * max(0, size - len(head.encode()) - len(tail)) + tail


def requested_sizes(frame: dict) -> list[int] | None:
    """The reply sizes a client frame asks for, or None (plain echo)."""
    payload = frame.get("payload")
    sizes = payload.get(REPLY_FIELD) if isinstance(payload, dict) else None
    if not isinstance(sizes, list) or not 0 < len(sizes) <= MAX_REPLY_FRAMES:
        return None
    if not all(isinstance(size, int) and 0 < size <= MAX_REPLY_BYTES for size in sizes):
        return None
    return sizes


def reply_frames(text: str) -> list[str]:
    """What the baseline sends back for one text frame. Pure."""
    frame = _parse(text)
    if frame is None:
        return [text]
    if frame.get("type") == "HANDSHAKE_INIT":
        return [ACK_TEXT]
    sizes = requested_sizes(frame)
    if sizes is None:
        return [text]
    frame_id = str(frame.get("id", ""))
    last = len(sizes) - 1
    return [padded_frame(frame_id if number == last else f"{frame_id}.{number}", size)
            for number, size in enumerate(sizes)]


class BaselineConsumer(AsyncWebsocketConsumer):
    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        if text_data is None:
            await self.send(bytes_data=bytes_data)
            return
        for reply in reply_frames(text_data):
            await self.send(text_data=reply)
