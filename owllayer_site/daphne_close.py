"""Close frames as the AITP wire contract needs them, under daphne.

The deployed client reads the close code to decide whether to reconnect
(wire-compat.md section 2): 1008 means "permanent, show the reason". daphne
passes the ASGI close code to autobahn's ``sendClose()``, which refuses any
code but 1000 and 3000-4999 (the close then turns into a 1011), and daphne
drops the ASGI ``reason``. This sends the close frame with the code and the
reason the application asked for, for every code RFC 6455 lets an endpoint
send.
"""
from __future__ import annotations

import logging

logger = logging.getLogger(__name__)

# RFC 6455 section 7.4: 1004, 1005, 1006 and 1015 must never be sent.
SENDABLE_CODES = frozenset({1000, 1001, 1002, 1003, 1007, 1008, 1009, 1010, 1011, 1012, 1013, 1014})
MAX_REASON_BYTES = 123


def sendable(code: int) -> bool:
    return code in SENDABLE_CODES or 3000 <= code <= 4999


def install() -> None:
    try:
        from daphne.ws_protocol import WebSocketProtocol
    except ImportError:  # served by another ASGI server
        return
    if getattr(WebSocketProtocol, "_aitp_close_installed", False):
        return
    original = WebSocketProtocol.handle_reply

    def handle_reply(self, message):
        if message.get("type") == "websocket.close" and self.state != self.STATE_CONNECTING:
            code = message.get("code")
            code = 1000 if code is None else int(code)
            if not sendable(code):
                logger.error("refusing to send close code %s; sending 1011", code)
                code = 1011
            reason = message.get("reason") or ""
            encoded = reason.encode("utf-8")[:MAX_REASON_BYTES].decode("utf-8", "ignore").encode()
            self.sendCloseFrame(code=code, reasonUtf8=encoded or None, isReply=False)
            return
        return original(self, message)

    WebSocketProtocol.handle_reply = handle_reply
    WebSocketProtocol._aitp_close_installed = True
