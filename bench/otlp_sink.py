"""The traced product's collector: takes OTLP/HTTP exports and drops them.

``python -m bench.otlp_sink --port 0`` answers every ``POST /v1/traces`` (and
metrics, logs) with 200 and an empty body, as a collector that accepted
them. A separate process, so the exports never share the page side's
interpreter while latencies are read. The cost measured is the product's:
making the spans, batching and sending them.
"""
from __future__ import annotations

import argparse
import signal
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class _Sink(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args) -> None:
        pass


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="An OTLP/HTTP sink on 127.0.0.1.")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args(argv)
    server = ThreadingHTTPServer(("127.0.0.1", args.port), _Sink)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    signal.signal(signal.SIGINT, lambda *_: done.set())
    print(f"otlp sink listening on 127.0.0.1:{server.server_address[1]}", flush=True)
    done.wait()
    server.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
