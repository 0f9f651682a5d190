"""A fake Anthropic Messages API server that speaks the real SSE wire format.

It is a real HTTP server on 127.0.0.1, so the real SDK (and a separate daphne
process pointed at it through ANTHROPIC_BASE_URL) talk to it exactly as they
would to the API. It runs in a background thread, so sync and async tests can
both use it:

    with FakeAnthropicServer() as server:
        server.enqueue(text_response("Hello there"))
        ...  # ANTHROPIC_BASE_URL = server.base_url
        assert server.requests[0]["messages"][-1]["role"] == "user"

Queued responses are consumed one per request; with the queue empty,
server.responder(body) answers (default_responder unless replaced).
``GET /v1/models`` answers the Models API's list (401 for a key other than
``api_key``, when set), as the server's start-up check asks; those are
counted in ``model_lists``, not recorded with the Messages requests.

As a script it serves default_responder until killed:

    python -m tests.support.fake_anthropic --port 0 [--event-delay 0.02]

and prints "fake anthropic listening on http://127.0.0.1:PORT" once ready.
"""
from __future__ import annotations

import argparse
import itertools
import json
import logging
import re
import signal
import socket
import ssl
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

logger = logging.getLogger(__name__)

DEFAULT_MODEL = "claude-sonnet-5-5"
_ids = itertools.count(1)
_ids_lock = threading.Lock()


def _next_id(prefix: str) -> str:
    with _ids_lock:
        return f"{prefix}{next(_ids):024x}"


# --- Response objects -------------------------------------------------------


@dataclass
class TextBlock:
    chunks: list[str]


@dataclass
class JsonPiece:
    text: str
    # Where to cut the HTTP chunk inside the first (multi-byte) character of
    # this piece: a byte offset into that character, or None for no cut.
    cut: int | None = None


@dataclass
class ToolUseBlock:
    id: str
    name: str
    input: dict
    pieces: list[JsonPiece]


@dataclass
class StreamedMessage:
    """A 200 answer: streamed as SSE for stream requests, one JSON message otherwise."""

    blocks: list[TextBlock | ToolUseBlock]
    stop_reason: str = "end_turn"
    usage: dict = field(default_factory=dict)
    model: str | None = None  # None: echo the request's model
    first_event_delay: float = 0.0  # seconds after the headers, before message_start
    event_delay: float = 0.0  # seconds before each later event
    # Stop after this many SSE events: abruptly (socket closed mid-body) or,
    # with abrupt=False, by ending the HTTP body cleanly.
    break_after_events: int | None = None
    abrupt: bool = True
    # Send an SSE error event after this many events, then end the body.
    error_after_events: int | None = None
    error: dict | None = None
    # Wait for `hold` to be set before sending event number hold_after_events:
    # the test decides when the rest of the stream comes.
    hold: threading.Event | None = None
    hold_after_events: int | None = None


@dataclass
class ErrorReply:
    status: int
    error_type: str
    message: str
    headers: dict[str, str] = field(default_factory=dict)


Response = StreamedMessage | ErrorReply
Responder = Callable[[dict], Response]

_STATUS_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    529: "overloaded_error",
}


def _usage(usage: dict | None) -> dict:
    base = {
        "input_tokens": 10,
        "output_tokens": 5,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
    }
    base.update(usage or {})
    return base


def _split_even(text: str, chunks: int) -> list[str]:
    if not text:
        return []
    count = max(1, min(chunks, len(text)))
    size, extra = divmod(len(text), count)
    pieces, start = [], 0
    for index in range(count):
        end = start + size + (1 if index < extra else 0)
        pieces.append(text[start:end])
        start = end
    return pieces


