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
"""
from __future__ import annotations

import asyncio
import inspect
import json
import logging
import time
import uuid
from collections.abc import Callable, Iterable
from types import EllipsisType
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

from websockets.asyncio.client import ClientConnection
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.typing import Origin

from aitp.tools import ToolError, aitp_to_json_schema, validate_arguments
from aitp_client.validate import InvalidFrame, check_frame

logger = logging.getLogger(__name__)

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
ToolHandler = Callable[[str, dict], Any]
ApprovalHandler = Callable[[dict], Any]


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
    ) -> None:
        self.url = url
        self.api_key = api_key
        self.origin = origin
        self.protocol_version = protocol_version
        self.sdk_version = sdk_version
        self.viewport = viewport
        self.user_agent = user_agent
        self.strict = strict
        self.max_size = max_size
        self.ws: ClientConnection | None = None
        self.ack: dict | None = None
        # Frames recv_until() and the handshake skipped over, oldest first.
        self.received: list[dict] = []
        # Every frame received, oldest first.
        self.history: list[dict] = []
        # The tools of the last CONTEXT_UPDATE, by name: a TOOL_CALL for one
        # of them is answered only when its arguments fit its parameters.
        self.tools: dict[str, dict] = {}

    # --- connection -------------------------------------------------------

    @property
    def session_id(self) -> str | None:
        return self.ack["sessionId"] if self.ack else None

    @property
    def close_code(self) -> int | None:
        """The close code the server sent (1006 when none), None while open."""
        return self.ws.close_code if self.ws else None

    @property
    def close_reason(self) -> str | None:
        return self.ws.close_reason if self.ws else None

    def connect_url(self, *, key_in_query: bool = True) -> str:
        if not (key_in_query and self.api_key is not None):
            return self.url
        parts = urlsplit(self.url)
        key_param = f"apiKey={quote(self.api_key, safe='')}"
        query = f"{parts.query}&{key_param}" if parts.query else key_param
        return urlunsplit(parts._replace(query=query))

    def handshake_payload(self, *, key_in_handshake: bool = True) -> dict:
        payload = {
            "userAgent": self.user_agent,
            "viewport": self.viewport,
            "sdkVersion": self.sdk_version,
            "protocolVersion": self.protocol_version,
        }
        if key_in_handshake and self.api_key is not None:
            payload = {"apiKey": self.api_key, **payload}
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
        if self.ws is not None:
            raise AitpError("already connected")
        if timeout is None:
            timeout = HANDSHAKE_TIMEOUT
        try:
            self.ws = await ws_connect(
                self.connect_url(key_in_query=key_in_query),
                origin=Origin(self.origin) if self.origin is not None else None,
                user_agent_header=self.user_agent,
                open_timeout=timeout,
                max_size=self.max_size,
                proxy=None,
            )
        except InvalidStatus as exc:
            raise AitpUpgradeRefused(exc.response.status_code) from None
        if not send_handshake:
            return {}
        await self.send("HANDSHAKE_INIT", self.handshake_payload(key_in_handshake=key_in_handshake))
        return await self._await_ack(timeout)

    async def _await_ack(self, timeout: float) -> dict:
        deadline = asyncio.get_running_loop().time() + timeout
        error: dict | None = None
        while True:
            remaining = deadline - asyncio.get_running_loop().time()
            try:
                frame = await self.recv(timeout=max(remaining, 0.0))
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
                self.ack = frame["payload"]
                return self.ack
            if system_event("error")(frame) and error is None:
                error = frame["payload"]
            self.received.append(frame)

    async def close(self, code: int = 1000, reason: str = "") -> None:
        if self.ws is not None:
            await self.ws.close(code, reason)

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

    def _require_ws(self) -> ClientConnection:
        if self.ws is None:
            raise AitpError("not connected")
        return self.ws

    async def send(self, frame_type: str, payload: dict, *, meta: dict | None = None) -> dict:
        frame = envelope(frame_type, payload, meta=meta)
        await self.send_raw(json.dumps(frame))
        return frame

    async def send_raw(self, text: str | bytes) -> None:
        ws = self._require_ws()
        logger.debug("send %.200s", text)
        try:
            await ws.send(text)
        except ConnectionClosed as exc:
            raise self._closed(exc) from None

    async def recv(self, timeout: float | EllipsisType | None = ...) -> dict:
        """The next frame, parsed (and checked when ``strict``); ``None`` waits
        for ever, no value waits FRAME_TIMEOUT."""
        if isinstance(timeout, EllipsisType):
            timeout = FRAME_TIMEOUT
        ws = self._require_ws()
        try:
            async with asyncio.timeout(timeout):
                raw = await ws.recv()
        except TimeoutError:
            raise TimeoutError(f"no frame within {timeout}s") from None
        except ConnectionClosed as exc:
            raise self._closed(exc) from None
        frame = self._parse(raw)
        self.history.append(frame)
        logger.debug("recv %s", frame.get("type"))
        return frame

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
            skipped.append(_describe(frame))

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

    def _closed(self, exc: ConnectionClosed) -> AitpClosed:
        if exc.rcvd is not None:
            return AitpClosed(exc.rcvd.code, exc.rcvd.reason)
        return AitpClosed(1006, "")

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
        self.tools = {tool["name"]: tool for tool in tools if isinstance(tool, dict) and "name" in tool}
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
                seen = ", ".join(_describe(frame) for frame in frames) or "nothing"
                raise TimeoutError(f"turn not done within {timeout}s (saw {seen})") from None
            frames.append(frame)
            if on_frame is not None:
                await _maybe_await(on_frame(frame))
            if frame["type"] == "TOOL_CALL" and on_tool_call is not None:
                await self._answer_tool_call(frame["payload"], on_tool_call)
            elif frame["type"] == "APPROVAL_REQUEST" and on_approval is not None:
                approved = bool(await _maybe_await(on_approval(frame["payload"])))
                await self.approval_response(frame["payload"]["callId"], approved)
            elif turn_done(frame):
                return frames

    async def _answer_tool_call(self, payload: dict, handler: ToolHandler) -> None:
        problems = arguments_problems(self.tools.get(payload["name"]), payload["args"])
        if problems:
            # As the browser does: the handler never sees arguments that do
            # not fit the tool's declared parameters.
            await self.tool_result(payload["callId"], error="invalid arguments: " + "; ".join(problems))
            return
        try:
            result = await _maybe_await(handler(payload["name"], payload["args"]))
        except Exception as exc:  # the handler's failure is the tool's error, as in the browser
            await self.tool_result(payload["callId"], error=str(exc) or type(exc).__name__)
        else:
            await self.tool_result(payload["callId"], result=result)


def arguments_problems(tool: dict | None, args: Any) -> list[str]:
    """Why ``args`` do not fit a declared tool's parameters (empty: they do),
    checked by the server's own function (``aitp.tools.validate_arguments``).
    A tool this client never declared, or declared with parameters the
    server refuses, is left to the handler."""
    if tool is None:
        return []
    try:
        schema = aitp_to_json_schema(tool.get("parameters"))
    except ToolError:
        return []
    return validate_arguments(schema, args)


async def _maybe_await(value: Any) -> Any:
    if inspect.isawaitable(value):
        return await value
    return value


def _describe(frame: dict) -> str:
    if frame.get("type") == "SYSTEM_EVENT":
        return f"SYSTEM_EVENT:{frame['payload'].get('kind')}"
    return str(frame.get("type"))
