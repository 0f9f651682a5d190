"""Waiting for the server's answer to HANDSHAKE_INIT: its HANDSHAKE_ACK, or
the SYSTEM_EVENT error it sends before it closes."""
from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from aitp_client.errors import AitpClosed, AitpRefused
from aitp_client.frames import system_event


async def await_ack(recv: Callable[[float], Awaitable[dict]], timeout: float, skipped: list[dict]) -> dict:
    """The HANDSHAKE_ACK frame received within ``timeout``; the frames before
    it are appended to ``skipped``.

    Raises AitpRefused when an error event came first (and the server closed,
    or said nothing more), AitpClosed when the server closed without one,
    TimeoutError when neither happened."""
    deadline = asyncio.get_running_loop().time() + timeout
    error: dict | None = None
    while True:
        remaining = deadline - asyncio.get_running_loop().time()
        try:
            frame = await recv(max(remaining, 0.0))
        except AitpClosed as exc:
            if error is None:
                raise
            raise AitpRefused(
                error.get("data", {}).get("code"),
                error.get("message", ""),
                exc.close_code,
                exc.close_reason,
            ) from None
        except TimeoutError:
            if error is None:
                raise TimeoutError(f"no HANDSHAKE_ACK within {timeout}s") from None
            raise AitpRefused(
                error.get("data", {}).get("code"), error.get("message", ""), None, None
            ) from None
        if frame["type"] == "HANDSHAKE_ACK" and error is None:
            return frame
        if system_event("error")(frame) and error is None:
            error = frame["payload"]
        skipped.append(frame)