def split_json_pieces(text: str, byte_offsets: list[int]) -> list[JsonPiece]:
    """Split text into pieces at byte offsets of its UTF-8 form.

    A delta carries whole characters, as on the real wire, so an offset inside
    a multi-byte character starts the next piece at that character and asks
    for the HTTP chunk to be cut inside it: the client then receives the
    character's bytes in two reads.
    """
    raw = text.encode("utf-8")
    starts = {0, len(raw)}
    cuts: dict[int, int] = {}
    for offset in byte_offsets:
        if not 0 < offset < len(raw):
            raise ValueError(f"split offset {offset} outside 1..{len(raw) - 1}")
        start = offset
        while raw[start] & 0xC0 == 0x80:  # a UTF-8 continuation byte
            start -= 1
        starts.add(start)
        if start != offset:
            cuts.setdefault(start, offset - start)
    bounds = sorted(starts)
    return [
        JsonPiece(raw[a:b].decode("utf-8"), cuts.get(a)) for a, b in itertools.pairwise(bounds) if b > a
    ]


def text_response(
    text: str,
    *,
    chunks: int = 3,
    usage: dict | None = None,
    stop_reason: str = "end_turn",
    first_event_delay: float = 0.0,
    event_delay: float = 0.0,
) -> StreamedMessage:
    """One text block streamed in `chunks` text_delta pieces."""
    return StreamedMessage(
        blocks=[TextBlock(_split_even(text, chunks))],
        stop_reason=stop_reason,
        usage=_usage(usage),
        first_event_delay=first_event_delay,
        event_delay=event_delay,
    )


def tool_use_response(
    calls: list[tuple],
    *,
    text: str | None = None,
    split_json_at: list[int] | None = None,
    ensure_ascii: bool = False,
    usage: dict | None = None,
    first_event_delay: float = 0.0,
    event_delay: float = 0.0,
) -> StreamedMessage:
    """Optional text, then one tool_use block per call: (name, input) or (id, name, input).

    Each input is streamed as input_json_delta pieces: whole, or split at the
    byte offsets in split_json_at (applied to every call's JSON text).
    ensure_ascii=True writes non-ASCII as \\uXXXX escapes, so offsets can fall
    inside an escape.
    """
    blocks: list[TextBlock | ToolUseBlock] = []
    if text is not None:
        blocks.append(TextBlock(_split_even(text, 2)))
    for call in calls:
        if len(call) == 3:
            tool_id, name, arguments = call
        else:
            (name, arguments), tool_id = call, _next_id("toolu_fake_")
        encoded = json.dumps(arguments, ensure_ascii=ensure_ascii)
        pieces = split_json_pieces(encoded, split_json_at) if split_json_at else [JsonPiece(encoded)]
        blocks.append(ToolUseBlock(tool_id, name, arguments, pieces))
    return StreamedMessage(
        blocks=blocks,
        stop_reason="tool_use",
        usage=_usage(usage),
        first_event_delay=first_event_delay,
        event_delay=event_delay,
    )


def error_response(
    status: int,
    *,
    error_type: str | None = None,
    message: str | None = None,
    retry_after: float | None = None,
    retry_after_ms: float | None = None,
    should_retry: bool | None = None,
) -> ErrorReply:
    """A JSON error body like the real API's, with retry hints as headers."""
    error_type = error_type or _STATUS_ERROR_TYPES.get(status, "api_error")
    headers: dict[str, str] = {}
    if retry_after is not None:
        headers["retry-after"] = f"{retry_after:g}"
    if retry_after_ms is not None:
        headers["retry-after-ms"] = f"{retry_after_ms:g}"
    if should_retry is not None:
        headers["x-should-retry"] = "true" if should_retry else "false"
    return ErrorReply(status, error_type, message or error_type.replace("_", " "), headers)


def broken_stream(
    after_events: int, *, response: StreamedMessage | None = None, abrupt: bool = True
) -> StreamedMessage:
    """A stream that stops after `after_events` SSE events (counting message_start and ping)."""
    base = response or text_response("This answer stops half way through the stream.", chunks=8)
    return replace(base, break_after_events=after_events, abrupt=abrupt)


def in_stream_error(
    error_type: str = "overloaded_error",
    message: str = "Overloaded",
    *,
    after_events: int = 1,
    response: StreamedMessage | None = None,
) -> StreamedMessage:
    """A 200 stream that sends an SSE `error` event after `after_events` events, then ends."""
    base = response or text_response("This answer is cut by an error event.", chunks=6)
    return replace(
        base,
        error_after_events=after_events,
        error={"type": "error", "error": {"type": error_type, "message": message}},
    )


