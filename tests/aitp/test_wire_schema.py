"""The JSON Schema of every frame (aitp/messages.schema.json) is the one the
message models give, and it agrees with tests/wire.py, the hand-written
check of what the deployed client accepts: frames that check accepts
validate, frames it rejects do not."""
from __future__ import annotations

import json

import pytest
from jsonschema import Draft202012Validator

from aitp import protocol as p
from aitp import wire_schema
from tests.aitp.test_protocol import ALL_PAYLOADS, DROPPED_FRAMES, frame
from tests.wire import client_rejection

DOCUMENT = wire_schema.load()


def valid(value, kind: str = "Frame") -> bool:
    return Draft202012Validator(wire_schema.frame_schema(DOCUMENT, kind)).is_valid(value)


def test_the_checked_in_schema_is_what_the_message_models_give():
    assert wire_schema.SCHEMA_PATH.read_text(encoding="utf-8") == wire_schema.schema_text()
    assert wire_schema.main(["--check"]) == 0


def test_the_schema_is_a_valid_draft_2020_12_document():
    Draft202012Validator.check_schema(DOCUMENT)


@pytest.mark.parametrize(("message_type", "payload"), ALL_PAYLOADS,
                         ids=[f"{t.value}-{i}" for i, (t, _) in enumerate(ALL_PAYLOADS)])
def test_every_frame_the_wire_check_accepts_validates(message_type, payload):
    text = frame(message_type.value, payload)
    assert client_rejection(text, from_server=False) is None
    assert valid(json.loads(text))
    kind = "ServerFrame" if message_type in p.SERVER_TYPES else "ClientFrame"
    assert valid(json.loads(text), kind)


@pytest.mark.parametrize(("text", "reason"), DROPPED_FRAMES, ids=[r for _, r in DROPPED_FRAMES])
def test_no_frame_the_wire_check_rejects_validates_as_a_server_frame(text, reason):
    assert client_rejection(text) is not None
    try:
        value = json.loads(text)
    except ValueError:
        return  # not json: there is nothing to validate
    assert not valid(value, "ServerFrame")


@pytest.mark.parametrize("message", [
    p.handshake_ack("ses_1", "0.4.0", ("text", "tools"), 30),
    p.agent_response("", True),
    p.tool_call("tc_1", "add_to_cart", {"quantity": None}),
    p.approval_request("tc_2", "pay", "critical", {}, "Pay?"),
    p.voice_state("interrupted", "barge_in"),
    p.error_event("invalid_key", "bad key", field=None),
    p.system_event("waiting", meta={"sessionId": "ses_1"}),
], ids=lambda m: m.type.value)
def test_every_frame_the_server_writes_validates_as_a_server_frame(message):
    text = p.serialize(message)
    assert client_rejection(text) is None
    assert valid(json.loads(text), "ServerFrame")


def test_a_null_where_an_optional_field_would_be_does_not_validate():
    assert not valid(json.loads(frame("TOOL_RESULT", {"callId": "c", "status": "error",
                                                      "error": None})))
    assert valid(json.loads(frame("TOOL_RESULT", {"callId": "c", "status": "success",
                                                  "result": None})))
