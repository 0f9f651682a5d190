"""Hostile input against the pure core: any value of any field of any frame is
either accepted and storable everywhere it goes next, or answered with a
specific error code -- and the session machine never raises.

Runs without Django: protocol.py and session.py are pure.
"""
from __future__ import annotations

import json
import math
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aitp import protocol as p
from aitp.ledger import ERROR, SUCCESS, UNUSABLE_ERROR, checked_answer, checked_error, unusable_answer
from aitp.session import (
    ContextChanged,
    HandshakeRequested,
    Limits,
    SessionMachine,
    State,
    UserTextReceived,
)
from aitp.turn import TurnEvent
from tests.aitp.hostile import (
    HOSTILE_RETURNS,
    MORE_RETURNS,
    deep,
    encode,
    hostile_answer,
    hostile_frame,
    hostile_text,
    hostile_value,
    unstorable_codes,
)
from tests.wire import assert_client_accepts

KEY = "pk_live_abcdefgh12345678"
MAX = 1024 * 1024
ESCAPED_NUL = re.compile(r"(?:^|[^\\])(?:\\\\)*\\u0000")
# Every code a refused frame may carry; anything else is a bug.
KNOWN_CODES = {
    "invalid_json", "invalid_message", "invalid_text", "invalid_number", "too_deep",
    "unknown_type", "wrong_direction", "too_large",
}
HYPOTHESIS = settings(max_examples=100, deadline=None,
                      suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def assert_storable(value, *, max_depth: int = p.DEFAULT_MAX_DEPTH) -> None:
    """What SQLite JSON, PostgreSQL jsonb, UTF-8 and the model request need."""
    text = json.dumps(value, ensure_ascii=False, allow_nan=False)
    text.encode("utf-8")  # no lone surrogate
    # jsonb refuses U+0000, raw or as an escape (one not itself escaped).
    assert "\x00" not in text and not ESCAPED_NUL.search(text)
    assert p.find_unstorable(value, max_depth=max_depth) is None


def frame(type_: str, payload: dict, **envelope) -> str:
    return json.dumps({"id": "msg_1", "type": type_, "timestamp": 1, "payload": payload,
                       **envelope})


def opened(**limits) -> SessionMachine:
    m = SessionMachine(limits=Limits(**limits), server_version="0.4.0")
    [event] = m.receive_text(frame("HANDSHAKE_INIT", {"apiKey": KEY, "protocolVersion": "1.0.0"}))
    assert isinstance(event, HandshakeRequested)
    m.accept_handshake("ses_1")
    m.data_to_send()
    return m


def refusal(text: str) -> p.ProtocolError:
    with pytest.raises(p.ProtocolError) as caught:
        p.parse_client_frame(text, max_bytes=MAX)
    return caught.value


# --- properties ------------------------------------------------------------------------


@HYPOTHESIS
@given(hostile_frame(), st.booleans())
def test_any_frame_parses_to_storable_values_or_is_refused_with_a_known_code(frame_obj, ascii_only):
    text = encode(frame_obj, ascii_only=ascii_only)
    try:
        message = p.parse_client_frame(text, max_bytes=MAX)
    except p.ProtocolError as error:
        assert error.code in KNOWN_CODES
        assert error.message
        if error.message_id is not None:
            assert p.text_problem(error.message_id) is None
        return
    assert_storable(message.payload.model_dump(mode="python"))
    assert_storable({"id": message.id, "meta": message.meta})


@HYPOTHESIS
@given(st.lists(st.one_of(hostile_frame().map(encode), st.text(max_size=50)), max_size=12))
def test_the_session_machine_answers_any_sequence_of_frames_without_raising(texts):
    m = opened(max_invalid_frames=1000)
    for text in texts:
        for event in m.receive_text(text):
            if isinstance(event, ContextChanged):
                assert_storable({"url": event.url, "title": event.title, "context": event.context})
                assert_storable([tool.to_wire() for tool in event.tools])
            elif isinstance(event, UserTextReceived):
                assert_storable(event.text)
                m.turn.step(TurnEvent.DONE)
        for out in m.data_to_send():
            out.encode("utf-8")
            assert_client_accepts(out)
    assert m.state is State.OPEN


@HYPOTHESIS
@given(hostile_frame(types=("HANDSHAKE_INIT",)).map(encode))
def test_a_hostile_handshake_is_either_requested_or_refused_never_left_pending(text):
    m = SessionMachine(limits=Limits(), server_version="0.4.0", query_api_key=KEY)
    events = m.receive_text(text)
    if events:
        [event] = events
        assert isinstance(event, HandshakeRequested) and m.handshake_pending
        assert_storable(event.init.model_dump(mode="python"))
    else:
        assert not m.handshake_pending
    # Whatever happened, the deadline still ends a handshake that did not complete.
    m.handshake_timed_out()
    assert m.state is State.CLOSED


@HYPOTHESIS
@given(hostile_value())
def test_find_unstorable_never_raises_and_agrees_with_the_encoders(value):
    problem = p.find_unstorable(value)
    if problem is None:
        assert_storable(value)
    else:
        assert problem[0] in {"invalid_text", "invalid_number", "too_deep"}


@HYPOTHESIS
@given(hostile_answer())
def test_find_unstorable_refuses_whatever_json_cannot_write(value):
    problem = p.find_unstorable(value)
    if problem is None:
        assert_storable(value)
    else:
        assert problem[0] in {"invalid_text", "invalid_number", "too_deep", "invalid_value"}


# --- what a server tool answers -------------------------------------------------------


@HYPOTHESIS
@given(hostile_answer())
def test_any_tool_answer_is_used_as_it_is_only_when_every_later_layer_holds_it(value):
    outcome, refused = checked_answer(value, max_depth=p.DEFAULT_MAX_DEPTH)
    if refused is None:
        assert outcome.status == SUCCESS and outcome.result is value
        assert_storable(value, max_depth=p.DEFAULT_MAX_DEPTH - 2)
        outcome.content_for_model().encode("utf-8")
    else:
        assert refused in {"invalid_text", "invalid_number", "too_deep", "invalid_value"}
        assert (outcome.status, outcome.result) == (ERROR, None)
        assert outcome.error == unusable_answer(refused)
    # Whatever it was, what the model is told can be stored and sent.
    assert_storable(outcome.tool_result_block("toolu_1"))


@HYPOTHESIS
@given(hostile_answer(), st.sampled_from([None, 1, 2, 3, p.DEFAULT_MAX_DEPTH]))
def test_the_walk_names_values_that_are_not_json_exactly_when_the_rules_refuse_them(
        value, max_depth):
    named = p.find_unstorable(value, max_depth=max_depth)
    codes = unstorable_codes(value, max_depth)
    assert (named is None) is (not codes)
    assert named is None or named[0] in codes


@HYPOTHESIS
@given(hostile_text())
def test_a_tool_error_message_reaches_the_model_only_when_it_can_be_stored(text):
    told = checked_error(text)
    assert told == (text if p.text_problem(text) is None else UNUSABLE_ERROR)
    assert_storable(told)


@pytest.mark.parametrize("kind", sorted({**HOSTILE_RETURNS, **MORE_RETURNS}))
def test_each_hostile_return_value_is_refused_or_used_whole(kind):
    value = {**HOSTILE_RETURNS, **MORE_RETURNS}[kind]
    outcome, refused = checked_answer(value, max_depth=p.DEFAULT_MAX_DEPTH)
    if kind in ("good", "none"):
        assert (outcome.status, outcome.result, refused) == (SUCCESS, value, None)
    else:
        assert outcome.status == ERROR and refused is not None
        assert "internals" not in outcome.error


def test_an_answer_may_nest_as_deep_as_a_pages_result_in_its_frame_and_no_deeper():
    # A page's result is the third level of its frame.
    fits = deep(p.DEFAULT_MAX_DEPTH - 2, as_dict=True)
    assert checked_answer(fits, max_depth=p.DEFAULT_MAX_DEPTH)[1] is None
    page = frame("TOOL_RESULT", {"callId": "c", "status": "success", "result": fits})
    assert p.parse_client_frame(page, max_bytes=MAX).payload.result == fits
    over = deep(p.DEFAULT_MAX_DEPTH - 1, as_dict=True)
    assert checked_answer(over, max_depth=p.DEFAULT_MAX_DEPTH)[1] == "too_deep"
    assert refusal(frame("TOOL_RESULT", {"callId": "c", "status": "success",
                                         "result": over})).code == "too_deep"


@pytest.mark.parametrize("value", [{1: "a"}, {None: 1}, {(1, 2): 1}, [set()], {"a": [b"x"]}, 1j])
def test_a_value_json_has_no_word_for_is_invalid_value_naming_where(value):
    code, path, fact = p.find_unstorable(value)
    assert code == "invalid_value"
    assert "JSON" in fact


# --- each decision, spelled out ------------------------------------------------------------


def test_a_lone_surrogate_in_a_context_value_is_invalid_text_naming_the_field():
    error = refusal(frame("CONTEXT_UPDATE", {"context": {"product": {"name": "caf\ud83d"}}}))
    assert error.code == "invalid_text"
    assert "payload.context.product.name" in error.message
    assert error.message_id == "msg_1" and error.type == "CONTEXT_UPDATE"


def test_a_nul_in_a_user_message_is_invalid_text():
    error = refusal(frame("USER_INPUT", {"modality": "text", "content": "hi\x00there"}))
    assert (error.code, error.message_id) == ("invalid_text", "msg_1")
    assert "U+0000" in error.message


def test_a_nul_in_a_key_name_is_invalid_text():
    assert refusal(frame("TOOL_RESULT", {"callId": "c", "status": "success",
                                         "result": {"a\x00": 1}})).code == "invalid_text"


def test_a_surrogate_in_the_id_is_refused_without_echoing_the_id():
    error = refusal(json.dumps({"id": "\udc00", "type": "USER_INPUT", "timestamp": 1,
                                "payload": {"modality": "text", "content": "x"}}))
    assert error.code == "invalid_text" and error.message_id is None


def test_other_control_characters_are_stored_unchanged():
    text = "tab\tbell\x07esc\x1b del\x7f line\u2028"
    message = p.parse_client_frame(frame("USER_INPUT", {"modality": "text", "content": text}),
                                   max_bytes=MAX)
    assert message.payload.content == text


@pytest.mark.parametrize("literal", ["1e400", "-1e400", "9223372036854775808",
                                     "-9223372036854775808", "9" * 5000])
def test_numbers_no_later_layer_holds_are_invalid_number_naming_the_field(literal):
    text = ('{"id":"msg_1","type":"CONTEXT_UPDATE","timestamp":1,'
            '"payload":{"context":{"price":' + literal + '}}}')
    error = refusal(text)
    assert (error.code, error.message_id) == ("invalid_number", "msg_1")
    assert "payload.context.price" in error.message


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity"])
def test_non_json_constants_are_invalid_json(literal):
    assert refusal('{"id":"a","type":"USER_INPUT","timestamp":' + literal
                   + ',"payload":{}}').code == "invalid_json"


@pytest.mark.parametrize("value", [1e300, -1e300, 5e-324, 2**63 - 1, -(2**63 - 1), 0.1])
def test_big_but_finite_numbers_are_kept_exactly(value):
    message = p.parse_client_frame(frame("CONTEXT_UPDATE", {"context": {"n": value}}), max_bytes=MAX)
    assert message.payload.context["n"] == value
    assert not (isinstance(value, float) and math.isnan(value))


def test_nesting_up_to_the_limit_is_accepted_and_one_more_level_is_too_deep():
    # The envelope and the payload are the first two levels.
    fits = frame("CONTEXT_UPDATE", {"context": deep(p.DEFAULT_MAX_DEPTH - 2, as_dict=True)})
    assert p.parse_client_frame(fits, max_bytes=MAX).type is p.MessageType.CONTEXT_UPDATE
    over = frame("CONTEXT_UPDATE", {"context": deep(p.DEFAULT_MAX_DEPTH - 1, as_dict=True)})
    error = refusal(over)
    assert error.code == "too_deep" and len(error.message) < 250


def test_the_depth_limit_is_the_sessions_setting():
    m = opened(max_json_depth=8)
    m.receive_text(frame("CONTEXT_UPDATE", {"context": deep(10)}))
    [error] = [json.loads(t) for t in m.data_to_send()]
    assert error["payload"]["data"]["code"] == "too_deep"


def test_a_hostile_context_update_is_answered_and_the_session_keeps_its_last_good_page():
    m = opened()
    m.receive_text(frame("CONTEXT_UPDATE", {"url": "/a", "context": {"ok": 1}}))
    m.data_to_send()
    assert m.receive_text(frame("CONTEXT_UPDATE", {"url": "/b", "context": {"bad": "\ud800"}})) == []
    [error] = [json.loads(t) for t in m.data_to_send()]
    assert error["payload"]["data"] == {"code": "invalid_text", "messageId": "msg_1"}
    assert (m.url, m.context) == ("/a", {"ok": 1})


def test_a_surrogate_in_handshake_init_is_refused_and_the_deadline_still_applies():
    m = SessionMachine(limits=Limits(), server_version="0.4.0")
    assert m.receive_text(frame("HANDSHAKE_INIT", {"apiKey": KEY, "protocolVersion": "1.0.0",
                                                   "userAgent": "Mozilla\ud800"})) == []
    [error] = [json.loads(t) for t in m.data_to_send()]
    assert error["payload"]["data"]["code"] == "invalid_text"
    assert m.state is State.AWAITING_HANDSHAKE and not m.handshake_pending
    m.handshake_timed_out()
    assert m.close.code == 1008


def test_the_deadline_ends_a_handshake_whose_lookup_never_finished():
    m = SessionMachine(limits=Limits(), server_version="0.4.0")
    [event] = m.receive_text(frame("HANDSHAKE_INIT", {"apiKey": KEY, "protocolVersion": "1.0.0"}))
    assert m.handshake_pending
    m.handshake_timed_out()
    [error] = [json.loads(t) for t in m.data_to_send()]
    assert error["payload"]["data"]["code"] == "handshake_timeout"
    assert (m.state, m.close.code) == (State.CLOSED, 1008)
