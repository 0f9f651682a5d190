"""The client's WebSocket, read as the browser client reads it: text frames
of JSON, each checked (when strict) against the protocol's JSON Schema as the
deployed client checks it, so a frame the browser would silently drop fails
loudly here instead."""
from __future__ import annotations

import asyncio
import json
import logging

from websockets.asyncio.client import ClientConnection
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.typing import Origin

from aitp_client.errors import AitpClosed, AitpError, AitpProtocolError, AitpUpgradeRefused
from aitp_client.validate import InvalidFrame, check_frame

# The client's one logger, under the name its users configure.
logger = logging.getLogger("aitp_client.client")


class FrameSocket:
    """One connection's socket: opens it, sends text, receives checked frames
    (every one kept in ``history``, oldest first), and says how it closed."""

    def __init__(self, *, strict: bool, max_size: int) -> None:
        self.strict = strict
        self.max_size = max_size
        self.ws: ClientConnection | None = None
        self.history: list[dict] = []

    @property
    def close_code(self) -> int | None:
        return self.ws.close_code if self.ws else None

    @property
    def close_reason(self) -> str | None:
        return self.ws.close_reason if self.ws else None

    async def open(self, url: str, *, origin: str | None, user_agent: str, timeout: float) -> None:
        if self.ws is not None:
            raise AitpError("already connected")
        try:
            self.ws = await ws_connect(
                url,
                origin=Origin(origin) if origin is not None else None,
                user_agent_header=user_agent,
                open_timeout=timeout,
                max_size=self.max_size,
                proxy=None,
            )
        except InvalidStatus as exc:
            raise AitpUpgradeRefused(exc.response.status_code) from None

    async def close(self, code: int, reason: str) -> None:
        if self.ws is not None:
            await self.ws.close(code, reason)

    def _require_ws(self) -> ClientConnection:
        if self.ws is None:
            raise AitpError("not connected")
        return self.ws

    async def send_raw(self, text: str | bytes) -> None:
        ws = self._require_ws()
        logger.debug("send %.200s", text)
        try:
            await ws.send(text)
        except ConnectionClosed as exc:
            raise _closed(exc) from None

    async def recv(self, timeout: float | None) -> dict:
        """The next frame, parsed and checked; ``None`` waits for ever."""
        ws = self._require_ws()
        try:
            async with asyncio.timeout(timeout):
                raw = await ws.recv()
        except TimeoutError:
            raise TimeoutError(f"no frame within {timeout}s") from None
        except ConnectionClosed as exc:
            raise _closed(exc) from None
        frame = self._parse(raw)
        self.history.append(frame)
        logger.debug("recv %s", frame.get("type"))
        return frame

    def _parse(self, raw: str | bytes) -> dict:
        if isinstance(raw, bytes):
            raise AitpProtocolError("binary frame (the client reads text frames only)", raw)
        try:
            frame = json.loads(raw)
        except ValueError:
            raise AitpProtocolError("frame is not json", raw) from None
        if self.strict:
            try:
                check_frame(frame, sender="server")
            except InvalidFrame as exc:
                raise AitpProtocolError(
                    f"the browser client would drop this frame: {exc}", raw, exc.problems
                ) from None
        elif not isinstance(frame, dict) or not isinstance(frame.get("payload"), dict):
            raise AitpProtocolError("frame is not an object with a payload", raw)
        return frame


def _closed(exc: ConnectionClosed) -> AitpClosed:
    if exc.rcvd is not None:
        return AitpClosed(exc.rcvd.code, exc.rcvd.reason)
    return AitpClosed(1006, "")
