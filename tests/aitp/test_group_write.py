"""Writes of many connections that go together (runtime.group_write): live rows
(store.current().sessions_write_live) and turn checkpoints
(store.current().turn_checkpoints). Writes asked for while one is on its way go in
one call; a write the database refuses fails alone."""
from __future__ import annotations

import asyncio
import threading

import pytest
from django.db import connection

from aitp import store
from aitp.models import DailyUsage, Session
from runtime.group_write import GroupWrite
from tests.aitp.conftest import open_session_row, queries_sent

# A bound against a hang only.
PATIENCE = 10

# The writes run on the database threads, which tidy their connection
# around each call.
pytestmark = pytest.mark.django_db(transaction=True)


class HeldFirstCall:
    """A GroupWrite whose first call is held on its database thread until
    ``let_go()``; ``calls`` lists the names each call wrote."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []
        self.taken, self.may_end = threading.Event(), threading.Event()
        self.group = GroupWrite(self.write_many)

    def write_many(self, writes):
        self.calls.append([write["name"] for write in writes])
        if len(self.calls) == 1:
            self.taken.set()
            self.may_end.wait(PATIENCE)
        return [None] * len(writes)

    async def first_on_its_way(self) -> asyncio.Future:
        first = asyncio.ensure_future(self.group.write(name="a"))
        await asyncio.wait_for(asyncio.to_thread(self.taken.wait, PATIENCE), PATIENCE)
        return first

    def let_go(self) -> None:
        self.may_end.set()


async def test_writes_asked_for_while_one_is_on_its_way_go_in_one_call():
    held = HeldFirstCall()
    first = await held.first_on_its_way()
    later = [asyncio.ensure_future(held.group.write(name=name)) for name in ("b", "c")]
    await asyncio.sleep(0)
    held.let_go()
    await asyncio.wait_for(asyncio.gather(first, *later), PATIENCE)
    assert held.calls == [["a"], ["b", "c"]]


async def test_a_write_that_fails_raises_for_its_caller_only():
    def write_many(writes):
        return [ValueError(write["name"]) if write["name"] == "bad" else None for write in writes]

    group = GroupWrite(write_many)
    outcomes = await asyncio.wait_for(asyncio.gather(
        group.write(name="good"), group.write(name="bad"), return_exceptions=True), PATIENCE)
    assert outcomes[0] is None
    assert isinstance(outcomes[1], ValueError)


def test_a_value_the_database_refuses_fails_its_own_write_and_the_others_land():
    good, bad = open_session_row(), open_session_row()
    outcomes = store.current().sessions_write_live([
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


def test_on_postgresql_the_writes_of_a_group_are_one_query():
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL only (the second test pass)")
    sessions = [open_session_row() for _ in range(3)]
    with queries_sent() as sent:
        outcomes = store.current().sessions_write_live(
            [{"session_id": session.id, "state": "thinking"} for session in sessions])
    assert outcomes == [None, None, None]
    assert len(sent) == 1
    assert Session.objects.filter(pk__in=[s.id for s in sessions], state="thinking").count() == 3


def _checkpoint(session, seq: int, role: str = "user") -> dict:
    return {"session_id": session.id, "tenant_id": session.tenant_id, "turn": 1,
            "messages": [{"seq": seq, "role": role, "content": [{"type": "text", "text": "hi"}]}],
            "usage": {"turns": 1, "input_tokens": 10, "output_tokens": 5}}


def test_turn_checkpoints_written_together_land_with_their_usage_counted_once():
    first, second = open_session_row(), open_session_row()
    outcomes = store.current().turn_checkpoints([_checkpoint(first, 1), _checkpoint(second, 1)])
    assert outcomes == [None, None]
    store.current().usage_flush()
    for session in (first, second):
        row = Session.objects.get(pk=session.pk)
        assert [m.seq for m in row.messages.all()] == [1]
        assert (row.input_tokens, row.output_tokens) == (10, 5)
    assert sum(u.input_tokens for u in DailyUsage.objects.filter(
        tenant_id__in=[first.tenant_id, second.tenant_id])) == 20


def test_a_turn_checkpoint_the_database_refuses_fails_alone_and_counts_no_usage():
    good, bad = open_session_row(), open_session_row()
    outcomes = store.current().turn_checkpoints([_checkpoint(good, 1), _checkpoint(bad, 1, role="\ud800")])
    assert outcomes[0] is None and outcomes[1] is not None
    store.current().usage_flush()
    assert Session.objects.get(pk=good.pk).messages.count() == 1
    assert Session.objects.get(pk=bad.pk).messages.count() == 0
    assert Session.objects.get(pk=bad.pk).input_tokens == 0
    assert not DailyUsage.objects.filter(tenant_id=bad.tenant_id, input_tokens__gt=0).exists()


async def test_a_write_whose_caller_stopped_waiting_before_it_left_is_not_sent():
    held = HeldFirstCall()
    first = await held.first_on_its_way()
    withdrawn = asyncio.ensure_future(held.group.write(name="withdrawn"))
    kept = asyncio.ensure_future(held.group.write(name="kept"))
    await asyncio.sleep(0)
    withdrawn.cancel()
    held.let_go()
    await asyncio.wait_for(asyncio.gather(first, kept), PATIENCE)
    assert held.calls == [["a"], ["kept"]]



def test_sessions_closed_together_each_end_with_their_own_code():
    first, second = open_session_row(), open_session_row()
    outcomes = store.current().sessions_close([
        {"session_id": first.id, "code": 1000, "reason": "bye"},
        {"session_id": second.id, "code": 1001, "reason": "going away"},
    ])
    assert outcomes == [None, None]
    rows = {row.id: row for row in Session.objects.filter(pk__in=[first.id, second.id])}
    assert [(rows[s.id].ended_at is not None, rows[s.id].close_code) for s in (first, second)] == [
        (True, 1000), (True, 1001)]


def test_a_close_carrying_the_last_live_values_writes_them_and_ends_the_row():
    session = open_session_row()
    outcomes = store.current().sessions_close([{
        "session_id": session.id, "code": 1000, "reason": "bye",
        "live": {"snapshot": {"url": "/cart", "title": "Cart", "context": {"n": 1}, "tools": []},
                 "state": "idle", "visits": [{"url": "/cart", "title": "Cart", "at": "t"}]},
    }])
    assert outcomes == [None]
    row = Session.objects.get(pk=session.pk)
    assert (row.current_url, row.context, row.close_code) == ("/cart", {"n": 1}, 1000)
    assert row.ended_at is not None and [v["url"] for v in row.page_history] == ["/cart"]


def test_a_close_whose_last_live_values_the_database_refuses_still_ends_the_row():
    good, bad = open_session_row(), open_session_row()
    outcomes = store.current().sessions_close([
        {"session_id": good.id, "code": 1000, "live": {
            "snapshot": {"url": "/cart", "title": "Cart", "context": {}, "tools": []}}},
        # A lone surrogate: valid in a Python string, refused on its way to UTF-8.
        {"session_id": bad.id, "code": 1001, "live": {
            "snapshot": {"url": "/x", "title": "\ud800", "context": {}, "tools": []}}},
    ])
    assert outcomes == [None, None]
    rows = {row.id: row for row in Session.objects.filter(pk__in=[good.id, bad.id])}
    assert (rows[good.id].current_url, rows[good.id].close_code) == ("/cart", 1000)
    assert rows[bad.id].close_code == 1001 and rows[bad.id].ended_at is not None
    assert rows[bad.id].current_url != "/x"


def test_a_close_carrying_live_values_without_new_visits_is_one_statement():
    session = open_session_row()
    with queries_sent() as sent:
        outcomes = store.current().sessions_close([{
            "session_id": session.id, "code": 1000,
            "live": {"snapshot": {"url": "/cart", "title": "Cart", "context": {}, "tools": []},
                     "state": "idle"}}])
    assert outcomes == [None] and len(sent) == 1
    row = Session.objects.get(pk=session.pk)
    assert (row.current_url, row.state, row.close_code) == ("/cart", Session.State.ENDED, 1000)