# --- Wire format ------------------------------------------------------------


def _json(data: object) -> str:
    return json.dumps(data, ensure_ascii=False, separators=(",", ":"))


def _frame(event_type: str, data: dict) -> bytes:
    try:
        return f"event: {event_type}\ndata: {_json(data)}\n\n".encode()
    except UnicodeEncodeError:
        # A lone surrogate has no UTF-8 form; JSON carries it escaped, as a
        # model's text may (the client's parser gives it back as is).
        escaped = json.dumps(data, separators=(",", ":"))
        return f"event: {event_type}\ndata: {escaped}\n\n".encode()


def message_json(response: StreamedMessage, model: str) -> dict:
    """The response as one non-streamed Messages API message."""
    content: list[dict] = []
    for block in response.blocks:
        if isinstance(block, TextBlock):
            content.append({"type": "text", "text": "".join(block.chunks)})
        else:
            content.append(
                {"type": "tool_use", "id": block.id, "name": block.name, "input": block.input}
            )
    return {
        "id": _next_id("msg_fake_"),
        "type": "message",
        "role": "assistant",
        "model": response.model or model,
        "content": content,
        "stop_reason": response.stop_reason,
        "stop_sequence": None,
        "usage": _usage(response.usage),
    }


def sse_events(response: StreamedMessage, model: str) -> list[list[bytes]]:
    """The SSE events of a streamed answer; each event is one or more HTTP chunks."""
    usage = _usage(response.usage)
    start_usage = {
        "input_tokens": usage["input_tokens"],
        "output_tokens": 1,
        "cache_creation_input_tokens": usage["cache_creation_input_tokens"],
        "cache_read_input_tokens": usage["cache_read_input_tokens"],
    }
    message = {
        "id": _next_id("msg_fake_"),
        "type": "message",
        "role": "assistant",
        "model": response.model or model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": start_usage,
    }
    start_event = {"type": "message_start", "message": message}
    events: list[list[bytes]] = [[_frame("message_start", start_event)]]
    ping = [_frame("ping", {"type": "ping"})]
    if not response.blocks:
        events.append(ping)
    for index, block in enumerate(response.blocks):
        if isinstance(block, TextBlock):
            start = {"type": "text", "text": ""}
        else:
            start = {"type": "tool_use", "id": block.id, "name": block.name, "input": {}}
        events.append(
            [_frame("content_block_start", {"type": "content_block_start", "index": index,
                                            "content_block": start})]
        )
        if index == 0:
            # The real API sends its first ping right after the first block starts.
            events.append(ping)
        if isinstance(block, TextBlock):
            for chunk in block.chunks:
                delta = {"type": "text_delta", "text": chunk}
                events.append([_frame("content_block_delta", {"type": "content_block_delta",
                                                              "index": index, "delta": delta})])
        else:
            # The real API opens every tool input with an empty delta.
            for piece in [JsonPiece(""), *block.pieces]:
                events.append(_json_delta_event(index, piece))
        events.append([_frame("content_block_stop", {"type": "content_block_stop", "index": index})])
    events.append(
        [_frame("message_delta", {
            "type": "message_delta",
            "delta": {"stop_reason": response.stop_reason, "stop_sequence": None},
            "usage": {"output_tokens": usage["output_tokens"]},
        })]
    )
    events.append([_frame("message_stop", {"type": "message_stop"})])
    return events


def _json_delta_event(index: int, piece: JsonPiece) -> list[bytes]:
    delta = {"type": "input_json_delta", "partial_json": piece.text}
    data = {"type": "content_block_delta", "index": index, "delta": delta}
    frame = _frame("content_block_delta", data)
    if piece.cut is None:
        return [frame]
    # partial_json is the last field and starts with the multi-byte character,
    # which _json leaves unescaped, so its bytes start right after the key.
    marker = b'"partial_json":"'
    at = frame.rindex(marker) + len(marker) + piece.cut
    return [frame[:at], frame[at:]]


