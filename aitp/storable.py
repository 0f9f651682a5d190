"""Values no later layer could hold, found by one walk of a JSON tree.

A frame, a server tool's answer and the arguments the model writes all go on
to UTF-8, SQLite JSON, PostgreSQL jsonb and the model request: text with
U+0000 or a lone surrogate, integers beyond 64 bits, non-finite numbers and
nesting past a limit break one of them, so they are refused where they
arrive. Pure: no Django, no I/O.
"""

from __future__ import annotations

import math
import re
from typing import Any

# Objects and lists inside one frame, the envelope counting as 1. A page's
# context is a few levels deep; thousands of levels only break the layers
# after us (recursive encoders, the admin's pages).
DEFAULT_MAX_DEPTH = 32
# Integers must fit in 64 bits: the database columns, the JSON parsers of
# PostgreSQL drivers and SDKs, and Python's own int/str conversion limit
# (4,300 digits) all refuse or mangle bigger ones. Floats must be finite.
MAX_INTEGER = 2**63 - 1
# A tool's result is the third level of its TOOL_RESULT frame (the envelope,
# its payload, the result itself), as a call's arguments are of its TOOL_CALL.
RESULT_LEVEL = 3

# U+0000 (PostgreSQL text and jsonb refuse it) and lone surrogates (no UTF-8
# encoding exists for them; JSON.stringify emits one after a .slice() through
# an emoji). Every other character, control characters included, is stored
# and sent on unchanged.
BAD_TEXT = re.compile("[\x00\ud800-\udfff]")

# (code, path, fact): e.g. ("invalid_text", "payload.context.name",
# "contains a NUL character (U+0000)").
Problem = tuple[str, str, str]


class OutOfRange:
    """An integer literal too long to convert, kept until it is reported."""

    __slots__ = ()


def bounded_int(text: str) -> int | OutOfRange:
    """json.loads' ``parse_int`` that never converts a literal too long to hold."""
    # Decide on the length first: int() of 5,000 digits is itself refused.
    if len(text) - (text[0] == "-") > 20:
        return OutOfRange()
    return int(text)


def text_problem(text: str) -> str | None:
    """Why this string cannot be stored faithfully, or None."""
    found = BAD_TEXT.search(text)
    if found is None:
        return None
    if found.group() == "\x00":
        return "contains a NUL character (U+0000)"
    return f"contains a lone surrogate (U+{ord(found.group()):04X}); text must be valid Unicode"


def storable_text(text: str) -> str:
    """``text`` with each character ``text_problem`` refuses (U+0000, a lone
    surrogate) replaced by U+FFFD, as a UTF-8 decoder replaces bytes it
    cannot read; the same string when there is none."""
    if BAD_TEXT.search(text) is None:
        return text
    return BAD_TEXT.sub("\ufffd", text)


def find_unstorable(value: Any, *, max_depth: int | None = DEFAULT_MAX_DEPTH) -> Problem | None:
    """The first value in a parsed JSON tree no later layer could hold.

    Returns (code, path, fact) or None when every value can be stored.
    Iterative, so any depth is walked without recursion; the way to each
    container is kept, and the path spelled out only for the value refused.

    The tree may come from anywhere (a frame, a server tool's answer, a
    Python tool's return value): anything JSON has no value for (a set,
    bytes, an object, a name that is not text) is ``invalid_value``. A
    frame's parse never makes one.
    """
    if not isinstance(value, (dict, list)):
        found = _value_problem(value)
        return None if found is None else (found[0], "", found[1])
    # A container: (value, depth, the entry of its parent, its key there).
    stack: list[_Entry] = [(value, 1, None, None)]
    while stack:
        problem = _container_problem(stack.pop(), max_depth, stack)
        if problem is not None:
            return problem
    return None


def find_unstorable_result(value: Any, *, max_depth: int | None = DEFAULT_MAX_DEPTH
                           ) -> Problem | None:
    """``find_unstorable`` of a tool's answer, whatever it came from (a
    server tool's webhook or Python handler): the check a page's TOOL_RESULT
    result gets inside its frame of at most ``max_depth`` levels, at the
    same depth. The arguments the model writes for a call get it too: they
    sit at the same level of their TOOL_CALL."""
    depth = None if max_depth is None else max(1, max_depth - (RESULT_LEVEL - 1))
    return find_unstorable(value, max_depth=depth)


_Entry = tuple[Any, int, Any, Any]


def _container_problem(entry: _Entry, max_depth: int | None, stack: list[_Entry]
                       ) -> Problem | None:
    """The first problem among a container's names and direct values; the
    containers in it are pushed on ``stack``. The values json.loads makes
    are told by their exact type; anything else takes ``_value_problem``."""
    item, depth, _, _ = entry
    if max_depth is not None and depth > max_depth:
        return "too_deep", _path(entry), f"is nested more than {max_depth} levels deep"
    search, isfinite = BAD_TEXT.search, math.isfinite
    if isinstance(item, dict):
        for name in item:
            if type(name) is not str or search(name) is not None:
                named = _name_problem(entry, name)
                if named is not None:
                    return named
    for key, child in (item.items() if isinstance(item, dict) else enumerate(item)):
        kind = type(child)
        if (child is None or kind is bool or (kind is str and search(child) is None)
                or (kind is int and -MAX_INTEGER <= child <= MAX_INTEGER)
                or (kind is float and isfinite(child))):
            continue
        if isinstance(child, (dict, list)):
            stack.append((child, depth + 1, entry, key))
            continue
        found = _value_problem(child)
        if found is not None:
            return found[0], _path(entry, key), found[1]
    return None


def _value_problem(value: Any) -> tuple[str, str] | None:
    """(code, fact) for one value that is not a container, or None."""
    if isinstance(value, str):
        fact = text_problem(value)
        return None if fact is None else ("invalid_text", fact)
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, OutOfRange) or (isinstance(value, int) and abs(value) > MAX_INTEGER):
        return "invalid_number", f"is out of range (at most {MAX_INTEGER} in magnitude)"
    if isinstance(value, int) or (isinstance(value, float) and math.isfinite(value)):
        return None
    if isinstance(value, float):  # 1e400 parses to inf
        return "invalid_number", "is out of range (not a finite number)"
    if isinstance(value, (dict, list)):
        return None
    return "invalid_value", "is not a JSON value"


def _name_problem(entry: _Entry, name: Any) -> Problem | None:
    if not isinstance(name, str):
        return "invalid_value", _path(entry), "has a name that is not text (JSON names are strings)"
    fact = text_problem(name)
    return None if fact is None else ("invalid_text", _path(entry, name), f"has a name that {fact}")


_NO_KEY = object()


def _path(entry: _Entry, key: Any = _NO_KEY) -> str:
    parts: list[Any] = [] if key is _NO_KEY else [key]
    while entry[2] is not None:
        parts.append(entry[3])
        entry = entry[2]
    path = ""
    for part in reversed(parts):
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            shown = _shown_key(part)
            path = f"{path}.{shown}" if path else shown
    # What is echoed to the peer stays short, however deep the value was.
    return path if len(path) <= 120 else "..." + path[-100:]


def _shown_key(key: Any) -> str:
    text = BAD_TEXT.sub("?", str(key))
    return text if len(text) <= 32 else text[:32] + "..."
