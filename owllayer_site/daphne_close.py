"""Close frames and per-connection memory as the AITP wire contract needs
them, under daphne.

The deployed client reads the close code to decide whether to reconnect
(protocol.md §10): 1008 means "permanent, show the reason". daphne
passes the ASGI close code to autobahn's ``sendClose()``, which refuses any
code but 1000 and 3000-4999 (the close then turns into a 1011), and daphne
drops the ASGI ``reason``. This sends the close frame with the code and the
reason the application asked for, for every code RFC 6455 lets an endpoint
send.

It also bounds what one connection can make the process hold:

- a frame over daphne's ceiling (``--websocket-max-message-size``) is closed
  with 1009, the code docs/protocol.md §10 names, where autobahn's server default
  drops the TCP connection (the client sees 1006);
- frames the client sent but the consumer has not handled yet: past
  ``OWLLAYER_MAX_INBOUND_BYTES`` daphne stops reading the socket until the
  consumer catches up, so a flood waits in the client's own TCP buffers;
- frames sent to a client that does not read them: past
  ``OWLLAYER_MAX_OUTBOUND_BYTES`` waiting in the socket's write buffer, the
  connection is closed with 1013 (try again later: the client reconnects,
  protocol.md §10) and dropped, which frees the buffer and makes
  daphne tell the consumer, whose teardown ends the session.

A page slow to answer a close frame (a busy browser on a loaded machine)
still reads it: when the page has not answered within autobahn's close
handshake timeout, the connection is dropped with a FIN once the close frame
has left the process, not with a reset, which made the page's kernel throw
away the frame still unread (the page then saw 1006 and reconnected where
1008 told it not to). Only a page that does not read at all is reset.

Nor does a connection leave reference cycles behind (the HTTP request it was
upgraded from and its channel; autobahn's ``is_closed``, fired with the
protocol itself): a closed connection is freed by reference counting, never
left for the cycle collector, whose passes over thousands of them stall
every page of the process.

And it spares each connection costs nobody reads: autobahn pretty-prints its
whole configuration (sixty-odd attributes) for a debug log line on every
connection, and colours the names and values of a dozen more debug lines on
every connection and frame (``hltype``, ``hlval``), whether or not debug
logging is on; that text is now made only if its line is written.
"""
from __future__ import annotations

import functools
import logging
import pprint

from aitp.close_codes import CLOSE_INTERNAL_ERROR, CLOSE_TRY_AGAIN_LATER, MAX_CLOSE_REASON_BYTES, sendable

logger = logging.getLogger(__name__)

# How often a connection whose reading is paused looks again (seconds).
RESUME_CHECK_INTERVAL = 0.01
# Frames waiting for the consumer that pause reading whatever their size: a
# flood of tiny frames costs per-frame overhead, not only bytes.
MAX_INBOUND_FRAMES = 256


def outbound_backlog(transport) -> int:
    """Bytes written to a Twisted TCP transport and not yet taken by the kernel."""
    if transport is None:
        return 0
    buffered = len(getattr(transport, "dataBuffer", b"")) - getattr(transport, "offset", 0)
    return buffered + getattr(transport, "_tempDataLen", 0)


def inbound_backlog(queue) -> tuple[int, int]:
    """(frames, bytes) received and not yet taken by the application."""
    items = getattr(queue, "_queue", None)
    if not items:
        return 0, 0
    size = 0
    for message in list(items)[:MAX_INBOUND_FRAMES]:
        if isinstance(message, dict):
            size += len(message.get("text") or message.get("bytes") or "")
    return len(items), size


def _limits() -> tuple[int, int]:
    from runtime.config import config

    protocol = config().protocol
    return (protocol.max_inbound_bytes, protocol.max_outbound_bytes)

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
                code = CLOSE_INTERNAL_ERROR
            reason = message.get("reason") or ""
            encoded = reason.encode("utf-8")[:MAX_CLOSE_REASON_BYTES].decode("utf-8", "ignore").encode()
            self.sendCloseFrame(code=code, reasonUtf8=encoded or None, isReply=False)
            return
        return original(self, message)

    WebSocketProtocol.handle_reply = handle_reply
    _install_lazy_debug_text()
    _install_frame_ceiling(WebSocketProtocol)
    _install_backpressure(WebSocketProtocol)
    _install_orderly_close_timeout(WebSocketProtocol)
    _install_no_cycles_left(WebSocketProtocol)
    WebSocketProtocol._aitp_close_installed = True


class _MadeWhenWritten:
    """``module.<name>(*args)`` as text, made when the log line is written
    (the function looked up then)."""

    __slots__ = ("args", "module", "name")

    def __init__(self, module, name: str, *args) -> None:
        self.module = module
        self.name = name
        self.args = args

    def __str__(self) -> str:
        return str(getattr(self.module, self.name)(*self.args))

    def __format__(self, spec: str) -> str:
        return format(str(self), spec)


