"""The session store's promises (``aitp.store.port``), kept alike by the
plain store (ORM, one transaction each) and the fast one the server runs
(statements built once, writes grouped, the day's usage written behind):
every test here runs against both, on both databases."""
from __future__ import annotations

import secrets
from dataclasses import replace
from datetime import timedelta

import pytest
from django.utils import timezone

from aitp import resume, store, tenancy
from aitp.models import ApiKey, ConversationMessage, DailyUsage, Session, ToolCall
from aitp.store import HandshakeInfo, port, usage
from aitp.store.fast import FastStore
from aitp.store.plain import PlainStore
from aitp.store.statements import JsonText
from tests.aitp.conftest import ORIGIN

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(params=["plain", "fast"])
def sessions(request, settings, monkeypatch) -> port.SessionStore:
    settings.OWLLAYER_USAGE_FLUSH_INTERVAL = 3600  # the fast store's day waits for a flush
    monkeypatch.setattr(usage, "_usage", usage.UsageBuffer())
    settings.OWLLAYER_STORE = request.param
    return store.current()


@pytest.fixture
def key(db):
    tenant = tenancy.tenant_create(slug=f"t{secrets.token_hex(4)}", name="Shop")
    key, raw = tenancy.key_create(tenant=tenant, allowed_origins=[ORIGIN], max_sessions=2)
    key.raw = raw
    return key


def handshake(origin: str = ORIGIN) -> HandshakeInfo:
    return HandshakeInfo(
        session_id=f"ses_{secrets.token_hex(6)}", origin=origin, user_agent="pytest",
        viewport="1x1", sdk_version="0.4.0", protocol_version="1.0.0",
        channel_name=f"test.{secrets.token_hex(4)}",
    )


def day(sessions: port.SessionStore, tenant_id: int) -> dict:
    sessions.usage_flush()
    row = DailyUsage.objects.filter(tenant_id=tenant_id).first()
    return {} if row is None else {name: getattr(row, name) for name in ("sessions", "turns",
                                                                        "input_tokens", "output_tokens")}


def opened(sessions: port.SessionStore, key: ApiKey) -> Session:
    session, refusal = sessions.session_open(raw_key=key.raw, info=handshake())
    assert refusal is None
    return session


def call(call_id: str) -> dict:
    return {"call_id": call_id, "tool_use_id": f"toolu_{call_id}", "name": "add_to_cart",
            "arguments": {"quantity": 2}, "risk": "low", "origin": "client"}


# --- the open -------------------------------------------------------------------


def test_an_open_stores_the_handshake_and_counts_the_tenants_day(sessions, key):
    info = handshake()
    session, refusal = sessions.session_open(raw_key=key.raw, info=info)
    assert refusal is None and session.tenant.pk == key.tenant_id
    row = Session.objects.get(pk=info.session_id)
    assert (row.api_key_id, row.origin, row.channel_name, row.ended_at) == (
        key.pk, ORIGIN, info.channel_name, None)
    assert day(sessions, key.tenant_id)["sessions"] == 1
    key.refresh_from_db()
    assert key.last_used_at == row.started_at


def test_an_open_past_the_keys_cap_is_refused_and_leaves_no_row(sessions, key):
    opened(sessions, key)
    opened(sessions, key)
    session, refusal = sessions.session_open(raw_key=key.raw, info=handshake())
    assert session is None and refusal.code == "session_limit"
    assert Session.objects.filter(api_key=key).count() == 2
    assert day(sessions, key.tenant_id)["sessions"] == 2


def test_a_wrong_secret_a_revoked_key_and_a_foreign_origin_are_refused(sessions, key):
    assert sessions.session_open(raw_key=key.raw[:-1] + "?", info=handshake())[1].code == \
        "invalid_api_key"
    assert sessions.session_open(raw_key=key.raw, info=handshake("https://evil.example"))[1].code \
        == "origin_not_allowed"
    tenancy.key_revoke(key=key)
    assert sessions.session_open(raw_key=key.raw, info=handshake())[1].code == "api_key_revoked"
    assert not Session.objects.exists()


CONSOLE = "https://console.example"


def previewing(key: ApiKey, vouched: int | None = None) -> HandshakeInfo:
    """A console page's open, of an origin the key does not allow, with a
    good preview ticket naming ``vouched`` (this key by default)."""
    return replace(handshake(CONSOLE), preview_key_id=key.pk if vouched is None else vouched)


def test_a_preview_of_a_key_opens_from_the_consoles_origin_which_the_key_does_not_allow(sessions, key):
    session, refusal = sessions.session_open(raw_key=key.raw, info=previewing(key))
    assert refusal is None
    assert Session.objects.get(pk=session.pk).origin == CONSOLE


