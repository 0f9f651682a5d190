"""A tenant's webhook endpoint for tests: a real HTTP(S) server on 127.0.0.1.

It checks requests with the receiver docs/security.md shows (the Python
block defining ``owllayer_request_is_genuine``, read from that file itself),
so the documented check is the one the tests run.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import re
import ssl
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

SECRET = "whsec_test_secret"
SECURITY_DOC = Path(__file__).resolve().parents[2] / "docs" / "security.md"


def documented_receiver_check():
    """docs/security.md's ``owllayer_request_is_genuine``, run from its own text."""
    blocks = re.findall(r"```python\n(.*?)```", SECURITY_DOC.read_text(), flags=re.DOTALL)
    source = next(block for block in blocks if "def owllayer_request_is_genuine(" in block)
    namespace: dict = {}
    exec(compile(source, "docs/security.md", "exec"), namespace)
    return namespace["owllayer_request_is_genuine"], namespace["MAX_AGE_SECONDS"]


is_genuine, MAX_AGE_SECONDS = documented_receiver_check()


class Receiver(BaseHTTPRequestHandler):
    """A tenant's endpoint; the path picks its behaviour."""

    received: list[dict] = []
    release = threading.Event()
    # Seconds added to this receiver's clock: a request replayed later.
    clock_offset = 0.0

    def log_message(self, *args) -> None:  # keep test output quiet
        pass

    def _answer(self, status: int, body: bytes, content_type="application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    # Paths answered the same way every time: (status, body, content type).
    FIXED = {
        "/no-content": (204, b"", "application/json"),
        "/empty": (200, b"", "application/json"),
        "/multiple-choices": (300, b'{"choices": []}', "application/json"),
        "/fail": (500, b'{"error": "boom"}', "application/json"),
        "/garbage": (200, b"<html>not json</html>", "text/html"),
        "/huge-declared": (200, b"[" + b"1," * 5000 + b"1]", "application/json"),
    }

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        timestamp = self.headers["X-OwlLayer-Timestamp"]
        expected = "sha256=" + hmac.new(
            SECRET.encode(), timestamp.encode() + b"." + body, hashlib.sha256
        ).hexdigest()
        signed = hmac.compare_digest(expected, self.headers["X-OwlLayer-Signature"])
        now = time.time() + self.clock_offset
        genuine = is_genuine(SECRET, timestamp, self.headers["X-OwlLayer-Signature"], body, now=now)
        self.received.append({"path": self.path, "body": json.loads(body), "signed": signed,
                              "genuine": genuine, "host": self.headers.get("Host"),
                              "arrived": now, "raw_body": body, "headers": dict(self.headers)})
        if self.path in self.FIXED:
            return self._answer(*self.FIXED[self.path])
        if self.path == "/echo":
            return self._echo(genuine, body)
        special = {"/slow": self._slow, "/drip": self._drip, "/huge-streamed": self._huge_streamed,
                   "/redirect": self._redirect}.get(self.path)
        if special is None:
            return self._answer(404, b"{}")
        return special()

    def _echo(self, genuine: bool, body: bytes) -> None:
        if not genuine:
            return self._answer(401, b'{"error": "bad signature or stale timestamp"}')
        return self._answer(200, json.dumps({"ok": True, "got": json.loads(body)}).encode())

    def _slow(self) -> None:
        self.release.wait(10)
        self._answer(200, b"{}")

    def _drip(self) -> None:
        # A valid answer a byte at a time, each byte soon after the last,
        # for ten seconds: only a bound on the whole exchange cuts it.
        answer = b"[" + b" " * 100 + b"1]"
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        try:
            for byte in answer:
                self.wfile.write(bytes([byte]))
                self.wfile.flush()
                time.sleep(0.1)
        except (BrokenPipeError, ConnectionResetError):
            return  # the client gave up, as it should

    def _huge_streamed(self) -> None:
        # No Content-Length: the client only learns the size by reading.
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Connection", "close")
        self.end_headers()
        try:
            self.wfile.write(b"[")
            for _ in range(200):
                self.wfile.write(b"1," * 5000)
                self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            return  # the client stopped reading, as it should

    def _redirect(self) -> None:
        self.send_response(302)
        self.send_header("Location", "/echo")
        self.send_header("Content-Length", "0")
        self.end_headers()


def start_receiver(tls: ssl.SSLContext | None = None) -> tuple[ThreadingHTTPServer, threading.Thread]:
    """A receiver on a free port; ``tls``: the server side of https."""
    Receiver.received = []
    Receiver.release = threading.Event()
    Receiver.clock_offset = 0.0
    server = ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    server.daemon_threads = True
    if tls is not None:
        # A failed handshake is an OSError in accept(), which the server drops.
        server.socket = tls.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                              daemon=True)
    thread.start()
    return server, thread


def stop_receiver(server: ThreadingHTTPServer, thread: threading.Thread) -> None:
    Receiver.release.set()
    server.shutdown()
    server.server_close()
    thread.join()
