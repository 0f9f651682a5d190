"""The live rows of many connections written together (aitp.group_write and
services.sessions_write_live): writes asked for while one is on its way go
in one call; a write the database refuses fails alone."""
from __future__ import annotations

import asyncio
import threading

import pytest
from django.db import connection

from aitp import services
from aitp.group_write import GroupWrite
from aitp.models import Session
from tests.aitp.conftest import open_session_row, queries_sent

# A bound against a hang only.
PATIENCE = 10


async def test_writes_asked_for_while_one_is_on_its_way_go_in_one_call():
    calls: list[list[str]] = []
    first_taken, first_may_end = threading.Event(), threading.Event()

    def write_many(writes):
        calls.append([write["name"] for write in writes])
        if len(calls) == 1:
            first_taken.set()
            first_may_end.wait(PATIENCE)
        return [None] * len(writes)

    group = GroupWrite(write_many)
    first = asyncio.ensure_future(group.write(name="a"))
    await asyncio.wait_for(asyncio.to_thread(first_taken.wait, PATIENCE), PATIENCE)
    later = [asyncio.ensure_future(group.write(name=name)) for name in ("b", "c")]
    await asyncio.sleep(0)
    first_may_end.set()
    await asyncio.wait_for(asyncio.gather(first, *later), PATIENCE)
    assert calls == [["a"], ["b", "c"]]


async def test_a_write_that_fails_raises_for_its_caller_only():
    def write_many(writes):
        return [ValueError(write["name"]) if write["name"] == "bad" else None for write in writes]

    group = GroupWrite(write_many)
    outcomes = await asyncio.wait_for(asyncio.gather(
        group.write(name="good"), group.write(name="bad"), return_exceptions=True), PATIENCE)
    assert outcomes[0] is None
    assert isinstance(outcomes[1], ValueError)


@pytest.mark.django_db(transaction=True)
def test_a_value_the_database_refuses_fails_its_own_write_and_the_others_land():
    good, bad = open_session_row(), open_session_row()
    outcomes = services.sessions_write_live([
        {"session_id": good.id, "state": "thinking",
         "snapshot": {"url": "/cart", "title": "Cart", "context": {"n": 1}, "tools": []}},
        # A lone surrogate: valid in a Python string, refused on its way to UTF-8.
        {"session_id": bad.id, "state": "thinking",
         "snapshot": {"url": "/x", "title": "\ud800", "context": {}, "tools": []}},
    ])
    assert outcomes[0] is None and outcomes[1] is not None
    rows = {row.id: row for row in Session.objects.filter(pk__in=[good.id, bad.id])}
    assert (rows[good.id].current_url, rows[good.id].state) == ("/cart", "thinking")
    assert rows[bad.id].current_url != "/x"


@pytest.mark.django_db(transaction=True)
def test_on_postgresql_the_writes_of_a_group_are_one_query():
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL only (the second test pass)")
    sessions = [open_session_row() for _ in range(3)]
    with queries_sent() as sent:
        outcomes = services.sessions_write_live(
            [{"session_id": session.id, "state": "thinking"} for session in sessions])
    assert outcomes == [None, None, None]
    assert len(sent) == 1
    assert Session.objects.filter(pk__in=[s.id for s in sessions], state="thinking").count() == 3
