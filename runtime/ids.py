"""Random identifiers drawn from the system's random source in blocks.

Every session id, tool call id, channel name and frame id is random, and
``uuid.uuid4`` and ``secrets`` read the system's random source for each
one: a system call that lets go of the GIL, so on the serving loop, while
the database threads work, each id waited for the GIL to come back (a few
percent of the loop's time at fifty session opens). Here the bytes are the
same source's (``os.urandom``), read a block at a time and handed out once
each; a forked child starts with a block of its own.
"""
from __future__ import annotations

import base64
import os
import threading
import uuid

BLOCK = 4096


class _Entropy:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._block = b""
        self._taken = 0

    def take(self, size: int) -> bytes:
        if size > BLOCK:
            return os.urandom(size)
        with self._lock:
            if self._taken + size > len(self._block):
                self._block = os.urandom(BLOCK)
                self._taken = 0
            start = self._taken
            self._taken = start + size
            return self._block[start:start + size]

    def forget(self) -> None:
        """In a forked child: the parent's unread bytes are the parent's."""
        self._lock = threading.Lock()
        self._block = b""
        self._taken = 0


_entropy = _Entropy()
os.register_at_fork(after_in_child=_entropy.forget)


def token_hex(size: int) -> str:
    """As ``secrets.token_hex``: ``size`` random bytes, as hex."""
    return _entropy.take(size).hex()


def token_urlsafe(size: int) -> str:
    """As ``secrets.token_urlsafe``: ``size`` random bytes, URL-safe base64 unpadded."""
    return base64.urlsafe_b64encode(_entropy.take(size)).rstrip(b"=").decode("ascii")


def uuid4() -> uuid.UUID:
    """As ``uuid.uuid4``: a version 4 (random) UUID."""
    return uuid.UUID(bytes=_entropy.take(16), version=4)
