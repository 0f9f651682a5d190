"""The metrics endpoint: ``GET /metrics`` on ``OWLLAYER_METRICS_ADDRESS``.

A listener of its own, on a thread of its own, never the public port: by
default on the loopback address only; with ``OWLLAYER_METRICS_TOKEN`` set,
every scrape must carry ``Authorization: Bearer <token>`` (for an address a
scraper on another machine reaches). Processes of one host that share
``OWLLAYER_METRICS_DIR`` share the address too (``SO_REUSEPORT``): whichever
answers, it answers with the sum of all of them -- one scrape target per host.
"""
from __future__ import annotations

import hmac
import ipaddress
import logging
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from runtime import metrics
from runtime.config import config

logger = logging.getLogger(__name__)


def parse_address(address: str) -> tuple[str, int]:
    """``host:port`` (``[::1]:9464`` for IPv6) -> (host, port); ValueError when it is not one."""
    host, sep, port = address.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ValueError(f"not a host:port address: {address!r}")
    return host, int(port)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class _Handler(BaseHTTPRequestHandler):
    server_version = "owllayer-metrics"

    def do_GET(self) -> None:
        if self.path.split("?", 1)[0] != "/metrics":
            self._answer(404, b"not found: the figures are at /metrics\n", "text/plain; charset=utf-8")
            return
        token = config().metrics.token
        if token:
            given = self.headers.get("Authorization", "")
            if not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
                self._answer(401, b"a bearer token is required (OWLLAYER_METRICS_TOKEN)\n",
                             "text/plain; charset=utf-8")
                return
        try:
            body, content_type = metrics.exposition()
        except Exception:
            logger.exception("the metrics could not be read")
            self._answer(500, b"the metrics could not be read; see the server's log\n",
                         "text/plain; charset=utf-8")
            return
        self._answer(200, body, content_type)

    def _answer(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args) -> None:
        pass  # scrapes every few seconds are not worth a log line each


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], *, share: bool) -> None:
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self.allow_reuse_port = share
        super().__init__(address, _Handler)


def start() -> ThreadingHTTPServer | None:
    """Serve the figures on a daemon thread; the server (``server_address``:
    where), or None (metrics off, no address, or the address taken: logged)."""
    settings = config().metrics
    if not settings.enabled or not settings.address:
        return None
    host, port = parse_address(settings.address)
    metrics.directory()  # this process's figures exist before the first scrape
    try:
        server = _Server((host, port), share=bool(settings.directory))
    except OSError as exc:
        hint = ("" if settings.directory else "; processes of one host share the address when "
                "they share OWLLAYER_METRICS_DIR")
        logger.warning("metrics not served: %s is taken or cannot be used (%s)%s",
                       settings.address, exc.strerror or exc, hint)
        return None
    if not settings.token and not is_loopback(host):
        logger.warning("metrics are served on %s without a token: anyone who reaches that address "
                       "reads them (set OWLLAYER_METRICS_TOKEN)", settings.address)
    threading.Thread(target=server.serve_forever, name="owllayer-metrics", daemon=True).start()
    shown = f"[{host}]" if ":" in host else host
    logger.info("metrics served at http://%s:%s/metrics", shown, server.server_address[1])
    return server
