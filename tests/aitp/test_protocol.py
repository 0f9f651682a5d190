"""aitp.protocol: the 14 message types, parsing, serialization (no Django needed)."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aitp import protocol
from aitp.protocol import (
    CLIENT_TYPES,
    PAYLOAD_MODELS,
    PROTOCOL_VERSION,
    SERVER_TYPES,
    SYSTEM_EVENT_KINDS,
    MessageType,
    ProtocolError,
    agent_response,
    approval_request,
    error_event,
    handshake_ack,
    make_message,
    parse_client_frame,
    parse_server_frame,
    serialize,
    system_event,
    tool_call,
    voice_state,
)
from aitp.tools import Risk
from tests.wire import assert_client_accepts, client_rejection

REPO_ROOT = Path(__file__).resolve().parents[2]
MAX = 64 * 1024


def frame(type_, payload, **envelope):
    data = {"id": "msg_1", "type": type_, "timestamp": 1706000000000, "payload": payload}
    data.update(envelope)
    return json.dumps(data, ensure_ascii=False)


def client_error(text, max_bytes=MAX) -> ProtocolError:
    with pytest.raises(ProtocolError) as info:
        parse_client_frame(text, max_bytes=max_bytes)
    return info.value


# One full and one minimal payload per type, as a peer would send them.
FULL_PAYLOADS = {
    MessageType.HANDSHAKE_INIT: {"apiKey": "pk_live_abc", "userAgent": "Mozilla/5.0",
                                 "viewport": "1440x900", "sdkVersion": "0.4.0",
                                 "protocolVersion": "1.0.0"},
    MessageType.HANDSHAKE_ACK: {"sessionId": "ses_9e210bbf", "serverVersion": "0.4.0",
                                "protocolVersion": "1.0.0",
                                "capabilities": ["text", "audio", "tools"], "maxActiveTools": 30},
    MessageType.CONTEXT_UPDATE: {
        "url": "/products/headphones", "title": "Pro Headphones - Store",
        "activeTools": [{"name": "add_to_cart", "description": "Add it", "risk": "low",
                         "parameters": {"type": "OBJECT", "properties": {
                             "quantity": {"type": "NUMBER"}}, "required": ["quantity"]}}],
        "context": {"page": "product_detail", "price": 149.99}},
    MessageType.USER_INPUT: {"modality": "audio", "content": "UklGRiQ=", "mimeType": "audio/wav"},
    MessageType.TOOL_CALL: {"callId": "tc_4892c90", "name": "add_to_cart", "args": {"quantity": 2}},
    MessageType.TOOL_RESULT: {"callId": "tc_4892c90", "status": "error", "result": {"partial": 1},
                              "error": "out of stock"},
    MessageType.APPROVAL_REQUEST: {"callId": "tc_7a1d220", "toolName": "process_payment",
                                   "risk": "critical", "args": {"amount": 299.98},
                                   "message": "Pay 299.98 USD with the saved card?"},
    MessageType.APPROVAL_RESPONSE: {"callId": "tc_7a1d220", "approved": True,
                                    "result": {"paid": True}, "error": "partly"},
    MessageType.AGENT_RESPONSE: {"chunk": "I have added two.", "done": True},
    MessageType.AUDIO_STREAM: {"data": "UklGRiQAAABXQVZF", "mimeType": "audio/pcm;rate=24000"},
    MessageType.VOICE_INPUT_END: {"reason": "vad"},
    MessageType.VOICE_INTERRUPT: {"reason": "barge_in"},
    MessageType.VOICE_STATE_EVENT: {"event": "interrupted", "reason": "barge_in"},
    MessageType.SYSTEM_EVENT: {"kind": "transcript", "message": "hi",
                               "data": {"role": "agent", "text": "Your headphones are in the cart."}},
}
MINIMAL_PAYLOADS = {
    MessageType.HANDSHAKE_INIT: {"protocolVersion": "1.0.0"},
    MessageType.HANDSHAKE_ACK: {"sessionId": "s", "serverVersion": "0.4.0",
                                "protocolVersion": "1.0.0", "capabilities": []},
    MessageType.CONTEXT_UPDATE: {},
    MessageType.USER_INPUT: {"modality": "text", "content": ""},
    MessageType.TOOL_CALL: {"callId": "c", "name": "n", "args": {}},
    MessageType.TOOL_RESULT: {"callId": "c", "status": "success"},
    MessageType.APPROVAL_REQUEST: {"callId": "c", "toolName": "t", "risk": "none", "args": {},
                                   "message": "ok?"},
    MessageType.APPROVAL_RESPONSE: {"callId": "c", "approved": False},
    MessageType.AGENT_RESPONSE: {"chunk": "", "done": False},
    MessageType.AUDIO_STREAM: {"data": ""},
    MessageType.VOICE_INPUT_END: {"reason": "timeout"},
    MessageType.VOICE_INTERRUPT: {},
    MessageType.VOICE_STATE_EVENT: {"event": "turn_complete"},
    MessageType.SYSTEM_EVENT: {"kind": "waiting"},
}
ALL_PAYLOADS = [*FULL_PAYLOADS.items(), *MINIMAL_PAYLOADS.items()]


def parser_for(message_type):
    if message_type in CLIENT_TYPES:
        return lambda text: parse_client_frame(text, max_bytes=MAX)
    return parse_server_frame


def walk(value, path="$"):
    yield path, value
    if isinstance(value, dict):
        for key, child in value.items():
            yield from walk(child, f"{path}.{key}")
    elif isinstance(value, list):
        for index, child in enumerate(value):
            yield from walk(child, f"{path}[{index}]")


# --- purity -------------------------------------------------------------------


def test_the_core_imports_without_django_or_asyncio():
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    code = (
        "import sys\n"
        "import aitp.protocol, aitp.tools\n"
        "loaded = sorted(m for m in ('django', 'channels', 'asyncio') if m in sys.modules)\n"
        "print(','.join(loaded) or 'clean')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "clean"


# --- the type tables --------------------------------------------------------------


def test_there_are_fourteen_types_each_named_by_its_value():
    assert len(MessageType) == 14
    assert all(t.value == t.name for t in MessageType)
    assert set(PAYLOAD_MODELS) == set(MessageType)


def test_directions_follow_the_spec_table():
    assert set(MessageType) == CLIENT_TYPES | SERVER_TYPES
    assert {MessageType.APPROVAL_REQUEST, MessageType.AUDIO_STREAM} == CLIENT_TYPES & SERVER_TYPES
    assert len(CLIENT_TYPES) == 9 and len(SERVER_TYPES) == 7


def test_system_event_kinds_match_the_spec():
    assert SYSTEM_EVENT_KINDS == ("error", "waiting", "approval_required", "tools_effective",
                                  "transcript", "reload", "redirect", "disconnect")
    assert PROTOCOL_VERSION == "1.0.0"


# --- round trips ------------------------------------------------------------------


@pytest.mark.parametrize("message_type,payload", ALL_PAYLOADS,
                         ids=[f"{t.value}-{i}" for i, (t, _) in enumerate(ALL_PAYLOADS)])
def test_every_type_round_trips_through_serialize_and_parse(message_type, payload):
    message = make_message(message_type, payload, meta={"sessionId": "ses_1"},
                           now_ms=1706000000000, id="msg_x")
    text = serialize(message)
    parsed = parser_for(message_type)(text)
    assert parsed == message
    assert serialize(parsed) == text


@pytest.mark.parametrize("message_type,payload", ALL_PAYLOADS,
                         ids=[f"{t.value}-{i}" for i, (t, _) in enumerate(ALL_PAYLOADS)])
def test_every_type_parses_from_a_peer_frame_and_keeps_its_fields(message_type, payload):
    message = parser_for(message_type)(frame(message_type.value, payload))
    assert message.type is message_type
    assert isinstance(message.payload, PAYLOAD_MODELS[message_type])
    dumped = message.payload.model_dump()
    assert {k: dumped[k] for k in payload} == payload
    assert message.id == "msg_1" and message.timestamp == 1706000000000 and message.meta is None


@pytest.mark.parametrize("message_type,payload", ALL_PAYLOADS,
                         ids=[f"{t.value}-{i}" for i, (t, _) in enumerate(ALL_PAYLOADS)])
def test_every_serialized_frame_passes_the_deployed_client_check(message_type, payload):
    text = serialize(make_message(message_type, payload))
    assert_client_accepts(text, from_server=False)


def test_both_direction_types_parse_on_both_sides():
    for message_type in (MessageType.APPROVAL_REQUEST, MessageType.AUDIO_STREAM):
        text = serialize(make_message(message_type, FULL_PAYLOADS[message_type]))
        assert parse_client_frame(text, max_bytes=MAX) == parse_server_frame(text)


@settings(max_examples=60, deadline=None, database=None)
@given(
    chunk=st.text(),
    done=st.booleans(),
    call_id=st.text(min_size=1),
    args=st.dictionaries(st.text(), st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
        | st.text(),
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
        max_leaves=10)),
    timestamp=st.integers(min_value=0, max_value=2**53),
)
def test_round_trip_holds_for_arbitrary_text_and_arguments(chunk, done, call_id, args, timestamp):
    for message in (
        make_message(MessageType.AGENT_RESPONSE, {"chunk": chunk, "done": done}, now_ms=timestamp),
        make_message(MessageType.TOOL_CALL, {"callId": call_id, "name": "t", "args": args}),
    ):
        assert parse_server_frame(serialize(message)) == message


def test_the_spec_example_frames_parse():
    init = parse_client_frame(frame("HANDSHAKE_INIT", FULL_PAYLOADS[MessageType.HANDSHAKE_INIT]),
                              max_bytes=MAX)
    assert init.payload.apiKey == "pk_live_abc"
    update = parse_client_frame(frame("CONTEXT_UPDATE", FULL_PAYLOADS[MessageType.CONTEXT_UPDATE]),
                                max_bytes=MAX)
    assert update.payload.activeTools[0]["name"] == "add_to_cart"
    assert update.payload.context["price"] == 149.99


# --- liberal acceptance -----------------------------------------------------------


def test_unknown_payload_and_envelope_keys_are_ignored():
    text = frame("USER_INPUT", {"modality": "text", "content": "hi", "extra": 1}, extra=True)
    message = parse_client_frame(text, max_bytes=MAX)
    assert message.payload.model_dump() == {"modality": "text", "content": "hi", "mimeType": None}


def test_explicit_nulls_for_optional_fields_are_accepted():
    update = parse_client_frame(frame("CONTEXT_UPDATE", {
        "url": None, "title": None, "activeTools": None, "context": None}), max_bytes=MAX)
    assert (update.payload.url, update.payload.title) == ("", "")
    assert (update.payload.activeTools, update.payload.context) == ([], {})
    init = parse_client_frame(frame("HANDSHAKE_INIT", {"apiKey": None, "protocolVersion": "1.0.0"}),
                              max_bytes=MAX)
    assert init.payload.apiKey is None
    interrupt = parse_client_frame(frame("VOICE_INTERRUPT", {"reason": None}), max_bytes=MAX)
    assert interrupt.payload.reason == "barge_in"
    result = parse_client_frame(frame("TOOL_RESULT", {
        "callId": "c", "status": "error", "result": None, "error": "boom"}), max_bytes=MAX)
    assert result.payload.result is None and result.payload.error == "boom"


def test_null_meta_is_read_as_no_meta():
    message = parse_client_frame(frame("VOICE_INTERRUPT", {}, meta=None), max_bytes=MAX)
    assert message.meta is None


def test_a_fractional_timestamp_is_kept_as_whole_milliseconds():
    message = parse_client_frame(frame("VOICE_INTERRUPT", {}, timestamp=1706000000000.75),
                                 max_bytes=MAX)
    assert message.timestamp == 1706000000000 and isinstance(message.timestamp, int)


def test_bytes_frames_are_decoded_as_utf8():
    text = frame("USER_INPUT", {"modality": "text", "content": "café ☕"})
    message = parse_client_frame(text.encode("utf-8"), max_bytes=MAX)
    assert message.payload.content == "café ☕"


# --- each error code ----------------------------------------------------------------


def test_a_frame_over_the_limit_is_too_large_counted_in_utf8_bytes():
    text = frame("USER_INPUT", {"modality": "text", "content": "é" * 100})
    size = len(text.encode("utf-8"))
    assert len(text) < size
    assert parse_client_frame(text, max_bytes=size).payload.content == "é" * 100
    error = client_error(text, max_bytes=size - 1)
    assert error.code == "too_large"
    assert client_error(text.encode("utf-8"), max_bytes=size - 1).code == "too_large"


def test_size_is_checked_before_the_json():
    assert client_error("x" * 200, max_bytes=100).code == "too_large"


@pytest.mark.parametrize("text", [
    "", "not json", "{", '{"id": "a",}', "NaN", '{"timestamp": Infinity}',
], ids=["empty", "words", "truncated", "trailing-comma", "nan", "infinity"])
def test_text_that_is_not_json_is_invalid_json(text):
    error = client_error(text, max_bytes=10_000_000)
    assert error.code == "invalid_json"
    assert error.message_id is None


@pytest.mark.parametrize(("text", "code"), [
    ('{"t": 1e400}', "invalid_number"),
    ('{"n": ' + "9" * 5000 + "}", "invalid_number"),
    ("[" * 100_000 + "]" * 100_000, "too_deep"),
], ids=["overflow", "huge-integer", "deep-nesting"])
def test_json_no_later_layer_could_hold_gets_its_own_code(text, code):
    assert client_error(text, max_bytes=10_000_000).code == code


def test_bytes_that_are_not_utf8_are_invalid_json():
    error = client_error(b'{"id":"\xff"}')
    assert (error.code, error.message) == ("invalid_json", "frame is not valid utf-8")


@pytest.mark.parametrize("text,fragment", [
    ("[]", "json object"),
    ('"HANDSHAKE_INIT"', "json object"),
    (json.dumps({"type": "VOICE_INTERRUPT", "timestamp": 1, "payload": {}}), "'id'"),
    (json.dumps({"id": "", "type": "VOICE_INTERRUPT", "timestamp": 1, "payload": {}}), "'id'"),
    (json.dumps({"id": 7, "type": "VOICE_INTERRUPT", "timestamp": 1, "payload": {}}), "'id'"),
    (json.dumps({"id": "a", "timestamp": 1, "payload": {}}), "'type'"),
    (json.dumps({"id": "a", "type": 3, "timestamp": 1, "payload": {}}), "'type'"),
    (json.dumps({"id": "a", "type": "VOICE_INTERRUPT", "payload": {}}), "'timestamp'"),
    (json.dumps({"id": "a", "type": "VOICE_INTERRUPT", "timestamp": True, "payload": {}}),
     "'timestamp'"),
    (json.dumps({"id": "a", "type": "VOICE_INTERRUPT", "timestamp": "1", "payload": {}}),
     "'timestamp'"),
    (json.dumps({"id": "a", "type": "VOICE_INTERRUPT", "timestamp": 1}), "'payload'"),
    (json.dumps({"id": "a", "type": "VOICE_INTERRUPT", "timestamp": 1, "payload": None}),
     "'payload'"),
    (json.dumps({"id": "a", "type": "VOICE_INTERRUPT", "timestamp": 1, "payload": []}),
     "'payload'"),
    (json.dumps({"id": "a", "type": "VOICE_INTERRUPT", "timestamp": 1, "payload": {},
                 "meta": []}), "'meta'"),
    (json.dumps({"id": "a", "type": "VOICE_INTERRUPT", "timestamp": 1, "payload": {},
                 "meta": "x"}), "'meta'"),
])
def test_a_broken_envelope_is_an_invalid_message_naming_the_field(text, fragment):
    error = client_error(text)
    assert error.code == "invalid_message"
    assert fragment in error.message


def test_an_invalid_envelope_still_reports_the_readable_id_and_type():
    error = client_error(json.dumps({"id": "msg_9", "type": "USER_INPUT", "timestamp": 1}))
    assert (error.message_id, error.type) == ("msg_9", "USER_INPUT")


def test_a_type_outside_the_fourteen_is_unknown_type():
    error = client_error(frame("HANDSHAKE_NACK", {}))
    assert error.code == "unknown_type"
    assert (error.message_id, error.type) == ("msg_1", "HANDSHAKE_NACK")
    assert client_error(frame("handshake_init", {"protocolVersion": "1.0.0"})).code == "unknown_type"


def test_an_unknown_type_is_echoed_back_shortened():
    error = client_error(frame("X" * 5000, {}))
    assert error.code == "unknown_type"
    assert len(error.type) == 64 and len(error.message) < 120


@pytest.mark.parametrize("message_type", sorted(SERVER_TYPES - CLIENT_TYPES))
def test_a_client_sending_a_server_only_type_is_wrong_direction(message_type):
    text = serialize(make_message(message_type, FULL_PAYLOADS[message_type]))
    error = client_error(text)
    assert error.code == "wrong_direction"
    assert error.type == message_type.value


@pytest.mark.parametrize("message_type", sorted(CLIENT_TYPES - SERVER_TYPES))
def test_a_server_sending_a_client_only_type_is_wrong_direction(message_type):
    text = serialize(make_message(message_type, FULL_PAYLOADS[message_type]))
    with pytest.raises(ProtocolError) as info:
        parse_server_frame(text)
    assert info.value.code == "wrong_direction"


def test_wrong_direction_is_reported_before_the_payload_is_checked():
    assert client_error(frame("TOOL_CALL", {})).code == "wrong_direction"


@pytest.mark.parametrize("type_,payload,message", [
    ("TOOL_RESULT", {"status": "success"}, "field 'payload.callId' is required"),
    ("TOOL_RESULT", {"callId": "", "status": "success"}, "field 'payload.callId' must not be empty"),
    ("TOOL_RESULT", {"callId": "c", "status": "done"},
     "field 'payload.status' must be 'success', 'error' or 'pending_approval'"),
    ("APPROVAL_RESPONSE", {"callId": "c", "approved": "true"},
     "field 'payload.approved' must be a boolean"),
    ("APPROVAL_RESPONSE", {"callId": "c", "approved": 1},
     "field 'payload.approved' must be a boolean"),
    ("APPROVAL_RESPONSE", {"callId": "c", "approved": None},
     "field 'payload.approved' must be a boolean"),
    ("APPROVAL_REQUEST", {"callId": "c", "toolName": "t", "risk": "severe", "args": {},
                          "message": "m"}, "field 'payload.risk' must be"),
    ("APPROVAL_REQUEST", {"callId": "c", "toolName": "t", "risk": "high", "args": [],
                          "message": "m"}, "field 'payload.args' must be an object"),
    ("APPROVAL_REQUEST", {"callId": "c", "toolName": "t", "risk": "high", "args": {},
                          "message": ""}, "field 'payload.message' must not be empty"),
    ("USER_INPUT", {"modality": "video", "content": "x"}, "field 'payload.modality' must be"),
    ("USER_INPUT", {"modality": "text", "content": 5}, "field 'payload.content' must be a string"),
    ("USER_INPUT", {"modality": "text"}, "field 'payload.content' is required"),
    ("HANDSHAKE_INIT", {}, "field 'payload.protocolVersion' is required"),
    ("HANDSHAKE_INIT", {"protocolVersion": 1}, "field 'payload.protocolVersion' must be a string"),
    ("CONTEXT_UPDATE", {"activeTools": [{"name": "a"}, "b"]},
     "field 'payload.activeTools[1]' must be an object"),
    ("CONTEXT_UPDATE", {"activeTools": {}}, "field 'payload.activeTools' must be a list"),
    ("CONTEXT_UPDATE", {"context": "page"}, "field 'payload.context' must be an object"),
    ("VOICE_INPUT_END", {"reason": "bored"}, "field 'payload.reason' must be"),
    ("AUDIO_STREAM", {"data": None}, "field 'payload.data' must be a string"),
])
def test_a_payload_failing_its_model_is_an_invalid_message_with_a_short_reason(type_, payload,
                                                                                message):
    error = client_error(frame(type_, payload))
    assert error.code == "invalid_message"
    assert error.message.startswith(message)
    assert (error.message_id, error.type) == ("msg_1", type_)
    assert "Input should" not in error.message and "pydantic" not in error.message.lower()


def test_server_side_payload_checks_are_strict_about_integers():
    for value in (True, "30", 0, -1, 1.5):
        payload = dict(FULL_PAYLOADS[MessageType.HANDSHAKE_ACK], maxActiveTools=value)
        with pytest.raises(ProtocolError) as info:
            parse_server_frame(frame("HANDSHAKE_ACK", payload))
        assert info.value.code == "invalid_message"
        assert "maxActiveTools" in info.value.message


def test_protocol_error_carries_its_message_as_text():
    error = ProtocolError("too_large", "frame is larger than 10 bytes", message_id="m", type="T")
    assert str(error) == "frame is larger than 10 bytes"
    assert (error.code, error.message_id, error.type) == ("too_large", "m", "T")


# --- serialization ------------------------------------------------------------------


def test_serialization_is_compact_and_keeps_non_ascii_text():
    text = serialize(make_message(MessageType.AGENT_RESPONSE, {"chunk": "Ça coûte 5 €", "done": True},
                                  id="msg_a", now_ms=5))
    assert text == ('{"id":"msg_a","type":"AGENT_RESPONSE","timestamp":5,'
                    '"payload":{"chunk":"Ça coûte 5 €","done":true}}')


def test_serialization_never_contains_null_for_absent_optional_fields():
    messages = [
        make_message(MessageType.SYSTEM_EVENT, {"kind": "waiting", "message": None, "data": None}),
        make_message(MessageType.VOICE_STATE_EVENT, {"event": "turn_complete", "reason": None}),
        make_message(MessageType.HANDSHAKE_ACK, dict(MINIMAL_PAYLOADS[MessageType.HANDSHAKE_ACK],
                                                     maxActiveTools=None)),
        make_message(MessageType.AUDIO_STREAM, {"data": "AA==", "mimeType": None}),
        make_message(MessageType.TOOL_RESULT, {"callId": "c", "status": "success",
                                               "result": None, "error": None}),
        make_message(MessageType.APPROVAL_RESPONSE, {"callId": "c", "approved": False,
                                                     "result": None, "error": None}),
        make_message(MessageType.HANDSHAKE_INIT, {"protocolVersion": "1.0.0", "apiKey": None,
                                                  "userAgent": None, "viewport": None,
                                                  "sdkVersion": None}),
        make_message(MessageType.USER_INPUT, {"modality": "text", "content": "x",
                                              "mimeType": None}),
        system_event("reload"), voice_state("waiting_for_input"),
        handshake_ack("s", "0.4.0", ["text"], None), error_event("bad", "bad thing", callId=None),
    ]
    for message in messages:
        text = serialize(message)
        nulls = [path for path, value in walk(json.loads(text)) if value is None]
        assert nulls == [], text
        assert '"meta"' not in text


def test_nulls_inside_arguments_are_data_and_are_kept():
    message = tool_call("tc_1", "set_filter", {"color": None, "sizes": [None, "M"]})
    assert json.loads(serialize(message))["payload"]["args"] == {"color": None, "sizes": [None, "M"]}


def test_meta_is_written_when_given():
    message = make_message(MessageType.AGENT_RESPONSE, {"chunk": "", "done": True},
                           meta={"sessionId": "ses_1"})
    assert json.loads(serialize(message))["meta"] == {"sessionId": "ses_1"}


def test_a_lone_surrogate_in_a_frame_we_send_is_written_as_valid_utf8():
    # Clients cannot send one (invalid_text), but model text could hold one.
    echoed = agent_response("x\ud800y", True)
    text = serialize(echoed)
    text.encode("utf-8")  # must not raise
    assert parse_server_frame(text).payload.chunk == "x\ud800y"


def test_serializing_a_non_finite_number_is_refused():
    with pytest.raises(ValueError):
        serialize(tool_call("tc_1", "t", {"x": float("nan")}))


# --- building messages ----------------------------------------------------------------


def test_make_message_gives_a_uuid_id_and_the_current_time_by_default():
    before = protocol.time.time() * 1000
    message = make_message(MessageType.AGENT_RESPONSE, {"chunk": "a", "done": False})
    assert re.fullmatch(r"msg_[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}",
                        message.id)
    assert int(before) <= message.timestamp
    assert make_message(MessageType.AGENT_RESPONSE, {"chunk": "a", "done": False}).id != message.id


def test_make_message_uses_the_given_id_and_clock():
    message = make_message("AGENT_RESPONSE", {"chunk": "a", "done": False}, id="msg_fixed",
                           now_ms=42)
    assert (message.type, message.id, message.timestamp) == (MessageType.AGENT_RESPONSE,
                                                             "msg_fixed", 42)


def test_make_message_validates_dict_payloads():
    with pytest.raises(ValueError):
        make_message(MessageType.TOOL_CALL, {"callId": "c", "name": "n", "args": None})
    with pytest.raises(ValueError):
        make_message(MessageType.AGENT_RESPONSE, {"chunk": "a", "done": "yes"})


def test_make_message_refuses_a_payload_model_of_another_type():
    with pytest.raises(TypeError):
        make_message(MessageType.TOOL_CALL, protocol.AgentResponse(chunk="a", done=True))


def test_messages_and_payloads_are_immutable():
    message = agent_response("a", False)
    with pytest.raises(AttributeError):
        message.id = "other"
    with pytest.raises(ValueError):
        message.payload.chunk = "b"


# --- convenience constructors ------------------------------------------------------------


def test_system_event_refuses_a_kind_outside_the_spec():
    with pytest.raises(ValueError):
        system_event("warning", "careful")


def test_system_event_passes_meta_and_clock_through():
    message = system_event("redirect", data={"url": "/cart"}, meta={"sessionId": "s"}, now_ms=7)
    assert (message.meta, message.timestamp) == ({"sessionId": "s"}, 7)
    assert message.payload.data == {"url": "/cart"}


def test_error_event_puts_the_code_in_data_and_drops_empty_extras():
    message = error_event("invalid_message", "field 'payload.callId' is required",
                          messageId="msg_9", callId=None)
    payload = assert_client_accepts(serialize(message))["payload"]
    assert payload == {"kind": "error", "message": "field 'payload.callId' is required",
                       "data": {"code": "invalid_message", "messageId": "msg_9"}}


def test_handshake_ack_announces_our_protocol_version_and_the_tool_limit():
    payload = assert_client_accepts(serialize(handshake_ack("ses_1", "0.4.0", ("text", "tools"), 30)))[
        "payload"]
    assert payload == {"sessionId": "ses_1", "serverVersion": "0.4.0", "protocolVersion": "1.0.0",
                       "capabilities": ["text", "tools"], "maxActiveTools": 30}


def test_handshake_ack_without_a_limit_omits_the_field():
    payload = json.loads(serialize(handshake_ack("ses_1", "0.4.0", ["text"], None)))["payload"]
    assert "maxActiveTools" not in payload


@pytest.mark.parametrize("bad", [0, True, "30"])
def test_handshake_ack_refuses_a_limit_the_client_would_reject(bad):
    with pytest.raises(ValueError):
        handshake_ack("ses_1", "0.4.0", ["text"], bad)


def test_approval_request_accepts_a_risk_enum_and_sends_its_value():
    message = approval_request("tc_1", "process_payment", Risk.CRITICAL, {"amount": 1},
                               "Pay 1 USD?")
    payload = assert_client_accepts(serialize(message))["payload"]
    assert payload["risk"] == "critical"


def test_approval_request_refuses_an_empty_message():
    with pytest.raises(ValueError):
        approval_request("tc_1", "process_payment", "high", {}, "")


def test_constructors_build_frames_the_client_accepts():
    frames = [
        agent_response("", True), agent_response("partial", False),
        tool_call("tc_1", "add_to_cart", {"quantity": 2}),
        voice_state("interrupted", "barge_in"), voice_state("turn_complete"),
        system_event("transcript", data={"role": "user", "text": "hi"}),
        system_event("approval_required", "Approve the payment?"),
        error_event("usage_limit", "API key usage limit exceeded."),
    ]
    for message in frames:
        parsed = assert_client_accepts(serialize(message))
        assert parsed["type"] == message.type.value


# --- the client-side check itself (tests/wire.py) ---------------------------------------


# Frames the deployed client drops, with a word of the reason the wire check gives.
DROPPED_FRAMES = [
    (frame("SYSTEM_EVENT", {"kind": "reload"}, meta=None), "meta"),
    (frame("SYSTEM_EVENT", {"kind": "error", "message": None}), "payload.message is null"),
    (frame("VOICE_STATE_EVENT", {"event": "interrupted", "reason": None}), "payload.reason is null"),
    (frame("SYSTEM_EVENT", {"kind": "warning"}), "payload.kind"),
    (frame("SYSTEM_EVENT", {"kind": "error", "data": []}), "payload.data"),
    (frame("SYSTEM_EVENT", {"kind": "error", "data": None}), "payload.data is null"),
    (frame("HANDSHAKE_ACK", dict(FULL_PAYLOADS[MessageType.HANDSHAKE_ACK], maxActiveTools=0)),
     "maxActiveTools"),
    (frame("HANDSHAKE_ACK", dict(FULL_PAYLOADS[MessageType.HANDSHAKE_ACK], maxActiveTools=True)),
     "maxActiveTools"),
    (frame("HANDSHAKE_ACK", dict(FULL_PAYLOADS[MessageType.HANDSHAKE_ACK], maxActiveTools="30")),
     "maxActiveTools"),
    (frame("HANDSHAKE_ACK", dict(FULL_PAYLOADS[MessageType.HANDSHAKE_ACK], maxActiveTools=2.5)),
     "maxActiveTools"),
    (frame("TOOL_CALL", {"callId": "c", "name": "n", "args": None}), "payload.args"),
    (frame("TOOL_CALL", {"callId": "c", "name": "n", "args": [1]}), "payload.args"),
    (frame("APPROVAL_REQUEST", dict(FULL_PAYLOADS[MessageType.APPROVAL_REQUEST], message="")),
     "payload.message"),
    (frame("APPROVAL_REQUEST", dict(FULL_PAYLOADS[MessageType.APPROVAL_REQUEST], args=[])),
     "payload.args"),
    (frame("AGENT_RESPONSE", {"chunk": "a"}), "payload.done is missing"),
    (frame("AGENT_RESPONSE", {"chunk": "a", "done": 1}), "payload.done"),
    (frame("HANDSHAKE_NACK", {}), "unknown type"),
    (frame("USER_INPUT", {"modality": "text", "content": "x"}), "not sent by a server"),
    (frame("AGENT_RESPONSE", {"chunk": "a", "done": True}, id=""), "id"),
    (frame("AGENT_RESPONSE", {"chunk": "a", "done": True}, timestamp="1"), "timestamp"),
    (json.dumps({"id": "a", "type": "AGENT_RESPONSE", "timestamp": 1, "payload": None}), "payload"),
    ("{nope", "json"),
]


@pytest.mark.parametrize("text,reason", DROPPED_FRAMES)
def test_the_wire_check_rejects_what_the_deployed_client_drops(text, reason):
    rejection = client_rejection(text)
    assert rejection is not None and reason in rejection
    with pytest.raises(AssertionError):
        assert_client_accepts(text)


def test_the_wire_check_accepts_unknown_payload_keys_and_a_null_tool_result():
    assert_client_accepts(frame("SYSTEM_EVENT", {"kind": "error", "message": "x",
                                                 "data": {"code": "c"}, "extra": 1}))
    assert_client_accepts(frame("TOOL_RESULT", {"callId": "c", "status": "success",
                                                "result": None}), from_server=False)
    assert_client_accepts(frame("HANDSHAKE_ACK", dict(FULL_PAYLOADS[MessageType.HANDSHAKE_ACK],
                                                      maxActiveTools=30.0)))

