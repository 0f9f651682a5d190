"""A turn's checkpoint reaches the database as one transaction
(``statements.together``): on PostgreSQL in one query, so one round trip;
all of its statements land or none does, on both backends."""
from __future__ import annotations

import secrets

import pytest
from django.db import IntegrityError, connection
from django.utils import timezone

from aitp import store
from aitp.models import ConversationMessage, Session, ToolCall
from aitp.store import statements
from tests.aitp.conftest import open_session_row, queries_sent

pytestmark = pytest.mark.django_db(transaction=True)


def call(call_id: str | None = None) -> dict:
    return {"call_id": call_id or f"call_{secrets.token_hex(6)}", "tool_use_id": "toolu_1",
            "name": "add_to_cart", "arguments": {"quantity": 1}, "risk": "low",
            "origin": "client", "created_at": timezone.now()}


def message(seq: int) -> dict:
    return {"seq": seq, "role": "user", "content": [{"type": "text", "text": "hello"}]}


def test_a_checkpoint_with_outcomes_messages_calls_and_usage_is_one_query_on_postgresql():
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL only (the second test pass)")
    session = open_session_row()
    first = call()
    store.current().turn_checkpoint(session_id=session.id, tenant_id=session.tenant_id, turn=1,
                             messages=[message(1)], calls=[first])
    with queries_sent() as sent:
        store.current().turn_checkpoint(
            session_id=session.id, tenant_id=session.tenant_id, turn=1,
            messages=[message(2), message(3)], calls=[call()],
            usage={"turns": 1, "input_tokens": 10, "output_tokens": 5},
            finished=[{"call_id": first["call_id"], "status": "success", "result": {"ok": 1},
                       "created_at": first["created_at"]}],
        )
    # The tenant's day is counted apart (written behind; at once in the tests).
    checkpoint = [sql for sql in sent if "aitp_dailyusage" not in sql]
    assert len(checkpoint) == 1
    for table in ("aitp_toolcall", "aitp_conversationmessage", "aitp_session"):
        assert table in checkpoint[0]
    assert ToolCall.objects.get(call_id=first["call_id"]).status == "success"
    assert ConversationMessage.objects.filter(session_id=session.id).count() == 3
    assert ToolCall.objects.filter(session_id=session.id).count() == 2
    row = Session.objects.get(pk=session.id)
    assert (row.turns, row.input_tokens, row.output_tokens) == (1, 10, 5)


def test_a_checkpoint_whose_last_statement_fails_leaves_none_of_its_rows():
    session = open_session_row()
    with pytest.raises(IntegrityError):
        # The calls belong to no session: the foreign key fails at commit.
        with statements.together():
            statements.messages_insert(session_id=session.id, turn=1, messages=[message(1)],
                                       now=timezone.now())
            statements.session_usage_add(session_id=session.id, now=timezone.now(),
                                         amounts={"turns": 1})
            statements.calls_insert(session_id="ses_nobody", turn=1, calls=[call()],
                                    now=timezone.now())
    assert not ConversationMessage.objects.filter(session_id=session.id).exists()
    assert Session.objects.get(pk=session.id).turns == 0


def test_an_error_raised_inside_the_block_writes_nothing():
    session = open_session_row()
    with pytest.raises(RuntimeError), statements.together():
        statements.messages_insert(session_id=session.id, turn=1, messages=[message(1)],
                                   now=timezone.now())
        raise RuntimeError("the turn stopped half way")
    assert not ConversationMessage.objects.filter(session_id=session.id).exists()


def test_an_outcome_that_reads_its_call_first_still_lands_in_the_checkpoint():
    session = open_session_row()
    recorded = call()
    store.current().tool_calls_record(session_id=session.id, turn=1, calls=[recorded])
    store.current().turn_checkpoint(
        session_id=session.id, tenant_id=session.tenant_id, turn=1, messages=[message(1)],
        finished=[{"call_id": recorded["call_id"], "status": "error", "error": "out of stock"}],
    )
    row = ToolCall.objects.get(call_id=recorded["call_id"])
    assert (row.status, row.error) == ("error", "out of stock")
    assert row.duration_ms is not None and row.finished_at is not None


def test_a_block_inside_a_transaction_runs_its_statements_at_once():
    from django.db import transaction

    session = open_session_row()
    with transaction.atomic(), statements.together():
        statements.messages_insert(session_id=session.id, turn=1, messages=[message(1)],
                                   now=timezone.now())
        assert ConversationMessage.objects.filter(session_id=session.id).count() == 1


def test_a_block_inside_another_goes_with_it():
    session = open_session_row()
    with pytest.raises(IntegrityError):
        with statements.together():
            with statements.together():
                statements.messages_insert(session_id=session.id, turn=1, messages=[message(1)],
                                           now=timezone.now())
            statements.calls_insert(session_id="ses_nobody", turn=1, calls=[call()],
                                    now=timezone.now())
    assert not ConversationMessage.objects.filter(session_id=session.id).exists()


TRICKY = "50% off, %s and %(name)s; 'quoted' \"twice\"; -- \\ back; DROP TABLE x; ünïcödé ✓"


def test_values_with_percent_signs_quotes_and_sql_in_them_are_stored_as_they_are():
    first, second = open_session_row(), open_session_row()
    tricky_call = call() | {"arguments": {"note": TRICKY, "n": None, "pi": 3.25}}
    outcomes = store.current().turn_checkpoints([
        {"session_id": session.id, "tenant_id": session.tenant_id, "turn": 1,
         "messages": [{"seq": 1, "role": "user", "content": [{"type": "text", "text": TRICKY}]}],
         "calls": [tricky_call] if session is first else []}
        for session in (first, second)])
    assert outcomes == [None, None]
    for session in (first, second):
        stored = ConversationMessage.objects.get(session_id=session.id, seq=1)
        assert stored.content == [{"type": "text", "text": TRICKY}]
    assert ToolCall.objects.get(call_id=tricky_call["call_id"]).arguments == {
        "note": TRICKY, "n": None, "pi": 3.25}


def test_on_postgresql_a_block_goes_with_its_values_bound_and_no_parameters():
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL only (the second test pass)")
    sessions = [open_session_row() for _ in range(2)]
    sent: list[tuple] = []

    def wrapper(execute, sql, params, many, context):
        sent.append((sql, params))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(wrapper):
        store.current().sessions_write_live([{"session_id": s.id, "state": "thinking"} for s in sessions])
    [(sql, params)] = sent
    assert params is None
    assert all(f"'{s.id}'" in sql for s in sessions)
