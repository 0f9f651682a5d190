"""Hypothesis strategies for hostile AITP frames: any value in any field.

Values JSON allows but later layers refuse (lone surrogates, U+0000, other
control characters), numbers no later layer holds (NaN, Infinity, 1e400,
integers past 64 bits), deep nesting, long strings and keys; frames of every
type, with fields missing, swapped or of the wrong kind. Shared by the pure
core's tests and the live consumer's.
"""
from __future__ import annotations

import json
import math
import random
import re

from hypothesis import strategies as st

# The pieces attackers reach for first; st.text() alone rarely finds them.
NASTY_TEXT = (
    "\ud800", "\udfff", "x\ud83d", "\ude00y", "\x00", "a\x00b", "\x01\x1f\x7f", "\u2028\u2029",
    "\ufeff", "\uffff", "\U0010ffff", "\u202e", "😀", "'; DROP TABLE aitp_session; --",
    "<script>alert(1)</script>", "{{ 7*7 }}", "%s%n", "\\u0000", "", " ", "\t\n\r",
)

CLIENT_TYPES = (
    "HANDSHAKE_INIT", "CONTEXT_UPDATE", "USER_INPUT", "TOOL_RESULT", "APPROVAL_REQUEST",
    "APPROVAL_RESPONSE", "AUDIO_STREAM", "VOICE_INPUT_END", "VOICE_INTERRUPT",
)
OTHER_TYPES = (
    "HANDSHAKE_ACK", "TOOL_CALL", "AGENT_RESPONSE", "VOICE_STATE_EVENT", "SYSTEM_EVENT",
    "handshake_init", "", "NOPE",
)

# A valid payload of each client type: hostile frames start from one and break it.
VALID_PAYLOADS = {
    "HANDSHAKE_INIT": {"protocolVersion": "1.0.0", "userAgent": "ua", "viewport": "1x1",
                       "sdkVersion": "0.4.0"},
    "CONTEXT_UPDATE": {"url": "/p", "title": "T", "context": {"a": 1},
                       "activeTools": [{"name": "add_to_cart", "description": "Add",
                                        "risk": "low"}]},
    "USER_INPUT": {"modality": "text", "content": "hello"},
    "TOOL_RESULT": {"callId": "call_x", "status": "success", "result": {"ok": True}},
    "APPROVAL_REQUEST": {"callId": "call_x", "toolName": "t", "risk": "high", "args": {},
                         "message": "ok?"},
    "APPROVAL_RESPONSE": {"callId": "call_x", "approved": True},
    "AUDIO_STREAM": {"data": "AAAA", "mimeType": "audio/webm"},
    "VOICE_INPUT_END": {"reason": "user_stop"},
    "VOICE_INTERRUPT": {"reason": "barge_in"},
}


def hostile_text(max_size: int = 40) -> st.SearchStrategy[str]:
    return st.one_of(
        st.sampled_from(NASTY_TEXT),
        # Every code point, surrogates included.
        st.text(st.characters(exclude_categories=()), max_size=max_size),
        st.builds(lambda a, b: a + b, st.sampled_from(NASTY_TEXT),
                  st.text(st.characters(exclude_categories=()), max_size=8)),
        st.integers(1, 5000).map(lambda n: "x" * n),
    )


def hostile_number() -> st.SearchStrategy:
    return st.one_of(
        st.integers(),
        st.integers(min_value=-(2**80), max_value=2**80),
        st.sampled_from([2**63 - 1, 2**63, -(2**63), 2**53 + 1, 10**30, -0.0, 1e300, -1e300,
                         5e-324, float("nan"), float("inf"), float("-inf")]),
        st.floats(allow_nan=True, allow_infinity=True),
    )


def deep(depth: int, leaf=0, *, as_dict: bool = False):
    value = leaf
    for _ in range(depth):
        value = {"k": value} if as_dict else [value]
    return value


def hostile_value(max_leaves: int = 12) -> st.SearchStrategy:
    scalars = st.one_of(st.none(), st.booleans(), hostile_number(), hostile_text())
    nested = st.recursive(
        scalars,
        lambda children: st.one_of(
            st.lists(children, max_size=4),
            st.dictionaries(hostile_text(12), children, max_size=4),
        ),
        max_leaves=max_leaves,
    )
    return st.one_of(
        nested,
        st.builds(deep, st.integers(1, 120), st.sampled_from([0, "x", "\ud800"]), as_dict=st.booleans()),
    )


