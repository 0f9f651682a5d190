"""Writes of many connections that go to the database as one call.

At fifty or two hundred busy sessions, each connection's writes (its turn's
checkpoints and tool-call marks, its live session row, its row's close) are
as many database calls per second, each handed to a database thread,
waited for there and handed back, for a few short statements. A
``GroupWrite`` collects the writes asked for while one is on its way and
sends them together when it is back (a group commit): one call, one
transaction (one query on PostgreSQL) for all of them. A lone write goes at
once, as before; under load a write waits at most for the call ahead of it.
One session never has two writes of one kind on their way (each caller
waits for its write), so a group never reorders a session's writes.

``write_many`` runs on a database thread with the arguments of every write
of the group, and returns, in order, None or the exception of each: when
the database refuses the group (a value of one session it cannot store),
it writes each alone, so that only that write fails
(``aitp.store.fast``).

``Gathered`` is the same gathering for any coroutine that sends many
requests at once (the Redis layer's group memberships: one round trip for
the joins and leaves of every connection that asked meanwhile; the shared
count of session opens per key); each request gets its own answer.
"""
from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from runtime import metrics
from runtime.db import db_call

WriteMany = Callable[[list[dict]], list[BaseException | None]]
# The requests of one group -> for each, in order, its answer or its exception.
SendMany = Callable[[list[dict]], Awaitable[list[Any]]]


class Gathered:
    """Requests asked for while a group is on its way go together in the
    next one (``send_many``); a lone request goes at once."""

    def __init__(self, send_many: SendMany, *, name: str = "") -> None:
        self.send_many = send_many
        # Named: how many wait is one of the process's figures (runtime.metrics).
        self.name = name
        self._waiting: list[tuple[dict, asyncio.Future]] = []
        self._sending: asyncio.Task | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    async def ask(self, **arguments) -> Any:
        """Send with the group on its way next and return this request's
        answer, or raise its exception. A caller cancelled before its
        request left is not sent; once it left, it goes whole with its group."""
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            # A new event loop (a test, a management command): what another
            # loop left is no one's any more.
            self._loop, self._waiting, self._sending = loop, [], None
        future = loop.create_future()
        entry = (arguments, future)
        self._waiting.append(entry)
        if self._sending is None or self._sending.done():
            self._sending = loop.create_task(self._send())
        try:
            return await future
        except asyncio.CancelledError:
            if any(waiting is entry for waiting in self._waiting):
                self._waiting = [waiting for waiting in self._waiting if waiting is not entry]
            raise

    async def _send(self) -> None:
        try:
            while self._waiting:
                group, self._waiting = self._waiting, []
                if self.name:
                    # How many went together: those that waited behind the group before.
                    metrics.writes_grouped(self.name, len(group))
                try:
                    outcomes = await self.send_many([arguments for arguments, _ in group])
                except asyncio.CancelledError:
                    self._waiting = group + self._waiting
                    raise
                except Exception as exc:  # the call itself failed: every request of it did
                    outcomes = [exc] * len(group)
                for (_, future), outcome in zip(group, outcomes, strict=True):
                    if future.done():
                        continue  # its caller stopped waiting
                    if isinstance(outcome, BaseException):
                        future.set_exception(outcome)
                    else:
                        future.set_result(outcome)
        except asyncio.CancelledError:
            # The loop is going away: nobody is left waiting for ever.
            for _, future in self._waiting:
                future.cancel()
            self._waiting = []
            raise



class GroupWrite(Gathered):
    """Writes of many connections in one database call (see the module)."""

    def __init__(self, write_many: WriteMany, *, name: str = "") -> None:
        async def send_many(writes: list[dict]) -> list[Any]:
            return await db_call(write_many, writes)

        super().__init__(send_many, name=name)

    async def write(self, **arguments) -> None:
        """Write with the group on its way next; raises what that write raised.
        As with ``db_call``: a caller cancelled before its write left is not
        written; once it left, it lands (or not) whole with its group."""
        await self.ask(**arguments)
