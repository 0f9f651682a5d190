"""The one small cache of the process: answers reused while they are fresh
(a time to live, in seconds), and asked for once however many need them at
the same moment. Every once-a-second read of the server uses it: a key read
for an open (``aitp.store.keys``), a tenant's quota verdict
(``aitp.limits``), a tenant's server tools (``connection.opening``), a watch group's
presence (``aitp.live``)."""
from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

T = TypeVar("T")


class RecentAnswers(Generic[T]):
    """Per key, the last answer and when it was learned: an answer younger
    than ``fresh_for()`` seconds is reused (0: never). While an answer is
    being asked for, everyone else who needs it waits for that asking
    instead of asking too: when a tenant's answer went stale, each of its
    sessions' next frames asked the database threads the same question at
    once. Past ``limit`` keys, everything learned is forgotten (a bound on
    memory, not an eviction policy)."""

    def __init__(self, fresh_for: Callable[[], float], *, limit: int = 10_000) -> None:
        self._fresh_for = fresh_for
        self._limit = limit
        self._known: dict[Hashable, tuple[float, T]] = {}
        self._asking: dict[Hashable, asyncio.Task[T]] = {}

    def learned(self, key: Hashable, value: T) -> None:
        """An answer known otherwise (e.g. this process just made it true)."""
        if len(self._known) >= self._limit:
            self._known.clear()
        self._known[key] = (time.monotonic(), value)

    def known(self, key: Hashable, default: T) -> T:
        """The answer if one is fresh, else ``default`` (nothing is asked)."""
        known = self._known.get(key)
        if known is not None and time.monotonic() - known[0] < self._fresh_for():
            return known[1]
        return default

    def remembered(self, key: Hashable, default: T) -> T:
        """The last answer learned, however old, else ``default`` (for what
        never changes once learned, e.g. a row's id)."""
        known = self._known.get(key)
        return default if known is None else known[1]

    def forget(self, key: Hashable) -> None:
        """The answer changed: the next ``get`` asks again."""
        self._known.pop(key, None)

    async def get(self, key: Hashable, ask: Callable[[], Awaitable[T]]) -> T:
        known = self._known.get(key)
        if known is not None and time.monotonic() - known[0] < self._fresh_for():
            return known[1]
        loop = asyncio.get_running_loop()
        asking = self._asking.get(key)
        if asking is None or asking.get_loop() is not loop:
            asking = loop.create_task(self._ask(key, ask))
            asking.add_done_callback(_retrieve)
            self._asking[key] = asking
        # A caller that stops waiting leaves the asking to the others.
        return await asyncio.shield(asking)

    async def _ask(self, key: Hashable, ask: Callable[[], Awaitable[T]]) -> T:
        try:
            value = await ask()
        finally:
            if self._asking.get(key) is asyncio.current_task():
                del self._asking[key]
        if self._fresh_for() > 0:
            self.learned(key, value)
        return value


def _retrieve(task: asyncio.Task[object]) -> None:
    # Every waiter may have gone: the error is theirs, not the loop's to log.
    if not task.cancelled():
        task.exception()
