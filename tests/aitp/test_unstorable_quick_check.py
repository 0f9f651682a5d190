"""``find_unstorable`` first asks a walk that only answers yes or no, and
names the path only when that says yes: the two must agree on every value,
or a frame the detailed walk would refuse would go through."""
from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aitp import protocol as p
from tests.aitp.hostile import hostile_value

HYPOTHESIS = settings(max_examples=300, deadline=None,
                      suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@HYPOTHESIS
@given(hostile_value(), st.sampled_from([None, 1, 2, 3, p.DEFAULT_MAX_DEPTH]))
def test_the_quick_check_finds_something_exactly_when_the_walk_names_something(value, max_depth):
    named = p._first_unstorable(value, max_depth)
    assert p._any_unstorable(value, max_depth) is (named is not None)
    assert p.find_unstorable(value, max_depth=max_depth) == named


@pytest.mark.parametrize("text", [
    '{"a": ["ok", {"b": "\\u0000"}]}',
    '{"a": {"\\ud800": 1}}',
    '{"a": [1, 2, 1e400]}',
    '{"a": [[[[1]]]]}',
    '{"n": 123456789012345678901234567890}',
])
def test_a_frame_with_one_bad_value_among_good_ones_is_named(text):
    value = json.loads(text, parse_int=p._bounded_int)
    assert p.find_unstorable(value, max_depth=3) is not None
