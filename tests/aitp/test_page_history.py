"""A live session's page history: visits appended in order, the oldest
dropped past the limit, a closed session left alone; appended and trimmed
by the database, in one statement."""
from __future__ import annotations

import json

import pytest

from aitp import store
from aitp.models import Session
from aitp.store import port
from aitp.store.statements import JsonText
from tests.aitp.conftest import open_session_row, queries_sent

pytestmark = pytest.mark.django_db(transaction=True)


def visit(url: str) -> dict:
    return {"url": url, "title": f"Page {url} ünïcode", "at": "2026-12-01T10:00:00+00:00"}


def history(session: Session) -> list[str]:
    return [entry["url"] for entry in Session.objects.get(pk=session.pk).page_history]


def test_visits_are_appended_in_order_with_the_snapshot_and_state():
    session = open_session_row()
    snapshot = {"url": "/b", "title": "B", "context": {"cart": 1}, "tools": []}
    store.current().session_write_live(session_id=session.id, visits=[visit("/a")])
    store.current().session_write_live(session_id=session.id, snapshot=snapshot, state="thinking",
                                visits=[visit("/b"), visit("/c")])
    assert history(session) == ["/a", "/b", "/c"]
    row = Session.objects.get(pk=session.pk)
    assert (row.current_url, row.context, row.state) == ("/b", {"cart": 1}, "thinking")
    assert row.page_history[0] == visit("/a")


def test_the_oldest_visits_are_dropped_past_the_limit(monkeypatch):
    monkeypatch.setattr(port, "PAGE_HISTORY_LIMIT", 3)
    session = open_session_row()
    store.current().session_write_live(session_id=session.id, visits=[visit("/1"), visit("/2")])
    store.current().session_write_live(session_id=session.id,
                                visits=[visit("/3"), visit("/4"), visit("/5")])
    assert history(session) == ["/3", "/4", "/5"]


def test_a_closed_session_keeps_its_history():
    session = open_session_row()
    store.current().session_write_live(session_id=session.id, visits=[visit("/a")])
    store.current().session_close(session_id=session.id, code=1000)
    store.current().session_write_live(session_id=session.id, visits=[visit("/late")])
    assert history(session) == ["/a"]


def test_more_visits_than_one_statement_appends_keep_their_order_and_the_limit(monkeypatch):
    monkeypatch.setattr(port, "PAGE_HISTORY_LIMIT", 12)
    session = open_session_row()
    store.current().session_write_live(session_id=session.id, visits=[visit("/0")])
    store.current().session_write_live(session_id=session.id,
                                visits=[visit(f"/{n}") for n in range(1, 21)])
    assert history(session) == [f"/{n}" for n in range(9, 21)]


def test_a_visit_is_one_statement():
    session = open_session_row()
    with queries_sent() as sent:
        store.current().session_write_live(session_id=session.id, visits=[visit("/a")])
    assert len(sent) == 1 and sent[0].startswith("UPDATE")
    assert history(session) == ["/a"]


def test_tools_written_as_json_text_are_stored_as_the_json_they_are():
    session = open_session_row()
    tools = [{"name": "zoom", "description": "Zoom ünï 😀", "risk": "none"}]
    text = json.dumps(tools, separators=(",", ":"), ensure_ascii=False)
    snapshot = {"url": "/z", "title": "Z", "context": {}, "tools": JsonText(text)}
    store.current().session_write_live(session_id=session.id, snapshot=snapshot)
    assert Session.objects.get(pk=session.pk).tools == tools
