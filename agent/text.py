"""The turn's text on its way out, and the conversation window sent to the model.

``TextStreamer`` coalesces the model's text deltas into AGENT_RESPONSE frames;
``bounded_history`` cuts the conversation to its last messages without
separating a ``tool_use`` from its ``tool_result``. Neither touches the
network or the database.
"""
from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable

from aitp import protocol as p


class TextStreamer:
    """Coalesces text deltas into at most one AGENT_RESPONSE frame per interval.

    The first delta goes out at once (time to first token matters); later ones
    wait for the interval. ``close()`` flushes what is left.
    """

    def __init__(self, send: Callable[[p.Message], Awaitable[None]], interval: float) -> None:
        self._send = send
        self._interval = interval
        self._buffer: list[str] = []
        self._last_sent = float("-inf")
        self._timer: asyncio.Task | None = None
        self._sending = False
        # Characters of text handed to the page so far (what a cut turn stores).
        self.sent_chars = 0
        # time.monotonic() of the first text (the turn's time to first token).
        self.first_text_at: float | None = None

    def push(self, text: str) -> None:
        if not text:
            return
        if self.first_text_at is None:
            self.first_text_at = time.monotonic()
        self._buffer.append(text)
        if self._timer is None or self._timer.done():
            self._timer = asyncio.create_task(self._flush_later())

    async def _flush_later(self) -> None:
        loop = asyncio.get_running_loop()
        delay = self._last_sent + self._interval - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        await self._flush()

    async def _flush(self) -> None:
        if not self._buffer:
            return
        text = "".join(self._buffer)
        self._buffer.clear()
        self._last_sent = asyncio.get_running_loop().time()
        self.sent_chars += len(text)
        self._sending = True
        try:
            await self._send(p.agent_response(text, False))
        finally:
            self._sending = False

    async def close(self) -> None:
        timer, self._timer = self._timer, None
        if timer is not None and not timer.done():
            if self._sending:
                await timer  # a frame is on its way: let it finish, in order
            else:
                timer.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await timer
        await self._flush()

    async def discard(self) -> None:
        timer, self._timer = self._timer, None
        if timer is not None:
            timer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await timer
        self._buffer.clear()


def bounded_history(history: list[dict], limit: int) -> list[dict]:
    """The last ``limit`` messages, starting at a user message that carries no
    tool_result, so a tool_use is never separated from its tool_result."""
    if len(history) <= limit:
        return history
    start = len(history) - limit
    while start < len(history):
        message = history[start]
        if message["role"] == "user" and not any(
            block.get("type") == "tool_result" for block in message["content"]
        ):
            return history[start:]
        start += 1
    # No clean cut inside the window: fall back to the last user text message.
    for index in range(len(history) - 1, -1, -1):
        message = history[index]
        if message["role"] == "user" and not any(
            block.get("type") == "tool_result" for block in message["content"]
        ):
            return history[index:]
    return history