def test_a_preview_ticket_of_another_key_leaves_this_keys_origins_to_decide(sessions, key):
    other, _ = tenancy.key_create(tenant=key.tenant, allowed_origins=[ORIGIN])
    assert sessions.session_open(raw_key=key.raw, info=previewing(key, other.pk))[1].code == \
        "origin_not_allowed"
    assert not Session.objects.exists()


@pytest.mark.parametrize("change, code", [
    ({"status": ApiKey.Status.REVOKED}, "api_key_revoked"),
    ({"status": ApiKey.Status.DISABLED}, "api_key_disabled"),
    ({"expires_at": timezone.now() - timedelta(minutes=1)}, "api_key_expired"),
], ids=["revoked", "disabled", "expired"])
def test_a_preview_of_a_key_that_cannot_be_used_is_refused_with_its_reason(sessions, key, change, code):
    ApiKey.objects.filter(pk=key.pk).update(**change)
    assert sessions.session_open(raw_key=key.raw, info=previewing(key))[1].code == code
    assert not Session.objects.exists()


def test_a_preview_takes_a_slot_of_its_keys_cap(sessions, key):
    opened(sessions, key)
    assert sessions.session_open(raw_key=key.raw, info=previewing(key))[1] is None  # the cap is 2
    assert sessions.session_open(raw_key=key.raw, info=previewing(key))[1].code == "session_limit"


def test_a_preview_session_whose_socket_dropped_is_continued_from_the_console(sessions, key):
    first = previewing(key)
    token = resume.new_token(first.session_id)
    session, _ = sessions.session_open(raw_key=key.raw, info=replace(first, resume_token_hash=token.secret_hash))
    sessions.session_close(session_id=session.id, code=1001, reason="client disconnected")
    following = resume.new_token(token.session_id)
    info = replace(previewing(key), session_id=token.session_id, resume_token_hash=following.secret_hash)

    outcome = sessions.session_resume(raw_key=key.raw, token=token, next_hash=following.secret_hash,
                                      info=info, window=600)
    unvouched = sessions.session_resume(raw_key=key.raw, token=following, next_hash="x" * 64,
                                        info=replace(info, preview_key_id=None), window=600)

    assert outcome.session.id == session.id and outcome.refusal is None
    assert unvouched.refusal.code == "origin_not_allowed"


def test_a_closed_session_frees_its_slot(sessions, key):
    first = opened(sessions, key)
    opened(sessions, key)
    sessions.session_close(session_id=first.id, code=1000, reason="client disconnected")
    assert sessions.session_open(raw_key=key.raw, info=handshake())[1] is None


# --- continuing a session on a new socket ------------------------------------------


def resumable(sessions: port.SessionStore, key: ApiKey):
    """A session opened with a resume token, its socket closed: (row, token)."""
    info = handshake()
    token = resume.new_token(info.session_id)
    session, _ = sessions.session_open(raw_key=key.raw,
                                       info=replace(info, resume_token_hash=token.secret_hash))
    sessions.session_close(session_id=session.id, code=1001, reason="client disconnected")
    return session, token


def continued(sessions: port.SessionStore, key: ApiKey, token, *, window: float = 600):
    following = resume.new_token(token.session_id)
    info = replace(handshake(), session_id=token.session_id, resume_token_hash=following.secret_hash)
    return sessions.session_resume(raw_key=key.raw, token=token, next_hash=following.secret_hash,
                                   info=info, window=window), following


def test_a_closed_session_is_continued_once_with_its_token_and_not_counted_again_in_the_day(sessions, key):
    session, token = resumable(sessions, key)

    outcome, following = continued(sessions, key, token)
    again, _ = continued(sessions, key, token)

    assert outcome.session.id == session.id and outcome.refusal is None
    row = Session.objects.get(pk=session.pk)
    assert (row.ended_at, row.close_code, row.resumes, row.resume_token_hash) == (
        None, None, 1, following.secret_hash)
    assert again == port.NOT_RESUMABLE
    assert day(sessions, key.tenant_id)["sessions"] == 1


def test_a_continued_session_takes_a_slot_of_its_keys_cap_again(sessions, key):
    session, token = resumable(sessions, key)
    opened(sessions, key)
    opened(sessions, key)  # the cap is 2

    outcome, _ = continued(sessions, key, token)

    assert outcome.refusal.code == "session_limit"
    assert Session.objects.get(pk=session.pk).ended_at is not None


