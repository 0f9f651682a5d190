"""The database path: the calls of different sessions run side by side,
connections are reused, and what a turn writes behind it lands in order."""
from __future__ import annotations

import asyncio
import secrets
import threading

import pytest
from django.db import connection

from agent.store import AgentStore
from aitp import store as session_store
from aitp.ledger import DISCONNECTED, SUCCESS, Outcome, PendingCall
from aitp.models import ConversationMessage, DailyUsage, Session, ToolCall
from runtime import db
from tests.aitp.conftest import open_session_row

# A bound against a hang only: a working path never comes near it.
PATIENCE = 30


@pytest.fixture
def two_database_threads(settings):
    db.shutdown()
    settings.OWLLAYER_DB_THREADS = 2
    yield
    db.shutdown()


async def test_the_database_calls_of_two_sessions_run_side_by_side(two_database_threads):
    # Each call waits for the other inside its thread: on one shared thread
    # the first would wait alone until the barrier breaks.
    meeting = threading.Barrier(2, timeout=PATIENCE)
    arrivals = await asyncio.gather(db.db_call(meeting.wait), db.db_call(meeting.wait))
    assert sorted(arrivals) == [0, 1]


async def test_a_database_call_returns_its_result_and_raises_its_error(two_database_threads):
    assert await db.db_call(divmod, 7, 2) == (3, 1)
    with pytest.raises(ZeroDivisionError):
        await db.db_call(divmod, 1, 0)


@pytest.mark.django_db
def test_sqlite_runs_in_write_ahead_log_mode():
    if connection.vendor != "sqlite":
        pytest.skip("SQLite only (the first test pass)")
    with connection.cursor() as cursor:
        cursor.execute("PRAGMA journal_mode")
        assert cursor.fetchone()[0] == "wal"


@pytest.mark.django_db
def test_postgresql_connections_come_from_the_pool(settings):
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL only (the second test pass)")
    assert connection.pool is not None
    assert connection.pool.max_size == settings.OWLLAYER_DB_POOL_MAX
    assert connection.settings_dict["CONN_MAX_AGE"] == 0


def _call(name: str = "add_to_cart") -> PendingCall:
    return PendingCall(call_id=f"call_{secrets.token_hex(6)}", tool_use_id=f"toolu_{name}",
                       name=name, args={"quantity": 1}, spec=None)


def _row(call_id: str) -> ToolCall:
    return ToolCall.objects.get(call_id=call_id)


@pytest.mark.django_db(transaction=True)
async def test_a_calls_sent_mark_and_outcome_land_in_order_with_the_next_checkpoint():
    session = await db.db_call(open_session_row)
    store = AgentStore(session_id=session.id, tenant_id=session.tenant_id)
    call = _call()
    await store.checkpoint(turn=1, messages=[{"seq": 1, "role": "user", "content": []}],
                           calls=[call])
    await store.mark_call(call, "sent", sent=True)
    await store.finish_call(call, Outcome(SUCCESS, result={"ok": True}))
    await store.checkpoint(turn=1, messages=[{"seq": 2, "role": "assistant", "content": []}])

    row = await db.db_call(_row, call.call_id)
    assert row.status == SUCCESS and row.result == {"ok": True}
    assert row.sent_at is not None and row.finished_at is not None
    assert row.sent_at <= row.finished_at
    assert row.duration_ms is not None
    assert row.duration_ms == int((row.finished_at - row.created_at).total_seconds() * 1000)
    seqs = await db.db_call(lambda: list(ConversationMessage.objects.filter(
        session_id=session.id).order_by("seq").values_list("seq", flat=True)))
    assert seqs == [1, 2]


@pytest.mark.django_db(transaction=True)
async def test_a_sent_mark_still_queued_when_the_page_answers_is_withdrawn_and_its_time_kept(
    settings, monkeypatch
):
    db.shutdown()
    settings.OWLLAYER_DB_THREADS = 1
    marks = []
    real_mark = session_store.current().tool_call_mark
    monkeypatch.setattr(session_store.current(), "tool_call_mark",
                        lambda **kwargs: (marks.append(kwargs), real_mark(**kwargs)))
    try:
        session = await db.db_call(open_session_row)
        store = AgentStore(session_id=session.id, tenant_id=session.tenant_id)
        call = _call()
        await store.checkpoint(turn=1, messages=[], calls=[call])
        # The one database thread is busy: the mark waits in its queue.
        busy = threading.Event()
        occupied = asyncio.ensure_future(db.db_call(busy.wait, PATIENCE))
        await store.mark_call(call, "sent", sent=True)
        await store.finish_call(call, Outcome(SUCCESS, result={"ok": True}))
        busy.set()
        await occupied
        await store.checkpoint(turn=1, messages=[{"seq": 1, "role": "user", "content": []}])
        row = await db.db_call(_row, call.call_id)
    finally:
        db.shutdown()
    assert marks == []
    assert row.status == SUCCESS and row.sent_at is not None
    assert row.sent_at <= row.finished_at


@pytest.mark.django_db(transaction=True)
async def test_a_late_progress_mark_never_undoes_a_final_status():
    session = await db.db_call(open_session_row)
    store = AgentStore(session_id=session.id, tenant_id=session.tenant_id)
    call = _call()
    await store.checkpoint(turn=1, messages=[], calls=[call])
    await store.finish_call(call, Outcome(DISCONNECTED, error="gone"))
    await store.flush()
    await store.mark_call(call, "sent", sent=True)
    await store.flush()  # waits for the mark
    assert (await db.db_call(_row, call.call_id)).status == DISCONNECTED


@pytest.mark.django_db(transaction=True)
async def test_an_approval_write_first_lands_the_outcomes_kept_behind():
    session = await db.db_call(open_session_row)
    store = AgentStore(session_id=session.id, tenant_id=session.tenant_id)
    first, second = _call("first"), _call("second")
    await store.checkpoint(turn=1, messages=[], calls=[first, second])
    await store.finish_call(first, Outcome(SUCCESS, result=1))
    # An approval row for the second call reads the ledger: the first call's
    # outcome is written before it.
    await store.approval_request_client(second, tool_name="second", args=second.args, message="ok?",
                                        timeout=PATIENCE)
    assert (await db.db_call(_row, first.call_id)).status == SUCCESS
    assert (await db.db_call(_row, second.call_id)).status == "awaiting_approval"


@pytest.mark.django_db(transaction=True)
async def test_a_turns_usage_is_added_to_the_session_and_the_day_once_per_checkpoint():
    from aitp.llm import Usage

    session = await db.db_call(open_session_row)
    store = AgentStore(session_id=session.id, tenant_id=session.tenant_id)
    for turn in (1, 2):
        await store.checkpoint(turn=turn, messages=[],
                               usage=Usage(input_tokens=10, output_tokens=5), turns=1)
    stored = await db.db_call(Session.objects.get, id=session.id)
    assert (stored.turns, stored.input_tokens, stored.output_tokens) == (2, 20, 10)
    day = await db.db_call(DailyUsage.objects.get, tenant_id=session.tenant_id)
    assert (day.sessions, day.turns, day.input_tokens, day.output_tokens) == (1, 2, 20, 10)
