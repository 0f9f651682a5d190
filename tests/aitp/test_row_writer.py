"""The session row written behind its connection (aitp.row_writer): at most
one write per interval, the open counting as the first, and what is owed at
the end handed to the close."""
from __future__ import annotations

import asyncio
from types import SimpleNamespace

from aitp import row_writer
from aitp.row_writer import SessionRowWriter

# A bound against a hang only.
PATIENCE = 10


class Feed:
    def __init__(self) -> None:
        self.events: list[tuple] = []

    def session_changed(self, what: str, **fields) -> None:
        self.events.append((what, fields))


def a_writer(monkeypatch, interval: float):
    writes: list[dict] = []
    release = asyncio.Event()
    release.set()

    async def write(**arguments):
        writes.append(arguments)
        await release.wait()

    monkeypatch.setattr(row_writer, "ROW_WRITE_INTERVAL", interval)
    monkeypatch.setattr(row_writer, "LIVE_ROWS", SimpleNamespace(write=write))
    writer = SessionRowWriter(own=lambda task, what: task)
    feed = Feed()
    writer.open("ses_rows", feed)
    return writer, writes, release, feed


async def _until(condition) -> None:
    async def poll():
        while not condition():
            await asyncio.sleep(0.01)
    await asyncio.wait_for(poll(), PATIENCE)


async def test_a_session_waiting_for_its_next_write_holds_a_timer_and_no_task(monkeypatch):
    writer, writes, _, _ = a_writer(monkeypatch, interval=3600)
    writer.state_changed("thinking")
    assert writer._timer is not None and writer._task is None and writes == []
    owed = await writer.finish()
    assert owed == {"snapshot": None, "state": "thinking", "visits": []}
    assert writer._timer is None and writes == []


async def test_a_change_owed_while_a_write_is_on_its_way_is_written_after_it(monkeypatch):
    writer, writes, release, feed = a_writer(monkeypatch, interval=0)
    release.clear()
    writer.state_changed("thinking")
    await _until(lambda: len(writes) == 1)
    writer.state_changed("waiting_tool")
    await asyncio.sleep(0)
    assert len(writes) == 1
    release.set()
    await _until(lambda: len(writes) == 2)
    assert [write["state"] for write in writes] == ["thinking", "waiting_tool"]
    assert await writer.finish() is None
    assert [fields["state"] for what, fields in feed.events if what == "state"] == [
        "thinking", "waiting_tool"]


async def test_what_is_owed_when_the_connection_ends_comes_back_after_the_write_on_its_way(
        monkeypatch):
    writer, writes, release, _ = a_writer(monkeypatch, interval=0)
    release.clear()
    writer.state_changed("thinking")
    await _until(lambda: len(writes) == 1)
    writer.state_changed("idle")
    finishing = asyncio.ensure_future(writer.finish())
    await asyncio.sleep(0)
    assert not finishing.done()
    release.set()
    owed = await asyncio.wait_for(finishing, PATIENCE)
    assert owed["state"] == "idle" and len(writes) == 1