def test_a_session_whose_socket_is_open_is_not_continued_and_says_so(sessions, key):
    info = handshake()
    token = resume.new_token(info.session_id)
    sessions.session_open(raw_key=key.raw, info=replace(info, resume_token_hash=token.secret_hash))

    outcome, _ = continued(sessions, key, token)

    assert outcome.session is None and outcome.still_open


def test_a_session_closed_longer_ago_than_the_window_is_not_continued(sessions, key):
    session, token = resumable(sessions, key)
    Session.objects.filter(pk=session.pk).update(ended_at=timezone.now() - timedelta(seconds=61))

    outcome, _ = continued(sessions, key, token, window=60)

    assert outcome == port.NOT_RESUMABLE


def held(sessions: port.SessionStore, key: ApiKey, *, process: str | None = None):
    """A session opened with a resume token whose socket dropped while its
    process (``process``, this one by default) holds it: (row, token)."""
    info = handshake()
    token = resume.new_token(info.session_id)
    session, _ = sessions.session_open(raw_key=key.raw, info=replace(
        info, resume_token_hash=token.secret_hash, process=process or info.process))
    return session, token


LAST_SOCKET = {"closed_at": "2026-12-03T10:00:00+00:00", "code": 1006, "reason": "client disconnected"}


def continued_held(sessions: port.SessionStore, key: ApiKey, token):
    following = resume.new_token(token.session_id)
    info = replace(handshake(), session_id=token.session_id, resume_token_hash=following.secret_hash)
    return sessions.session_resume(raw_key=key.raw, token=token, next_hash=following.secret_hash,
                                   info=info, window=600, held=LAST_SOCKET), following


def test_a_session_this_process_holds_is_continued_once_and_its_dropped_socket_listed(sessions, key):
    session, token = held(sessions, key)
    Session.objects.filter(pk=session.pk).update(state=Session.State.ANSWERING)

    outcome, following = continued_held(sessions, key, token)
    again, _ = continued_held(sessions, key, token)

    assert outcome.session.id == session.id and outcome.refusal is None
    row = Session.objects.get(pk=session.pk)
    assert (row.ended_at, row.resumes, row.resume_token_hash, row.state) == (
        None, 1, following.secret_hash, Session.State.ANSWERING)
    assert [(s["code"], s["closed_at"]) for s in row.earlier_sockets] == [(1006, LAST_SOCKET["closed_at"])]
    assert again.session is None


def test_a_session_another_process_holds_is_not_continued_as_held(sessions, key):
    session, token = held(sessions, key, process="elsewhere:1:x")

    outcome, _ = continued_held(sessions, key, token)

    assert outcome.session is None and outcome.still_open
    assert Session.objects.get(pk=session.pk).resumes == 0


def test_a_held_session_past_its_keys_cap_is_refused_and_stays_as_it_was(sessions, key):
    session, token = held(sessions, key)
    opened(sessions, key)
    ApiKey.objects.filter(pk=key.pk).update(max_sessions=1)  # lowered while the session was held

    outcome, _ = continued_held(sessions, key, token)

    assert outcome.refusal.code == "session_limit"
    assert Session.objects.get(pk=session.pk).resumes == 0


# --- the live row and its close ---------------------------------------------------


def test_a_session_closes_once_and_keeps_its_first_close(sessions, key):
    session = opened(sessions, key)
    sessions.session_close(session_id=session.id, code=1000, reason="bye")
    sessions.session_close(session_id=session.id, code=1011, reason="later")
    row = Session.objects.get(pk=session.pk)
    assert (row.close_code, row.close_reason, row.state) == (1000, "bye", Session.State.ENDED)
    assert row.ended_at is not None and row.last_seen_at == row.ended_at


def test_a_live_write_sets_the_snapshot_the_state_and_appends_the_visits(sessions, key, monkeypatch):
    monkeypatch.setattr(port, "PAGE_HISTORY_LIMIT", 3)
    session = opened(sessions, key)
    visits = [{"url": f"/{n}", "title": "T", "at": "2026-12-01T10:00:00+00:00"} for n in range(4)]
    snapshot = {"url": "/3", "title": "Three", "context": {"cart": 1},
                "tools": JsonText('[{"name": "add_to_cart"}]')}
    sessions.session_write_live(session_id=session.id, visits=visits[:2])
    sessions.session_write_live(session_id=session.id, snapshot=snapshot, state="thinking",
                                visits=visits[2:])
    row = Session.objects.get(pk=session.pk)
    assert (row.current_url, row.title, row.context, row.state) == ("/3", "Three", {"cart": 1},
                                                                  "thinking")
    assert row.tools == [{"name": "add_to_cart"}]
    assert [visit["url"] for visit in row.page_history] == ["/1", "/2", "/3"]