# --- Default answers --------------------------------------------------------

_CALL = re.compile(r"\bcall\s+(?P<name>[A-Za-z_][\w-]*)(?P<args>\s*\{.*\})?", re.DOTALL)


def _blocks(message: dict) -> list[dict]:
    content = message.get("content")
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return [block for block in content or [] if isinstance(block, dict)]


def default_responder(body: dict, *, event_delay: float = 0.0) -> Response:
    """"You said: ..." for plain text; a tool_use for "call <tool> {json}"; "done" after tool results."""
    messages = body.get("messages") or []
    last = messages[-1] if messages else {}
    blocks = _blocks(last) if last.get("role") == "user" else []
    if any(block.get("type") == "tool_result" for block in blocks):
        return text_response("done", chunks=1, event_delay=event_delay)
    text = " ".join(block.get("text", "") for block in blocks if block.get("type") == "text").strip()
    match = _CALL.search(text)
    tools_allowed = (body.get("tool_choice") or {}).get("type") != "none"
    if match and tools_allowed:
        try:
            arguments = json.loads(match.group("args") or "{}")
        except ValueError:
            arguments = None
        if isinstance(arguments, dict):
            return tool_use_response([(match.group("name"), arguments)], event_delay=event_delay)
        return text_response("Those tool arguments are not a JSON object.", event_delay=event_delay)
    return text_response(f"You said: {text}", event_delay=event_delay)


# --- The server -------------------------------------------------------------


class RecordedRequest(dict):
    """A request's parsed JSON body, with how it was asked and how it ended.

    outcome: "pending" while answering, then "complete", "error" (an error
    reply was sent), "broken" (we cut the stream on purpose), or
    "client_disconnected" (the client went away mid-answer).
    """

    def __init__(self, body: dict, *, method: str, path: str, headers: dict[str, str]) -> None:
        super().__init__(body)
        self.method = method
        self.path = path
        self.headers = headers
        self.outcome = "pending"

    @property
    def api_key(self) -> str | None:
        """The key the client sent: as x-api-key, or as a bearer token (how SDK 2.x sends it)."""
        if "x-api-key" in self.headers:
            return self.headers["x-api-key"]
        scheme, _, token = self.headers.get("authorization", "").partition(" ")
        return token if scheme.lower() == "bearer" and token else None


