"""A small asyncio AITP client that speaks to a server as the browser SDK does.

It opens ``<url>?apiKey=<key>``, sends HANDSHAKE_INIT, and checks every frame
it receives as strictly as the deployed client (``validate.py``, against the
protocol's JSON Schema), so a frame the browser would silently drop fails
loudly here instead.

Typical use::

    async with AitpClient("ws://127.0.0.1:8000/owllayer", api_key=key) as client:
        await client.context_update("/", "Home", tools=[], context={})
        await client.recv_until(system_event("tools_effective"))
        frames = await client.say("hello")
        print(final_text(frames))

``AitpClient`` says what a page says and when; what it holds does the rest:
the socket that receives and checks frames (``transport.FrameSocket``), the
wait for the server's HANDSHAKE_ACK (``handshake.await_ack``) and the page's
declared tools with the answers to their calls (``page_tools.PageTools``).
Its errors are in ``errors`` and the frame helpers in ``frames``; the package
names them all.
"""
from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterable
from types import EllipsisType
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

from websockets.asyncio.client import ClientConnection

from aitp_client.errors import (
    AitpClosed,
)
from aitp_client.frames import (
    describe,
    envelope,
    turn_done,
)
from aitp_client.handshake import await_ack
from aitp_client.page_tools import PageTools, ToolHandler, maybe_await
from aitp_client.transport import FrameSocket

__all__ = [
    "DENIED_BY_USER",
    "FRAME_TIMEOUT",
    "HANDSHAKE_TIMEOUT",
    "PROTOCOL_VERSION",
    "SDK_VERSION",
    "AitpClient",
]

PROTOCOL_VERSION = "1.0.0"
SDK_VERSION = "0.4.0"
DEFAULT_VIEWPORT = "1440x900"
DEFAULT_USER_AGENT = f"owllayer-aitp-client/{SDK_VERSION}"
# The browser client gives up on a handshake after 5,000 ms.
HANDSHAKE_TIMEOUT = 5.0
# How long recv(), recv_until() and wait_closed() wait when not told.
# Both are read when a call starts, so a test harness on a loaded machine
# can lengthen them for every call at once.
FRAME_TIMEOUT = 5.0
DENIED_BY_USER = "Action denied by user"

FrameMatch = str | Callable[[dict], bool]
ApprovalHandler = Callable[[dict], Any]


