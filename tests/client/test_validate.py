"""The strict frame checks, against the protocol's JSON Schema, refuse what the
deployed browser client drops (protocol.md §1)."""
from __future__ import annotations

import pytest

from aitp_client.validate import InvalidFrame, check_frame, frame_problems, wire_schema

TS = 1_706_000_000_000


def frame(frame_type: str, payload: dict, **envelope) -> dict:
    return {"id": "msg_1", "type": frame_type, "timestamp": TS, "payload": payload, **envelope}


GOOD_SERVER_FRAMES = [
    frame(
        "HANDSHAKE_ACK",
        {
            "sessionId": "ses_1",
            "serverVersion": "0.4.0",
            "protocolVersion": "1.0.0",
            "capabilities": ["text", "tools"],
            "maxActiveTools": 30,
        },
    ),
    frame("TOOL_CALL", {"callId": "tc_1", "name": "add_to_cart", "args": {"quantity": 2}}),
    frame(
        "APPROVAL_REQUEST",
        {"callId": "tc_2", "toolName": "pay", "risk": "critical", "args": {}, "message": "Pay?"},
    ),
    frame("AGENT_RESPONSE", {"chunk": "", "done": True}),
    frame("AUDIO_STREAM", {"data": "AAAA", "mimeType": "audio/pcm;rate=24000"}),
    frame("VOICE_STATE_EVENT", {"event": "interrupted", "reason": "barge_in"}),
    frame("SYSTEM_EVENT", {"kind": "error", "message": "bad key", "data": {"code": "invalid_key"}}),
    frame("SYSTEM_EVENT", {"kind": "transcript", "data": {"role": "agent", "text": "hi"}}),
    frame("SYSTEM_EVENT", {"kind": "waiting"}, meta={"sessionId": "ses_1"}),
]


@pytest.mark.parametrize("good", GOOD_SERVER_FRAMES, ids=lambda f: f["type"])
def test_accepts_every_well_formed_server_frame(good):
    assert frame_problems(good) == []
    assert check_frame(good) is good


def test_accepts_unknown_keys_inside_a_payload_because_the_client_strips_them():
    extra = frame("SYSTEM_EVENT", {"kind": "error", "message": "x", "extra": {"any": 1}})

    assert frame_problems(extra) == []


@pytest.mark.parametrize(
    "bad, problem",
    [
        (frame("SYSTEM_EVENT", {"kind": "error", "message": None}), "payload.message: None"),
        (frame("VOICE_STATE_EVENT", {"event": "interrupted", "reason": None}), "payload.reason: None"),
        (frame("SYSTEM_EVENT", {"kind": "waiting"}, meta=None), "meta: None is not of type 'object'"),
        (frame("AGENT_RESPONSE", {"chunk": None, "done": True}), "payload.chunk: None"),
    ],
)
def test_refuses_null_where_an_optional_field_would_be(bad, problem):
    problems = frame_problems(bad)

    assert any(p.startswith(problem) for p in problems), problems


def test_refuses_a_type_outside_the_fourteen():
    problems = frame_problems(frame("AGENT_THOUGHT", {}))

    assert "type: 'AGENT_THOUGHT' is not one of ['HANDSHAKE_INIT', 'HANDSHAKE_ACK'," in " ".join(problems)


def test_refuses_a_type_only_the_client_sends_when_it_comes_from_the_server():
    [problem] = frame_problems(frame("USER_INPUT", {"modality": "text", "content": "hi"}))

    assert problem.startswith("type: 'USER_INPUT' is not one of ['HANDSHAKE_ACK',")


def test_refuses_a_system_event_kind_outside_the_spec():
    problems = frame_problems(frame("SYSTEM_EVENT", {"kind": "warning", "message": "x"}))

    assert len(problems) == 1 and problems[0].startswith("payload.kind: 'warning' is not one of")


@pytest.mark.parametrize("value", [0, -1, 1.5, True, "30", [30]])
def test_refuses_a_max_active_tools_that_is_not_an_integer_of_at_least_one(value):
    ack = dict(GOOD_SERVER_FRAMES[0])
    ack["payload"] = {**ack["payload"], "maxActiveTools": value}

    problems = frame_problems(ack)

    assert len(problems) == 1 and problems[0].startswith("payload.maxActiveTools"), problems


@pytest.mark.parametrize("args", [None, [], "quantity=2", 2])
def test_refuses_tool_call_args_that_are_not_an_object(args):
    call = frame("TOOL_CALL", {"callId": "tc_1", "name": "t", "args": args})

    assert any("payload.args" in p for p in frame_problems(call))


def test_refuses_approval_request_args_that_are_an_array():
    request = frame(
        "APPROVAL_REQUEST",
        {"callId": "tc_1", "toolName": "t", "risk": "high", "args": [], "message": "ok?"},
    )

    assert frame_problems(request) == ["payload.args: [] is not of type 'object'"]


def test_refuses_an_approval_request_with_an_empty_message():
    request = frame(
        "APPROVAL_REQUEST",
        {"callId": "tc_1", "toolName": "t", "risk": "high", "args": {}, "message": ""},
    )

    assert frame_problems(request) == ["payload.message: '' should be non-empty"]


def test_refuses_system_event_data_that_is_not_an_object():
    event = frame("SYSTEM_EVENT", {"kind": "tools_effective", "data": ["a"]})

    assert frame_problems(event) == ["payload.data: ['a'] is not of type 'object'"]


@pytest.mark.parametrize(
    "envelope_fields, problem",
    [
        ({"id": ""}, "id: '' should be non-empty"),
        ({"id": 7}, "id: 7 is not of type 'string'"),
        ({"timestamp": "1706000000000"}, "timestamp: '1706000000000' is not of type 'number'"),
        ({"payload": []}, "payload: [] is not of type 'object'"),
    ],
)
def test_refuses_a_broken_envelope(envelope_fields, problem):
    bad = {**frame("AGENT_RESPONSE", {"chunk": "a", "done": False}), **envelope_fields}

    assert any(p.startswith(problem) for p in frame_problems(bad)), frame_problems(bad)


def test_refuses_a_frame_that_is_not_an_object():
    assert frame_problems([1, 2]) == ["frame: [1, 2] is not of type 'object'"]


def test_refuses_an_agent_response_without_done():
    assert frame_problems(frame("AGENT_RESPONSE", {"chunk": "hi"})) == [
        "payload: 'done' is a required property"
    ]


def test_check_frame_raises_with_every_problem_listed():
    bad = frame("TOOL_CALL", {"callId": "", "name": "t", "args": None})

    with pytest.raises(InvalidFrame) as caught:
        check_frame(bad)

    assert caught.value.problems == [
        "payload.args: None is not of type 'object'",
        "payload.callId: '' should be non-empty",
    ]


def test_accepts_a_client_tool_result_whose_result_is_null():
    result = frame(
        "TOOL_RESULT", {"callId": "tc_1", "status": "error", "result": None, "error": "boom"}
    )

    assert frame_problems(result, sender="client") == []


def test_refuses_a_client_tool_declaration_with_an_unknown_risk():
    update = frame(
        "CONTEXT_UPDATE",
        {
            "url": "/",
            "title": "Home",
            "activeTools": [{"name": "t", "description": "d", "risk": "medium"}],
            "context": {},
        },
    )

    assert frame_problems(update, sender="client") == [
        "payload.activeTools[0].risk: 'medium' is not one of ['none', 'low', 'high', 'critical']"
    ]


def test_the_schema_is_the_one_checked_in_beside_the_servers_models():
    from aitp.wire_schema import load

    assert wire_schema() == load()
