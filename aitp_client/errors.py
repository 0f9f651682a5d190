"""The errors the client raises (``aitp_client.client`` names them too)."""
from __future__ import annotations

from typing import Any


class AitpError(Exception):
    """Base of every error this client raises."""


class AitpUpgradeRefused(AitpError):
    """The server refused the WebSocket upgrade itself (the browser sees 1006)."""

    def __init__(self, status: int) -> None:
        super().__init__(f"websocket upgrade refused with http {status}")
        self.status = status


class AitpClosed(AitpError):
    """The connection is closed; the close code and reason say how."""

    def __init__(self, close_code: int | None, close_reason: str | None) -> None:
        super().__init__(f"connection closed: {close_code} {close_reason or ''}".rstrip())
        self.close_code = close_code
        self.close_reason = close_reason


class AitpRefused(AitpClosed):
    """The server sent SYSTEM_EVENT error and closed instead of HANDSHAKE_ACK."""

    def __init__(
        self, code: str | None, message: str, close_code: int | None, close_reason: str | None
    ) -> None:
        super().__init__(close_code, close_reason)
        self.args = (f"refused: {message} (code {code}, close {close_code} {close_reason!r})",)
        self.code = code
        self.message = message


class AitpProtocolError(AitpError):
    """A received frame is not JSON, or the browser client would drop it."""

    def __init__(self, message: str, raw: Any, problems: list[str] | None = None) -> None:
        super().__init__(message)
        self.raw = raw
        self.problems = problems or [message]