class AitpClient:
    def __init__(
        self,
        url: str,
        *,
        api_key: str | None = None,
        origin: str | None = None,
        protocol_version: str = PROTOCOL_VERSION,
        sdk_version: str = SDK_VERSION,
        viewport: str = DEFAULT_VIEWPORT,
        user_agent: str = DEFAULT_USER_AGENT,
        strict: bool = True,
        max_size: int = 4 * 1024 * 1024,
        resume: dict | None = None,
    ) -> None:
        """``resume``: sent as HANDSHAKE_INIT's ``resume`` (``{}`` to be given
        a resume token, ``{"token": ..., "lastSeq": ...}`` to continue a
        session: ``next_resume()`` of its last client); None: not sent."""
        self.url = url
        self.api_key = api_key
        self.origin = origin
        self.protocol_version = protocol_version
        self.sdk_version = sdk_version
        self.viewport = viewport
        self.user_agent = user_agent
        self.resume = resume
        # The socket, and every frame received on it (``history``).
        self.socket = FrameSocket(strict=strict, max_size=max_size)
        self.ack: dict | None = None
        # Frames recv_until() and the handshake skipped over, oldest first.
        self.received: list[dict] = []
        # The tools of the last CONTEXT_UPDATE, and the answers to their calls.
        self.page_tools = PageTools()

    # --- connection -------------------------------------------------------

    @property
    def session_id(self) -> str | None:
        return self.ack["sessionId"] if self.ack else None

    @property
    def ws(self) -> ClientConnection | None:
        return self.socket.ws

    @property
    def last_seq(self) -> int | None:
        """The ``meta.seq`` of the last numbered frame received (a client
        that offered ``resume`` gets numbered frames), None before any."""
        for frame in reversed(self.history):
            seq = (frame.get("meta") or {}).get("seq")
            if isinstance(seq, int):
                return seq
        return None

    def next_resume(self) -> dict:
        """The ``resume`` to offer on the next socket: the token this one's
        HANDSHAKE_ACK gave and the last frame received."""
        offer: dict[str, Any] = {"token": (self.ack or {}).get("resumeToken")}
        if self.last_seq is not None:
            offer["lastSeq"] = self.last_seq
        return offer

    @property
    def history(self) -> list[dict]:
        """Every frame received, oldest first."""
        return self.socket.history

    @property
    def strict(self) -> bool:
        return self.socket.strict

    @strict.setter
    def strict(self, strict: bool) -> None:
        self.socket.strict = strict

    @property
    def max_size(self) -> int:
        return self.socket.max_size

    @property
    def tools(self) -> dict[str, dict]:
        """The tools of the last CONTEXT_UPDATE, by name."""
        return self.page_tools.declared

    @property
    def close_code(self) -> int | None:
        """The close code the server sent (1006 when none), None while open."""
        return self.socket.close_code

    @property
    def close_reason(self) -> str | None:
        return self.socket.close_reason

    def connect_url(self, *, key_in_query: bool = True) -> str:
        if not (key_in_query and self.api_key is not None):
            return self.url
        parts = urlsplit(self.url)
        key_param = f"apiKey={quote(self.api_key, safe='')}"
        query = f"{parts.query}&{key_param}" if parts.query else key_param
        return urlunsplit(parts._replace(query=query))

    def handshake_payload(self, *, key_in_handshake: bool = True) -> dict:
        payload: dict[str, Any] = {
            "userAgent": self.user_agent,
            "viewport": self.viewport,
            "sdkVersion": self.sdk_version,
            "protocolVersion": self.protocol_version,
        }
        if key_in_handshake and self.api_key is not None:
            payload = {"apiKey": self.api_key, **payload}
        if self.resume is not None:
            payload["resume"] = self.resume
        return payload

    async def connect(
        self,
        send_handshake: bool = True,
        key_in_query: bool = True,
        key_in_handshake: bool = True,
        *,
        timeout: float | None = None,
    ) -> dict:
        """Open the socket and shake hands; return the HANDSHAKE_ACK payload.

        With ``send_handshake=False`` only the socket is opened and ``{}`` is
        returned, for tests that send their own first frame.
        Raises AitpRefused when the server answers with an error event and
        closes, AitpClosed when it closes without one, TimeoutError when
        neither happens within ``timeout``.
        """
        if timeout is None:
            timeout = HANDSHAKE_TIMEOUT
        await self.socket.open(
            self.connect_url(key_in_query=key_in_query),
            origin=self.origin,
            user_agent=self.user_agent,
            timeout=timeout,
        )
        if not send_handshake:
            return {}
        await self.send("HANDSHAKE_INIT", self.handshake_payload(key_in_handshake=key_in_handshake))
        ack = await await_ack(self.recv, timeout, self.received)
        self.ack = ack["payload"]
        return self.ack

    async def close(self, code: int = 1000, reason: str = "") -> None:
        await self.socket.close(code, reason)

    async def wait_closed(self, timeout: float | None = None) -> tuple[int | None, str | None]:
        """Read (into ``received``) until the server closes; return code and reason."""
        if timeout is None:
            timeout = FRAME_TIMEOUT
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            remaining = deadline - asyncio.get_running_loop().time()
            try:
                self.received.append(await self.recv(timeout=max(remaining, 0.0)))
            except AitpClosed as exc:
                return exc.close_code, exc.close_reason

    async def __aenter__(self) -> AitpClient:
        if self.ws is None:
            await self.connect()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # --- frames -----------------------------------------------------------

    async def send(self, frame_type: str, payload: dict, *, meta: dict | None = None) -> dict:
        frame = envelope(frame_type, payload, meta=meta)
        await self.send_raw(json.dumps(frame))
        return frame

    async def send_raw(self, text: str | bytes) -> None:
        await self.socket.send_raw(text)

    async def recv(self, timeout: float | EllipsisType | None = ...) -> dict:
        """The next frame, parsed (and checked when ``strict``); ``None`` waits
        for ever, no value waits FRAME_TIMEOUT."""
        if isinstance(timeout, EllipsisType):
            timeout = FRAME_TIMEOUT
        return await self.socket.recv(timeout)

    async def recv_until(self, match: FrameMatch, timeout: float | None = None) -> dict:
        """The first frame matching a type name or a predicate (within
        ``timeout``, FRAME_TIMEOUT when not given).

        Frames skipped on the way are appended to ``received``.
        """
        if timeout is None:
            timeout = FRAME_TIMEOUT
        predicate = (lambda frame: frame.get("type") == match) if isinstance(match, str) else match
        deadline = asyncio.get_running_loop().time() + timeout
        skipped: list[str] = []
        while True:
            remaining = deadline - asyncio.get_running_loop().time()
            try:
                frame = await self.recv(timeout=max(remaining, 0.0))
            except TimeoutError:
                seen = ", ".join(skipped) or "nothing"
                raise TimeoutError(f"no matching frame within {timeout}s (saw {seen})") from None
            if predicate(frame):
                return frame
            self.received.append(frame)
            skipped.append(describe(frame))

    # --- AITP messages ----------------------------------------------------

    async def context_update(
        self,
        url: str = "/",
        title: str = "",
        tools: Iterable[dict] = (),
        context: dict | None = None,
    ) -> dict:
        """Send a full snapshot of the page (protocol.md §4: never a diff)."""
        tools = list(tools)
        self.page_tools.declare(tools)
        return await self.send(
            "CONTEXT_UPDATE",
            {
                "url": url,
                "title": title,
                "activeTools": tools,
                "context": context if context is not None else {},
            },
        )

    async def user_input(self, text: str) -> dict:
        return await self.send("USER_INPUT", {"modality": "text", "content": text})

    async def tool_result(
        self, call_id: str, *, result: Any = None, error: str | None = None
    ) -> dict:
        """Answer a TOOL_CALL as the browser does: success with result, or error."""
        if error is None:
            payload = {"callId": call_id, "status": "success", "result": result}
        else:
            payload = {"callId": call_id, "status": "error", "result": None, "error": error}
        return await self.send("TOOL_RESULT", payload)

    async def approval_response(
        self, call_id: str, approved: bool, *, result: Any = None, error: str | None = None
    ) -> dict:
        payload: dict[str, Any] = {"callId": call_id, "approved": approved}
        if not approved:
            payload["error"] = error or DENIED_BY_USER
        elif error is not None:
            payload["error"] = error
        elif result is not None:
            payload["result"] = result
        return await self.send("APPROVAL_RESPONSE", payload)

    async def say(
        self,
        text: str,
        *,
        timeout: float = 30.0,
        on_tool_call: ToolHandler | None = None,
        on_approval: ApprovalHandler | None = None,
        on_frame: Callable[[dict], Any] | None = None,
    ) -> list[dict]:
        """Send a text message; return every frame up to the ``done:true`` response.

        ``on_tool_call(name, args)`` answers TOOL_CALLs: its return value is
        the result, an exception it raises becomes the error. Without it, tool
        calls are left for the server to time out. ``on_approval(payload)``
        decides server-side APPROVAL_REQUESTs (truthy approves).
        ``on_frame(frame)`` sees each frame as it arrives.
        """
        await self.user_input(text)
        frames: list[dict] = []
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            remaining = deadline - asyncio.get_running_loop().time()
            try:
                frame = await self.recv(timeout=max(remaining, 0.0))
            except TimeoutError:
                seen = ", ".join(describe(frame) for frame in frames) or "nothing"
                raise TimeoutError(f"turn not done within {timeout}s (saw {seen})") from None
            frames.append(frame)
            if on_frame is not None:
                await maybe_await(on_frame(frame))
            if frame["type"] == "TOOL_CALL" and on_tool_call is not None:
                await self.page_tools.answer(frame["payload"], on_tool_call, self.tool_result)
            elif frame["type"] == "APPROVAL_REQUEST" and on_approval is not None:
                approved = bool(await maybe_await(on_approval(frame["payload"])))
                await self.approval_response(frame["payload"]["callId"], approved)
            elif turn_done(frame):
                return frames