@st.composite
def hostile_frame(draw, types=CLIENT_TYPES) -> dict:
    """One frame as a Python object: a valid frame of some type with a few
    of its fields (envelope or payload) replaced by hostile values."""
    type_ = draw(st.one_of(st.sampled_from(types), st.sampled_from(OTHER_TYPES)))
    payload = dict(VALID_PAYLOADS.get(type_, {"x": 1}))
    frame = {"id": "msg_h", "type": type_, "timestamp": 1, "payload": payload}
    for _ in range(draw(st.integers(0, 3))):
        where = draw(st.sampled_from(["payload", "payload", "payload", "envelope", "context",
                                      "tool"]))
        if where == "payload":
            key = draw(st.one_of(st.sampled_from(sorted(payload) or ["x"]), hostile_text(10)))
            payload[key] = draw(hostile_value())
        elif where == "envelope":
            key = draw(st.sampled_from(["id", "type", "timestamp", "payload", "meta"]))
            frame[key] = draw(hostile_value())
        elif where == "context" and type_ == "CONTEXT_UPDATE":
            payload["context"] = draw(st.dictionaries(hostile_text(12), hostile_value(), max_size=4))
        elif where == "tool" and type_ == "CONTEXT_UPDATE":
            tool = dict(VALID_PAYLOADS["CONTEXT_UPDATE"]["activeTools"][0])
            tool[draw(st.sampled_from(["name", "description", "risk", "parameters"]))] = draw(
                hostile_value())
            payload["activeTools"] = [tool]
    return frame


def encode(frame, *, ascii_only: bool = True) -> str:
    """JSON text as a client could send it. Over a real socket a lone
    surrogate can only arrive escaped (the text must be UTF-8), so
    ascii_only=True is what daphne can deliver."""
    return json.dumps(frame, ensure_ascii=ascii_only, allow_nan=True)


# --- a seeded generator for the fuzz run over real sockets --------------------


def random_hostile_frames(seed: int, count: int, *, tool_commands: tuple[str, ...] = (),
                          tool_share: float = 0.05) -> list[str]:
    """count hostile frame texts, reproducible from seed, without hypothesis
    (the fuzz run sends thousands; shrinking is for the property tests).
    With ``tool_commands``, about ``tool_share`` of them are USER_INPUTs
    asking the offline agent for one of those ("/tool <name> {json}")."""
    rng = random.Random(seed)
    frames = []
    for index in range(count):
        if tool_commands and rng.random() < tool_share:
            frames.append(json.dumps({"id": f"msg_{index}", "type": "USER_INPUT", "timestamp": 1,
                                      "payload": {"modality": "text",
                                                  "content": rng.choice(tool_commands)}}))
            continue
        type_ = rng.choice(CLIENT_TYPES + OTHER_TYPES[:2])
        payload = json.loads(json.dumps(VALID_PAYLOADS.get(type_, {"x": 1})))
        frame = {"id": f"msg_{index}", "type": type_, "timestamp": 1, "payload": payload}
        for _ in range(rng.randint(0, 2)):
            value = _random_value(rng, depth=0)
            target = rng.random()
            if target < 0.15:
                frame[rng.choice(["id", "timestamp", "meta", "type"])] = value
            elif target < 0.5 and type_ == "CONTEXT_UPDATE":
                payload["context"] = {_random_text(rng): value}
            else:
                payload[rng.choice(sorted(payload) or ["x"])] = value
        text = json.dumps(frame, ensure_ascii=True, allow_nan=True)
        if rng.random() < 0.03:
            text = text[: rng.randint(0, len(text))]  # truncated: not JSON at all
        frames.append(text)
    return frames


def _random_text(rng: random.Random) -> str:
    choice = rng.random()
    if choice < 0.5:
        return rng.choice(NASTY_TEXT)
    if choice < 0.9:
        return "".join(chr(rng.randint(0, 0x10FFFF)) for _ in range(rng.randint(0, 12)))
    return "y" * rng.randint(100, 20000)