class FakeAnthropicServer:
    def __init__(self, *, port: int = 0, api_key: str | None = None,
                 responder: Responder | None = None, tls: ssl.SSLContext | None = None) -> None:
        self._port = port
        # When set, the server speaks HTTPS with this (server side) context.
        self._tls = tls
        # When set, requests that do not carry this key get a 401 like the real API.
        self.api_key = api_key
        self.responder: Responder = responder or default_responder
        self._queue: deque[Response] = deque()
        self._requests: list[RecordedRequest] = []
        # GET /v1/models asked (the server's start-up check of its key).
        self.model_lists = 0
        self._changed = threading.Condition()
        self._stopping = threading.Event()
        self._connections: set[socket.socket] = set()
        self._httpd: _HTTPServer | None = None
        self._thread: threading.Thread | None = None

    # lifecycle
    def start(self) -> FakeAnthropicServer:
        self._stopping.clear()
        self._httpd = _HTTPServer(("127.0.0.1", self._port), _Handler, fake=self)
        if self._tls is not None:
            self._httpd.socket = self._tls.wrap_socket(self._httpd.socket, server_side=True)
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05},
            name="fake-anthropic", daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._httpd is None:
            return
        self._stopping.set()
        self._httpd.shutdown()
        self._httpd.server_close()
        # Idle keep-alive connections would otherwise hold handler threads.
        self.drop_connections()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._httpd = None

    def drop_connections(self) -> None:
        """Shut every open connection, as an API ending idle keep-alives does."""
        with self._changed:
            connections = list(self._connections)
        for conn in connections:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                logger.debug("connection already closed")

    def __enter__(self) -> FakeAnthropicServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        if self._httpd is None:
            raise RuntimeError("fake anthropic server is not running")
        return self._httpd.server_address[1]

    @property
    def base_url(self) -> str:
        return f"{'https' if self._tls is not None else 'http'}://127.0.0.1:{self.port}"

    # scripting
    def enqueue(self, *responses: Response) -> None:
        with self._changed:
            self._queue.extend(responses)

    @property
    def requests(self) -> list[RecordedRequest]:
        with self._changed:
            return list(self._requests)

    def wait_for(self, predicate: Callable[[list[RecordedRequest]], bool], timeout: float = 5.0) -> bool:
        """Block until predicate(requests) holds (re-checked on every change); False on timeout."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while not predicate(list(self._requests)):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._changed.wait(remaining)
            return True

    # used by the handler thread
    def _record(self, request: RecordedRequest) -> None:
        with self._changed:
            self._requests.append(request)
            self._changed.notify_all()

    def _finish(self, request: RecordedRequest, outcome: str) -> None:
        with self._changed:
            request.outcome = outcome
            self._changed.notify_all()

    def _next_response(self, body: dict) -> Response:
        with self._changed:
            if self._queue:
                return self._queue.popleft()
        try:
            return self.responder(body)
        except Exception:
            # A broken responder is a bug in the test: show it, and let the
            # client see a server error rather than a dropped connection.
            logger.exception("fake anthropic responder failed")
            return ErrorReply(500, "api_error", "fake responder failed")

    def _track(self, conn: socket.socket, open_: bool) -> None:
        with self._changed:
            (self._connections.add if open_ else self._connections.discard)(conn)


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    # Fifty clients connecting at once (the benchmark's) find room in the backlog.
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], handler: type, *, fake: FakeAnthropicServer) -> None:
        self.fake = fake
        super().__init__(address, handler)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _HTTPServer

    def setup(self) -> None:
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.server.fake._track(self.connection, True)

    def finish(self) -> None:
        self.server.fake._track(self.connection, False)
        try:
            super().finish()
        except OSError:
            logger.debug("connection closed before the handler finished")

    def log_message(self, format: str, *args: object) -> None:
        logger.debug("fake anthropic: %s", format % args)

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/health":
            self._send_json(200, {"ok": True})
        elif path == "/v1/models":
            self._list_models()
        else:
            self._send_error(ErrorReply(404, "not_found_error", "not found"))

    def _list_models(self) -> None:
        """The Models API's list (what the server's start-up check asks):
        401 for a key other than the fake's. Counted in ``model_lists``,
        not recorded with the Messages requests."""
        fake = self.server.fake
        headers = {name.lower(): value for name, value in self.headers.items()}
        key = RecordedRequest({}, method="GET", path=self.path, headers=headers).api_key
        with fake._changed:
            fake.model_lists += 1
            fake._changed.notify_all()
        if fake.api_key is not None and key != fake.api_key:
            self._send_error(ErrorReply(401, "authentication_error", "invalid x-api-key"))
            return
        model = {"type": "model", "id": DEFAULT_MODEL, "display_name": "Claude (fake)",
                 "created_at": "2026-01-01T00:00:00Z"}
        self._send_json(200, {"data": [model], "has_more": False, "first_id": DEFAULT_MODEL,
                              "last_id": DEFAULT_MODEL})

    def do_POST(self) -> None:
        fake = self.server.fake
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length)
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            body = None
        record = RecordedRequest(
            body if isinstance(body, dict) else {},
            method="POST",
            path=self.path,
            headers={name.lower(): value for name, value in self.headers.items()},
        )
        fake._record(record)

        problem = self._problem(record, body)
        response = problem or fake._next_response(record)
        try:
            if isinstance(response, ErrorReply):
                self._send_error(response)
                fake._finish(record, "error")
            elif record.get("stream"):
                fake._finish(record, self._send_stream(response, record.get("model") or DEFAULT_MODEL))
            else:
                self._send_message(response, record.get("model") or DEFAULT_MODEL)
                fake._finish(record, "complete")
        except (BrokenPipeError, ConnectionResetError, ConnectionAbortedError):
            self.close_connection = True
            fake._finish(record, "client_disconnected")

    def _problem(self, record: RecordedRequest, body: object) -> ErrorReply | None:
        """The error the real API would answer for a malformed request, if any."""
        path = self.path.split("?", 1)[0]
        if path != "/v1/messages":
            return ErrorReply(404, "not_found_error", f"no route for {path}")
        required = self.server.fake.api_key
        if required is not None and record.api_key != required:
            return ErrorReply(401, "authentication_error", "invalid x-api-key")
        if not isinstance(body, dict):
            return ErrorReply(400, "invalid_request_error", "request body is not a json object")
        for name, kind in (("model", str), ("max_tokens", int), ("messages", list)):
            if not isinstance(body.get(name), kind):
                return ErrorReply(400, "invalid_request_error", f"{name}: field required")
        return None

    def _send_json(self, status: int, data: dict, headers: dict[str, str] | None = None) -> None:
        payload = _json(data).encode("utf-8")
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(payload)))
        self.send_header("request-id", _next_id("req_fake_"))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(payload)

    def _send_error(self, reply: ErrorReply) -> None:
        body = {"type": "error", "error": {"type": reply.error_type, "message": reply.message}}
        self._send_json(reply.status, body, reply.headers)

    def _send_message(self, response: StreamedMessage, model: str) -> None:
        if response.error is not None:
            error_type = response.error["error"]["type"]
            status = 529 if error_type == "overloaded_error" else 500
            self._send_error(ErrorReply(status, error_type, response.error["error"]["message"]))
        elif response.break_after_events is not None:
            self._drop_connection()
        else:
            self._send_json(200, message_json(response, model))

    def _send_stream(self, response: StreamedMessage, model: str) -> str:
        stopping = self.server.fake._stopping
        self.send_response(200)
        self.send_header("content-type", "text/event-stream; charset=utf-8")
        self.send_header("cache-control", "no-cache")
        self.send_header("transfer-encoding", "chunked")
        self.send_header("request-id", _next_id("req_fake_"))
        self.end_headers()

        for count, event in enumerate(sse_events(response, model)):
            if count == response.break_after_events:
                if response.abrupt:
                    self._drop_connection()
                else:
                    self._write_chunk(b"")
                return "broken"
            if count == response.error_after_events:
                self._write_chunk(_frame("error", response.error or {}))
                self._write_chunk(b"")
                return "complete"
            if count == response.hold_after_events and response.hold is not None:
                while not response.hold.wait(0.05):
                    if stopping.is_set():
                        self._drop_connection()
                        return "broken"
            delay = response.first_event_delay if count == 0 else response.event_delay
            if delay and stopping.wait(delay):
                self._drop_connection()
                return "broken"
            for part in event:
                self._write_chunk(part)
        self._write_chunk(b"")
        return "complete"

    def _write_chunk(self, data: bytes) -> None:
        # An empty chunk is the terminating one that ends the body.
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))

    def _drop_connection(self) -> None:
        """Close the socket mid-body, like a connection lost in transit."""
        self.close_connection = True
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            logger.debug("connection already gone when dropping it")


# --- Script -------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Serve a fake Anthropic Messages API on 127.0.0.1.")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--event-delay", type=float, default=0.0,
                        help="seconds between SSE events, to watch text stream in")
    parser.add_argument("--api-key", default=None, help="answer 401 unless the request carries this key")
    args = parser.parse_args(argv)

    def responder(body: dict) -> Response:
        return default_responder(body, event_delay=args.event_delay)

    server = FakeAnthropicServer(port=args.port, api_key=args.api_key, responder=responder)
    return serve_until_signalled(server, "fake anthropic")


def serve_until_signalled(server: FakeAnthropicServer, name: str) -> int:
    """Start ``server``, say where it listens, and serve until SIGTERM or SIGINT."""
    server.start()
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    signal.signal(signal.SIGINT, lambda *_: done.set())
    print(f"{name} listening on {server.base_url}", flush=True)
    done.wait()
    server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