def test_a_closed_session_is_left_as_it_is_by_a_late_live_write(sessions, key):
    session = opened(sessions, key)
    sessions.session_close(session_id=session.id, code=1000)
    sessions.session_write_live(session_id=session.id, state="thinking",
                                visits=[{"url": "/late", "title": "", "at": ""}])
    row = Session.objects.get(pk=session.pk)
    assert row.state == Session.State.ENDED and row.page_history == []


def test_a_close_carries_the_last_live_values_it_is_owed(sessions, key):
    session = opened(sessions, key)
    live = {"snapshot": {"url": "/cart", "title": "Cart", "context": {}, "tools": []},
            "state": "idle", "visits": []}
    assert sessions.sessions_close([{"session_id": session.id, "code": 1000, "reason": "",
                                     "live": live}]) == [None]
    row = Session.objects.get(pk=session.pk)
    assert (row.current_url, row.close_code, row.state) == ("/cart", 1000, Session.State.ENDED)


# --- the turn's writes ---------------------------------------------------------------


def test_a_checkpoint_writes_its_messages_calls_and_usage_and_is_idempotent_but_for_usage(
        sessions, key):
    session = opened(sessions, key)
    checkpoint = {
        "session_id": session.id, "tenant_id": key.tenant_id, "turn": 1,
        "messages": [{"seq": 0, "role": "user", "content": [{"type": "text", "text": "hi"}]}],
        "calls": [call("c1")], "usage": {"turns": 1, "input_tokens": 10, "output_tokens": 4},
        "counted": {"input_tokens": 10, "output_tokens": 0},
    }
    sessions.turn_checkpoint(**checkpoint)
    sessions.turn_checkpoint(**checkpoint)
    assert ConversationMessage.objects.filter(session=session).count() == 1
    assert list(ToolCall.objects.filter(session=session).values_list("call_id", "status")) == [
        ("c1", ToolCall.Status.PENDING)]
    row = Session.objects.get(pk=session.pk)
    assert (row.turns, row.input_tokens, row.output_tokens) == (2, 20, 8)
    counted = day(sessions, key.tenant_id)
    assert (counted["turns"], counted["input_tokens"], counted["output_tokens"]) == (2, 0, 8)


def test_a_mark_moves_an_open_call_and_never_undoes_a_final_status(sessions, key):
    session = opened(sessions, key)
    sessions.tool_calls_record(session_id=session.id, turn=1, calls=[call("c1"), call("c2")])
    sessions.tool_call_marks([{"call_id": "c1", "status": "sent", "sent": True}])
    sessions.tool_call_finish(call_id="c2", status="success", result={"ok": True})
    sessions.tool_call_mark(call_id="c2", status="running")
    c1, c2 = ToolCall.objects.filter(session=session).order_by("call_id")
    assert c1.status == "sent" and c1.sent_at is not None
    assert (c2.status, c2.result) == ("success", {"ok": True}) and c2.finished_at is not None


def test_a_call_ends_once_and_keeps_the_time_it_was_sent(sessions, key):
    session = opened(sessions, key)
    created = timezone.now() - timedelta(seconds=2)
    sessions.tool_calls_record(session_id=session.id, turn=1,
                               calls=[{**call("c1"), "created_at": created}])
    sent = timezone.now() - timedelta(seconds=1)
    sessions.tool_calls_finish([{"call_id": "c1", "status": "error", "error": "out of stock",
                                 "created_at": created, "sent_at": sent}])
    sessions.tool_call_finish(call_id="c1", status="success", result={"late": True})
    row = ToolCall.objects.get(call_id="c1")
    assert (row.status, row.error, row.result, row.sent_at) == ("error", "out of stock", None, sent)
    assert row.duration_ms >= 2000


def test_one_sessions_write_the_database_refuses_fails_alone(sessions, key):
    session = opened(sessions, key)
    message = {"seq": 0, "role": "user", "content": []}
    good = {"session_id": session.id, "tenant_id": key.tenant_id, "turn": 1, "messages": [message]}
    bad = {"session_id": "ses_gone", "tenant_id": key.tenant_id, "turn": 1, "messages": [message]}
    outcomes = sessions.turn_checkpoints([good, bad])
    assert outcomes[0] is None and isinstance(outcomes[1], Exception)
    assert ConversationMessage.objects.filter(session=session).count() == 1


@pytest.mark.parametrize(("name", "kind"), [("plain", PlainStore), ("fast", FastStore)])
def test_the_store_setting_names_the_store_the_server_writes_through(settings, name, kind):
    settings.OWLLAYER_STORE = name
    assert type(store.current()) is kind
