"""The baseline: a bare Channels consumer doing the least an AITP server must.

It answers a HANDSHAKE_INIT-shaped frame with a fixed HANDSHAKE_ACK-shaped
frame and echoes every other frame unchanged. Whatever the product spends
above this (key lookup, validation, the session row, the agent) is what the
benchmark ratios show; daphne, Channels and the socket cost the same on both
sides.
"""
from __future__ import annotations

import json
import time
import uuid

from channels.generic.websocket import AsyncWebsocketConsumer

SESSION_ID = "ses_baseline"

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


def is_handshake_init(text: str) -> bool:
    try:
        frame = json.loads(text)
    except ValueError:
        return False
    return isinstance(frame, dict) and frame.get("type") == "HANDSHAKE_INIT"


class BaselineConsumer(AsyncWebsocketConsumer):
    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        if text_data is None:
            await self.send(bytes_data=bytes_data)
        elif is_handshake_init(text_data):
            await self.send(text_data=ACK_TEXT)
        else:
            await self.send(text_data=text_data)
