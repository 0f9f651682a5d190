"""One speech worker process: where the speech engines' blocking work runs.

The serving process (jobs.py) starts each worker from multiprocessing's
forkserver and talks to it over one socket. A job is the pickle of
``(function, arguments)``, its answer the pickle of ``("ok", result)`` or
``("error", code, detail)`` (a SpeechError's code, or speech_failed for
anything else), each frame preceded by its length (4 bytes, big-endian).
Functions travel by reference (module and name): a job is any module-level
function the worker can import. A worker runs one job at a time, and what a
job keeps in its module (offline.py's PocketSphinx decoders) stays loaded
for the next one.

The worker ends when the serving process closes its socket (or dies: the
socket closes with it), after the job it is running.

Pure: no Django, no asyncio.
"""
from __future__ import annotations

import pickle
import signal
import socket
import struct

from aitp.voice.base import SpeechError

HEADER = struct.Struct("!I")


def pack(message: object) -> bytes:
    """One frame: the length, then the pickle."""
    body = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return HEADER.pack(len(body)) + body


def read_exactly(sock: socket.socket, size: int) -> bytes | None:
    """`size` bytes, or None when the peer closed the socket first."""
    data = bytearray()
    while len(data) < size:
        piece = sock.recv(min(size - len(data), 1 << 20))
        if not piece:
            return None
        data += piece
    return bytes(data)


def read_frame(sock: socket.socket) -> bytes | None:
    header = read_exactly(sock, HEADER.size)
    if header is None:
        return None
    return read_exactly(sock, HEADER.unpack(header)[0])


def answer(request: bytes) -> tuple:
    """Run one job; its answer, whatever it raised."""
    try:
        function, args = pickle.loads(request)
        return ("ok", function(*args))
    except SpeechError as exc:
        return ("error", exc.code, exc.detail)
    except Exception as exc:
        return ("error", "speech_failed", f"{type(exc).__name__}: {exc}"[:300])


def serve(sock: socket.socket) -> None:
    """The worker's life: jobs in, answers out, until the socket closes."""
    # Ctrl-C reaches every process of the terminal's group: the serving
    # process stops its workers itself, after its pages have drained.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with sock:
        while True:
            try:
                request = read_frame(sock)
            except OSError:
                return
            if request is None:
                return
            reply = answer(request)
            try:
                frame = pack(reply)
            except Exception as exc:  # a result that cannot be pickled
                frame = pack(("error", "speech_failed", f"unsendable result: {type(exc).__name__}"))
            try:
                sock.sendall(frame)
            except OSError:
                return


def ready() -> bool:
    """A job that does nothing: a worker answering it is up."""
    return True
