"""``find_unstorable`` names a value exactly when the rules say one cannot be
stored. Before it walks, a client frame's parse asks its text, its numbers
and its nesting whether there can be anything to find: that must never say
no where the walk would name something."""
from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aitp import protocol as p
from aitp.protocol import _reject_constant as reject_constant
from aitp.storable import bounded_int
from tests.aitp.hostile import encode, hostile_frame, hostile_value, unstorable_codes

HYPOTHESIS = settings(max_examples=300, deadline=None,
                      suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@HYPOTHESIS
@given(hostile_value(), st.sampled_from([None, 1, 2, 3, p.DEFAULT_MAX_DEPTH]))
def test_the_walk_names_something_exactly_when_the_rules_refuse_a_value(value, max_depth):
    named = p.find_unstorable(value, max_depth=max_depth)
    codes = unstorable_codes(value, max_depth)
    assert (named is None) is (not codes)
    assert named is None or named[0] in codes


@pytest.mark.parametrize("text", [
    '{"a": ["ok", {"b": "\\u0000"}]}',
    '{"a": {"\\ud800": 1}}',
    '{"a": [1, 2, 1e400]}',
    '{"a": [[[[1]]]]}',
    '{"n": 123456789012345678901234567890}',
])
def test_a_frame_with_one_bad_value_among_good_ones_is_named(text):
    value = json.loads(text, parse_int=bounded_int)
    assert p.find_unstorable(value, max_depth=3) is not None


def walk_refusal(text: str) -> str | None:
    """The code the full walk gives the frame's parsed values, None when it finds nothing."""
    value = json.loads(text, parse_int=bounded_int, parse_constant=reject_constant)
    found = p.find_unstorable(value, max_depth=p.DEFAULT_MAX_DEPTH)
    return None if found is None else found[0]


def parse_refusal(text: str) -> str | None:
    try:
        p.parse_client_frame(text, max_bytes=1 << 20)
    except p.ProtocolError as error:
        return error.code
    return None


VALUE_CODES = {"invalid_text", "invalid_number", "too_deep"}


@HYPOTHESIS
@given(hostile_frame(), st.booleans())
def test_a_frame_is_refused_for_its_values_exactly_when_the_walk_names_one(frame, ascii_only):
    text = encode(frame, ascii_only=ascii_only)
    try:
        expected = walk_refusal(text)
    except ValueError:
        return  # not JSON a client frame can be (NaN): refused before any walk
    got = parse_refusal(text)
    if expected is not None:
        assert got == expected
    else:
        assert got not in VALUE_CODES


def nested(levels: int) -> dict:
    value: dict = {}
    for _ in range(levels):
        value = {"a": value}
    return value


@pytest.mark.parametrize(("context", "code"), [
    ({"a": "\u0000"}, "invalid_text"),
    ({"\ud83d": 1}, "invalid_text"),
    ({"a": 9223372036854775808}, "invalid_number"),
    ({"a": -9223372036854775808}, "invalid_number"),
    ({"a": 10 ** 30}, "invalid_number"),
    ({"a": float("inf")}, "invalid_number"),
    (nested(31), "too_deep"),
])
def test_one_bad_value_in_a_context_is_refused_whatever_the_rest(context, code):
    frame = {"id": "m", "type": "CONTEXT_UPDATE", "timestamp": 1,
             "payload": {"url": "/", "title": "ok é", "context": context, "activeTools": []}}
    text = json.dumps(frame, ensure_ascii=False).replace("Infinity", "1e400")
    assert parse_refusal(text) == code


@pytest.mark.parametrize("context", [
    {"emoji": "\U0001F600 escaped as a pair"},
    {"a": 9223372036854775807, "b": -9223372036854775807, "c": 1e308},
    {"backslash": "\\u0000 is text, not NUL"},
    nested(29),
])
def test_values_that_only_look_unstorable_are_accepted(context):
    frame = {"id": "m", "type": "CONTEXT_UPDATE", "timestamp": 1,
             "payload": {"url": "/", "title": "t", "context": context, "activeTools": []}}
    assert parse_refusal(json.dumps(frame)) is None