def _install_lazy_debug_text() -> None:
    from autobahn import util
    from autobahn.twisted import websocket
    from autobahn.websocket import protocol

    if getattr(protocol, "pformat", None) is not pprint.pformat:
        return  # another autobahn: leave it as it is
    protocol.pformat = functools.partial(_MadeWhenWritten, pprint, "pformat")
    # The one use of that name that must return text at once.
    protocol.Timings.__str__ = lambda self: pprint.pformat(self._timings)
    # Every use of these two in these modules is an argument of a log line.
    for module in (protocol, websocket):
        for name in ("hltype", "hlval"):
            if getattr(module, name, None) is getattr(util, name):
                setattr(module, name, functools.partial(_MadeWhenWritten, util, name))


def _install_frame_ceiling(protocol_class) -> None:
    original = protocol_class._max_message_size_exceeded

    def _max_message_size_exceeded(self, msg_size, max_msg_size, reason):
        # autobahn's servers fail by dropping TCP: the client would see 1006.
        # Send the close frame instead; the rest of the frame is discarded
        # as it arrives, and the closing handshake (bounded by autobahn's
        # close timeout) ends the connection.
        self.failByDrop = False
        logger.info("closing a connection with 1009: %s", reason)
        return original(self, msg_size, max_msg_size, reason)

    protocol_class._max_message_size_exceeded = _max_message_size_exceeded


def _install_orderly_close_timeout(protocol_class) -> None:
    original = protocol_class.onCloseHandshakeTimeout

    def onCloseHandshakeTimeout(self):
        if self.state == self.STATE_CLOSED or outbound_backlog(self.transport) > 0:
            return original(self)
        # The close frame is in the kernel's hands: a FIN follows it there.
        self.closeHandshakeTimeoutCall = None
        self.wasClean = False
        self.wasNotCleanReason = "the page did not answer the close frame in time"
        self.wasCloseHandshakeTimeout = True
        self.dropConnection(abort=False)
        return None

    protocol_class.onCloseHandshakeTimeout = onCloseHandshakeTimeout


def _install_backpressure(protocol_class) -> None:
    inbound_limit, outbound_limit = _limits()
    original_on_message = protocol_class.onMessage
    original_send = protocol_class.serverSend

    def onMessage(self, payload, isBinary):
        original_on_message(self, payload, isBinary)
        queue = getattr(self, "application_queue", None)
        if queue is None or getattr(self, "_aitp_reading_paused", False):
            return
        frames, size = inbound_backlog(queue)
        if frames >= MAX_INBOUND_FRAMES or size >= inbound_limit:
            self._aitp_reading_paused = True
            self.transport.pauseProducing()
            _resume_when_drained(self, inbound_limit)

    def serverSend(self, content, binary=False):
        if self.state in (self.STATE_CLOSING, self.STATE_CLOSED):
            return  # closing: nothing more is worth buffering
        original_send(self, content, binary)
        backlog = outbound_backlog(self.transport)
        if backlog > outbound_limit:
            logger.warning(
                "closing a connection with 1013: %d bytes waiting for a client that does not "
                "read (limit OWLLAYER_MAX_OUTBOUND_BYTES=%d)", backlog, outbound_limit,
            )
            # The close frame joins the backlog, and a client that reads
            # again gets it; one that does not is dropped by autobahn's
            # close-handshake timeout. Dropping now would be as good but
            # would lose the code for a client that is only slow.
            self.sendCloseFrame(code=CLOSE_TRY_AGAIN_LATER, reasonUtf8=b"client not reading",
                                isReply=False)

    protocol_class.onMessage = onMessage
    protocol_class.serverSend = serverSend


def _install_no_cycles_left(protocol_class) -> None:
    from daphne.http_protocol import WebRequest

    original_lost = protocol_class.connectionLost
    original_process = WebRequest.process

    def connectionLost(self, reason):
        original_lost(self, reason)
        forget_closed_protocol(self)

    def process(self):
        result = original_process(self)
        if self.transport is None:  # handed to a WebSocket protocol
            release_upgraded_request(self)
        return result

    protocol_class.connectionLost = connectionLost
    WebRequest.process = process


def forget_closed_protocol(protocol) -> None:
    """autobahn fires ``is_closed`` with the protocol itself, and the fired
    Deferred keeps it: nobody waits on it here, so the result is dropped."""
    closed = protocol.__dict__.get("is_closed")
    if getattr(closed, "called", False) and getattr(closed, "result", None) is protocol:
        closed.result = None


def release_upgraded_request(request) -> None:
    """The HTTP request a WebSocket was upgraded from stays first in its
    channel's queue for good (the channel lost its transport to the
    WebSocket and never finishes it): out of the queue, as Twisted takes it
    when a connection is lost."""
    requests = getattr(request.channel, "requests", None)
    if requests and request in requests:
        requests.remove(request)


def _resume_when_drained(protocol, inbound_limit: int) -> None:
    from twisted.internet import reactor

    def check():
        if protocol.state == protocol.STATE_CLOSED or protocol.transport is None:
            return
        frames, size = inbound_backlog(protocol.application_queue)
        if frames < MAX_INBOUND_FRAMES // 2 and size < inbound_limit // 2:
            protocol._aitp_reading_paused = False
            protocol.transport.resumeProducing()
            return
        reactor.callLater(RESUME_CHECK_INTERVAL, check)

    reactor.callLater(RESUME_CHECK_INTERVAL, check)
