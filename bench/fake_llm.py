"""The streaming line's model: the project's fake Messages API, stamping deltas.

``python -m bench.fake_llm --port 0 --deltas 20 --event-delay 0.02`` serves
the real SSE format (tests/support/fake_anthropic.py) on 127.0.0.1 and
answers every request with one text block of ``--deltas`` text_delta
events. Each delta's text carries the moment it was written to the socket
(CLOCK_MONOTONIC, shared by every process of the machine), so the page side
computes how long the delta took to reach it: fake -> product -> page.

A separate process, so the fake's threads never share the page side's
interpreter (and its GIL) while latencies are read.
"""
from __future__ import annotations

import argparse
import re
import sys
import threading
import time

from tests.support import fake_anthropic
from tests.support.fake_anthropic import FakeAnthropicServer, StreamedMessage, TextBlock

MARKER = b"@@EMITTED@@"
STAMP = re.compile(r"\[t=(\d{1,20})\]")


def stamp(data: bytes) -> bytes:
    """``data`` with each marker replaced by the current monotonic time in ns."""
    if MARKER not in data:
        return data
    return data.replace(MARKER, b"[t=%d]" % time.monotonic_ns())


def stamps(text: str) -> list[int]:
    """The emission times (ns) carried by a received text."""
    return [int(found) for found in STAMP.findall(text)]


class _StampingHandler(fake_anthropic._Handler):
    def _write_chunk(self, data: bytes) -> None:
        super()._write_chunk(stamp(data))


class StampingServer(FakeAnthropicServer):
    def start(self) -> StampingServer:
        self._stopping.clear()
        self._httpd = fake_anthropic._HTTPServer(("127.0.0.1", self._port), _StampingHandler,
                                                 fake=self)
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05},
            name="fake-llm", daemon=True,
        )
        self._thread.start()
        return self


def responder_for(deltas: int, event_delay: float):
    chunk = MARKER.decode() + " "

    def respond(body: dict) -> StreamedMessage:
        return StreamedMessage(blocks=[TextBlock([chunk] * deltas)], event_delay=event_delay,
                               usage={"input_tokens": 10, "output_tokens": deltas})

    return respond


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Stamping fake Messages API (127.0.0.1).")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--deltas", type=int, default=20)
    parser.add_argument("--event-delay", type=float, default=0.02)
    args = parser.parse_args(argv)
    server = StampingServer(port=args.port, responder=responder_for(args.deltas, args.event_delay))
    return fake_anthropic.serve_until_signalled(server, "fake llm")


if __name__ == "__main__":
    sys.exit(main())
