"""A SYSTEM_EVENT frame, whatever its data holds, is the one
``model_dump(mode="json", exclude_none=True)`` gives (protocol.md §1)."""
from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from aitp import protocol as p
from aitp.tools import Risk, ToolSurface, parse_client_tools
from tests.aitp.conftest import ADD_TO_CART


def frame_through_pydantic(message: p.Message) -> dict:
    envelope = {
        "id": message.id, "type": message.type.value, "timestamp": message.timestamp,
        "payload": message.payload.model_dump(mode="json", exclude_none=True),
    }
    if message.meta is not None:
        envelope["meta"] = message.meta
    return envelope


DATA = [
    pytest.param(ToolSurface.build((), parse_client_tools([ADD_TO_CART])).to_event_data(),
                 id="tools-effective"),
    pytest.param({"code": "x", "nested": {"absent": None, "list": [None, 1, 2.5, True]}},
                 id="nested-nulls-kept"),
    pytest.param({"risk": Risk.HIGH, "pair": (1, "two")}, id="str-enum-and-tuple"),
    pytest.param({"at": datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)}, id="datetime-the-long-way"),
    pytest.param({"text": "caf\u00e9 \u2603 \U0001f989"}, id="unicode"),
]


@pytest.mark.parametrize("data", DATA)
def test_a_system_event_is_written_as_pydantic_writes_it(data):
    message = p.system_event("tools_effective", data=data)
    assert json.loads(p.serialize(message)) == frame_through_pydantic(message)


def test_a_system_event_leaves_out_an_absent_message_and_data():
    message = p.system_event("waiting")
    assert json.loads(p.serialize(message))["payload"] == {"kind": "waiting"}


def test_a_system_event_with_meta_keeps_it_after_the_payload():
    message = p.system_event("error", "Nope.", {"code": "x"}, meta={"turn": 3})
    text = p.serialize(message)
    assert list(json.loads(text)) == ["id", "type", "timestamp", "payload", "meta"]
    assert json.loads(text) == frame_through_pydantic(message)


def test_a_lone_surrogate_in_a_system_event_goes_out_escaped():
    message = p.error_event("invalid_text", "bad \ud800 text", field="\ud800")
    text = p.serialize(message)
    text.encode("utf-8")  # writable as UTF-8
    assert "\\ud800" in text
    assert json.loads(text)["payload"]["data"] == {"code": "invalid_text", "field": "\ud800"}


def test_a_not_a_number_in_a_system_event_is_refused_as_before():
    with pytest.raises(ValueError):
        p.serialize(p.system_event("error", "x", {"code": "x", "value": float("nan")}))