def _random_value(rng: random.Random, depth: int):
    choice = rng.random()
    if choice < 0.3:
        return _random_text(rng)
    if choice < 0.5:
        return rng.choice([2**63, -(2**64), 10**400, 1e300, float("nan"), float("inf"), -0.0,
                           rng.randint(-(2**70), 2**70), rng.random()])
    if choice < 0.6:
        return deep(rng.randint(1, 200), _random_text(rng), as_dict=rng.random() < 0.5)
    if choice < 0.8 and depth < 3:
        return {_random_text(rng): _random_value(rng, depth + 1) for _ in range(rng.randint(0, 3))}
    if choice < 0.9 and depth < 3:
        return [_random_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    return rng.choice([None, True, False, 0, "", {}, []])


# --- what a server tool may answer ---------------------------------------------------

# A webhook's body as it comes off the wire: JSON that Python's json.loads
# takes (NaN, Infinity, integers of any size, escaped surrogates and NULs,
# deep nesting) and no later layer holds.
HOSTILE_WEBHOOK_BODIES = {
    "nan": b'{"total": NaN}',
    "infinity": b'{"total": Infinity}',
    "-infinity": b'{"total": -Infinity}',
    "nul": b'{"note": "paid\\u0000"}',
    "surrogate_in_a_value": b'{"note": "\\ud83d"}',
    "surrogate_in_a_key": b'{"\\udfff": 1}',
    "nested_200_levels": b"[" * 200 + b"]" * 200,
    "integer_2_80": b'{"total": 1208925819614629174706176}',
}
# More a fuzz run sends: nesting json.loads itself cannot walk, an integer
# too long to convert, bytes that are not UTF-8, and answers that are fine.
MORE_WEBHOOK_BODIES = {
    "nested_100000_levels": b"[" * 100_000,
    "digits_5000": b"1" * 5000,
    "not_utf8": b'{"note": "\xff\xfe"}',
    "good": b'{"ok": true, "total": 12.5}',
    "empty": b"",
}


class NotJson:
    """A Python object a handler might return by mistake: its repr must
    never reach the model."""

    def __repr__(self) -> str:
        return "<NotJson internals=secret>"


# A Python tool's return value: the same hostile values, and values JSON has
# no word for.
HOSTILE_RETURNS = {
    "nan": {"total": float("nan")},
    "infinity": {"total": float("inf")},
    "-infinity": {"total": float("-inf")},
    "nul": {"note": "paid\x00"},
    "surrogate_in_a_value": {"note": "\ud83d"},
    "surrogate_in_a_key": {"\udfff": 1},
    "nested_200_levels": deep(200),
    "integer_2_80": {"total": 2**80},
    "python_object": {"order": NotJson()},
}
MORE_RETURNS = {
    "a_set": {"ids": {1, 2}},
    "bytes": b"\x00raw",
    "an_integer_key": {1: "one"},
    "a_tuple": (1, 2),
    "good": {"ok": True, "total": 12.5},
    "none": None,
}


def hostile_answer() -> st.SearchStrategy:
    """Anything a Python tool could return: JSON-shaped hostile values, and
    values that are not JSON at all, alone or inside JSON."""
    not_json = st.sampled_from([NotJson(), {1, 2}, b"bytes", (1, 2), 1j, frozenset(), object()])
    return st.one_of(
        hostile_value(),
        not_json,
        st.dictionaries(hostile_text(8), st.one_of(hostile_value(max_leaves=4), not_json), max_size=3),
        st.dictionaries(st.one_of(st.integers(), st.booleans(), st.none()), st.just(1), min_size=1,
                        max_size=2),
    )


def unstorable_codes(value, max_depth: int | None, depth: int = 1) -> set[str]:
    """Every code ``find_unstorable`` could answer for ``value``: a plain
    recursive reading of its rules, written apart from its walk."""
    if isinstance(value, str):
        return {"invalid_text"} if re.search("[\x00\ud800-\udfff]", value) else set()
    if value is None or isinstance(value, bool):
        return set()
    if isinstance(value, int):
        return {"invalid_number"} if abs(value) > 2**63 - 1 else set()
    if isinstance(value, float):
        return set() if math.isfinite(value) else {"invalid_number"}
    if not isinstance(value, (dict, list)):
        return {"invalid_value"}
    if max_depth is not None and depth > max_depth:
        return {"too_deep"}
    codes: set[str] = set()
    children = value.values() if isinstance(value, dict) else value
    for key in value if isinstance(value, dict) else ():
        codes |= unstorable_codes(key, None) if isinstance(key, str) else {"invalid_value"}
    for child in children:
        codes |= unstorable_codes(child, max_depth, depth + 1)
    return codes
