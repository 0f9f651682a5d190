"""The sans-I/O session machine: every state, every transition, no I/O.

Runs without Django: the machine is pure.
"""
from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from aitp import protocol as p
from aitp.session import (
    ApprovalRequestReceived,
    ApprovalResponseReceived,
    ContextChanged,
    HandshakeRequested,
    Limits,
    SessionMachine,
    State,
    ToolResultReceived,
    UserTextReceived,
)
from aitp.tools import Risk, ToolSpec
from aitp.turn import TurnEvent

KEY = "pk_live_abcdefgh12345678"


def frame(type_: str, payload: dict) -> str:
    return json.dumps({"id": "msg_1", "type": type_, "timestamp": 1, "payload": payload})


def init(**overrides) -> str:
    return frame("HANDSHAKE_INIT", {"apiKey": KEY, "protocolVersion": "1.0.0", **overrides})


def machine(**kw) -> SessionMachine:
    return SessionMachine(limits=Limits(**kw), server_version="0.4.0")


def sent(m: SessionMachine) -> list[dict]:
    return [json.loads(text) for text in m.data_to_send()]


def opened(**kw) -> SessionMachine:
    m = machine(**kw)
    m.receive_text(init())
    m.accept_handshake("ses_1")
    m.data_to_send()
    return m


TOOL = {"name": "add_to_cart", "description": "Add it", "risk": "low",
        "parameters": {"type": "OBJECT", "properties": {"quantity": {"type": "NUMBER"}}}}


class TestHandshake:
    def test_a_valid_init_asks_the_consumer_to_check_the_key(self):
        m = machine()
        events = m.receive_text(init(userAgent="ua"))
        assert events == [HandshakeRequested(api_key=KEY, init=events[0].init)]
        assert events[0].init.userAgent == "ua"
        assert m.state is State.AWAITING_HANDSHAKE and m.handshake_pending
        assert m.data_to_send() == []

    def test_accepting_sends_the_ack_and_opens(self):
        m = machine(max_active_tools=12)
        m.receive_text(init())
        m.accept_handshake("ses_x")
        [ack] = sent(m)
        assert ack["type"] == "HANDSHAKE_ACK"
        assert ack["payload"] == {
            "sessionId": "ses_x", "serverVersion": "0.4.0", "protocolVersion": "1.0.0",
            "capabilities": ["text", "tools"], "maxActiveTools": 12,
        }
        assert m.state is State.OPEN

    def test_the_key_from_the_query_string_is_used_when_the_init_has_none(self):
        m = SessionMachine(limits=Limits(), server_version="0", query_api_key=KEY)
        [event] = m.receive_text(frame("HANDSHAKE_INIT", {"protocolVersion": "1.0.0"}))
        assert event.api_key == KEY

    def test_two_different_keys_are_refused_with_1008(self):
        m = SessionMachine(limits=Limits(), server_version="0", query_api_key="pk_live_other")
        assert m.receive_text(init()) == []
        [error] = sent(m)
        assert error["payload"]["data"]["code"] == "api_key_mismatch"
        assert m.state is State.CLOSED and m.close.code == 1008

    def test_no_key_at_all_is_refused(self):
        m = machine()
        m.receive_text(frame("HANDSHAKE_INIT", {"protocolVersion": "1.0.0"}))
        assert sent(m)[0]["payload"]["data"]["code"] == "missing_api_key"
        assert m.close.code == 1008

    @pytest.mark.parametrize("version", ["1.0", "1.0.1", "2.0.0", " 1.0.0"])
    def test_the_protocol_version_is_compared_strictly(self, version):
        m = machine()
        m.receive_text(init(protocolVersion=version))
        assert sent(m)[0]["payload"]["data"]["code"] == "protocol_version_mismatch"
        assert m.close.code == 1008 and m.close.reason == "protocol version mismatch"

    def test_any_other_message_first_gets_handshake_required(self):
        m = machine()
        assert m.receive_text(frame("USER_INPUT", {"modality": "text", "content": "hi"})) == []
        assert sent(m)[0]["payload"]["data"]["code"] == "handshake_required"
        assert m.state is State.AWAITING_HANDSHAKE

    def test_a_second_init_after_opening_is_an_error_that_keeps_the_session(self):
        m = opened()
        m.receive_text(init())
        assert sent(m)[0]["payload"]["data"]["code"] == "already_open"
        assert m.state is State.OPEN

    def test_the_handshake_timeout_refuses_only_while_waiting(self):
        m = machine()
        m.handshake_timed_out()
        assert sent(m)[0]["payload"]["data"]["code"] == "handshake_timeout"
        assert m.close.code == 1008
        later = opened()
        later.handshake_timed_out()
        assert later.state is State.OPEN and later.data_to_send() == []

    def test_a_refusal_after_the_key_lookup_closes_with_the_reason(self):
        m = machine()
        m.receive_text(init())
        m.refuse("api_key_revoked", "This API key has been revoked.", "api key revoked")
        assert sent(m)[0]["payload"]["message"] == "This API key has been revoked."
        assert (m.close.code, m.close.reason) == (1008, "api key revoked")

    def test_close_reasons_are_cut_to_123_bytes(self):
        m = machine()
        m.refuse("x", "y", "é" * 100)
        assert len(m.close.reason.encode()) <= 123


class TestOpen:
    def test_a_context_update_is_accepted_and_answered_with_tools_effective(self):
        m = opened()
        [event] = m.receive_text(frame("CONTEXT_UPDATE", {
            "url": "/p", "title": "P", "activeTools": [TOOL], "context": {"a": 1}}))
        assert isinstance(event, ContextChanged)
        assert event.url == "/p" and event.context == {"a": 1}
        assert [t.name for t in event.tools] == ["add_to_cart"]
        [effective] = sent(m)
        assert effective["payload"]["kind"] == "tools_effective"
        assert effective["payload"]["data"]["effectiveTools"][0]["name"] == "add_to_cart"

    def test_server_tools_shadow_page_tools_of_the_same_name(self):
        m = opened()
        m.set_server_tools((ToolSpec("add_to_cart", "server side", None, Risk.NONE, "server"),))
        m.receive_text(frame("CONTEXT_UPDATE", {"activeTools": [TOOL]}))
        data = sent(m)[0]["payload"]["data"]
        assert [t["name"] for t in data["serverTools"]] == ["add_to_cart"]
        assert [t["name"] for t in data["ignoredClientTools"]] == ["add_to_cart"]
        assert m.surface.get("add_to_cart").origin == "server"

    def test_a_server_tool_json_cannot_write_is_still_sent_in_tools_effective(self):
        m = opened()
        odd = {"type": "OBJECT", "properties": {}, "x-since": datetime(2026, 1, 2, tzinfo=UTC)}
        m.set_server_tools((ToolSpec("lookup", "server side", odd, Risk.NONE, "server"),))
        [event] = m.receive_text(frame("CONTEXT_UPDATE", {"activeTools": [TOOL]}))
        data = sent(m)[0]["payload"]["data"]
        assert data["serverTools"][0]["parameters"]["x-since"] == "2026-01-02T00:00:00Z"
        assert [t["name"] for t in data["effectiveTools"]] == ["lookup", "add_to_cart"]
        assert json.loads(event.tools_json) == data["clientTools"]

    def test_a_refused_context_keeps_the_previous_snapshot(self):
        m = opened(max_active_tools=1, max_context_bytes=100)
        m.receive_text(frame("CONTEXT_UPDATE", {"url": "/a", "activeTools": [TOOL]}))
        m.data_to_send()
        two = [TOOL, dict(TOOL, name="other")]
        assert m.receive_text(frame("CONTEXT_UPDATE", {"url": "/b", "activeTools": two})) == []
        assert sent(m)[0]["payload"]["data"]["code"] == "too_many_tools"
        assert m.receive_text(frame("CONTEXT_UPDATE", {"url": "/c", "context": {"x": "y" * 200}})) == []
        assert sent(m)[0]["payload"]["data"]["code"] == "context_too_large"
        assert m.url == "/a" and [t.name for t in m.client_tools] == ["add_to_cart"]

    def test_user_text_starts_a_turn_and_a_second_one_is_refused_until_it_ends(self):
        m = opened()
        assert m.receive_text(frame("USER_INPUT", {"modality": "text", "content": "hi"})) == [
            UserTextReceived("hi")]
        assert m.receive_text(frame("USER_INPUT", {"modality": "text", "content": "again"})) == []
        assert sent(m)[0]["payload"]["data"]["code"] == "turn_in_progress"
        m.turn.step(TurnEvent.DONE)
        assert m.receive_text(frame("USER_INPUT", {"modality": "text", "content": "again"})) == [
            UserTextReceived("again")]

    @pytest.mark.parametrize("content, code", [("   ", "empty_input"), ("a" * 11, "input_too_long")])
    def test_unusable_text_is_refused_with_its_code(self, content, code):
        m = opened(max_input_chars=10)
        assert m.receive_text(frame("USER_INPUT", {"modality": "text", "content": content})) == []
        assert sent(m)[0]["payload"]["data"]["code"] == code
        assert not m.turn.busy

    def test_tool_and_approval_answers_become_events(self):
        m = opened()
        [a] = m.receive_text(frame("TOOL_RESULT", {"callId": "tc_1", "status": "success", "result": None}))
        [b] = m.receive_text(frame("APPROVAL_REQUEST", {
            "callId": "tc_1", "toolName": "pay", "risk": "high", "args": {}, "message": "Pay?"}))
        [c] = m.receive_text(frame("APPROVAL_RESPONSE", {"callId": "tc_1", "approved": False}))
        assert isinstance(a, ToolResultReceived) and a.result.callId == "tc_1"
        assert isinstance(b, ApprovalRequestReceived) and b.request.toolName == "pay"
        assert isinstance(c, ApprovalResponseReceived) and c.response.approved is False

    @pytest.mark.parametrize("type_, payload", [
        ("AUDIO_STREAM", {"data": "AAAA"}),
        ("VOICE_INPUT_END", {"reason": "vad"}),
        ("VOICE_INTERRUPT", {"reason": "barge_in"}),
        ("USER_INPUT", {"modality": "audio", "content": "AAAA", "mimeType": "audio/wav"}),
    ])
    def test_voice_messages_get_voice_unavailable_without_a_voice_backend(self, type_, payload):
        m = opened()
        assert m.receive_text(frame(type_, payload)) == []
        assert sent(m)[0]["payload"]["data"]["code"] == "voice_unavailable"
        assert m.state is State.OPEN

    def test_invalid_frames_carry_the_offending_message_id(self):
        m = opened()
        m.receive_text(json.dumps({"id": "msg_bad", "type": "TOOL_RESULT", "timestamp": 1, "payload": {}}))
        error = sent(m)[0]["payload"]
        assert error["data"] == {"code": "invalid_message", "messageId": "msg_bad"}

    def test_the_invalid_frame_counter_resets_on_a_valid_frame(self):
        m = opened(max_invalid_frames=3)
        for _ in range(2):
            m.receive_text("nope")
        m.receive_text(frame("CONTEXT_UPDATE", {}))
        for _ in range(2):
            m.receive_text("nope")
        assert m.state is State.OPEN
        m.receive_text("nope")
        assert m.state is State.CLOSED and m.close.code == 1008

    def test_nothing_is_sent_or_received_once_closed(self):
        m = opened()
        m.close_now(1000, "bye")
        m.send(p.agent_response("late", True))
        assert m.data_to_send() == []
        assert m.receive_text(frame("USER_INPUT", {"modality": "text", "content": "hi"})) == []

    def test_every_frame_the_machine_sends_passes_the_client_schema(self):
        from tests.wire import assert_client_accepts

        m = machine()
        m.receive_text("garbage")
        m.receive_text(init())
        m.accept_handshake("ses_1")
        m.receive_text(frame("CONTEXT_UPDATE", {"activeTools": [TOOL]}))
        m.receive_text(frame("AUDIO_STREAM", {"data": "AAAA"}))
        m.refuse("x", "bye", "bye")
        texts = m.data_to_send()
        assert len(texts) == 5
        for text in texts:
            assert_client_accepts(text)


class TestARefusedUserInputEndsItsTurn:
    """The deployed client waits for AGENT_RESPONSE done after every USER_INPUT
    it sends: a USER_INPUT that starts no turn gets its error, then an empty done."""

    VOICE = ("text", "audio", "tools")
    PCM = "AQABAA=="  # two samples of 16-bit PCM

    @pytest.mark.parametrize("capabilities, payload, code", [
        (("text", "tools"), {"modality": "text", "content": "   "}, "empty_input"),
        (("text", "tools"), {"modality": "text", "content": "a" * 11}, "input_too_long"),
        (("text", "tools"), {"modality": "text"}, "invalid_message"),
        (("text", "tools"), {"modality": "text", "content": "a\u0000b"}, "invalid_text"),
        (("text", "tools"), {"modality": "audio", "content": PCM, "mimeType": "audio/wav"},
         "voice_unavailable"),
        (VOICE, {"modality": "audio", "content": PCM, "mimeType": "audio/ogg"},
         "unsupported_audio_type"),
        (VOICE, {"modality": "audio", "content": PCM, "mimeType": "audio/pcm;rate=4000"},
         "unsupported_audio_rate"),
        (VOICE, {"modality": "audio", "content": "not base64!", "mimeType": "audio/pcm;rate=16000"},
         "invalid_audio"),
    ])
    def test_each_refusal_is_followed_by_an_empty_done(self, capabilities, payload, code):
        m = SessionMachine(limits=Limits(max_input_chars=10), server_version="0.4.0",
                           capabilities=capabilities)
        m.receive_text(init())
        m.accept_handshake("ses_1")
        m.data_to_send()
        assert m.receive_text(frame("USER_INPUT", payload)) == []
        error, done = sent(m)
        assert error["payload"]["data"]["code"] == code
        assert (done["type"], done["payload"]) == ("AGENT_RESPONSE", {"chunk": "", "done": True})
        assert not m.turn.busy and m.state is State.OPEN

    @pytest.mark.parametrize("text, code", [
        (frame("USER_INPUT", {"modality": "text", "content": "a" * 400}), "too_large"),
        (frame("USER_INPUT", {"modality": "text", "content": "cut"})[:-2], "invalid_json"),
        (frame("USER_INPUT", {"modality": "text", "content": "x"}).replace('"x"', '"x", "n": 1e999'),
         "invalid_number"),
        ('{"id": "m", "type": "USER_INPUT", "timestamp": 1, "payload": {"modality": "text", '
         '"content": "x", "n": ' + "[" * 40 + "]" * 40 + "}}", "too_deep"),
    ])
    def test_a_user_input_too_large_or_too_broken_to_parse_is_followed_by_an_empty_done(self, text, code):
        m = opened(max_message_bytes=300, max_json_depth=16)
        assert m.receive_text(text) == []
        error, done = sent(m)
        assert error["payload"]["data"]["code"] == code
        assert (done["type"], done["payload"]) == ("AGENT_RESPONSE", {"chunk": "", "done": True})

    def test_a_frame_too_large_to_parse_that_is_no_user_input_gets_no_done(self):
        m = opened(max_message_bytes=300)
        m.receive_text(frame("CONTEXT_UPDATE", {"url": "/", "context": {"said": "USER_INPUT" * 40}}))
        assert [f["type"] for f in sent(m)] == ["SYSTEM_EVENT"]

    @pytest.mark.parametrize("payload", [
        {"modality": "text", "content": "   "},
        {"modality": "text"},
        {"modality": "text", "content": "again"},
    ])
    def test_while_a_turn_runs_its_own_done_ends_the_wait_and_no_other_is_sent(self, payload):
        m = opened(max_input_chars=10)
        m.receive_text(frame("USER_INPUT", {"modality": "text", "content": "hi"}))
        m.data_to_send()
        assert m.receive_text(frame("USER_INPUT", payload)) == []
        assert [f["type"] for f in sent(m)] == ["SYSTEM_EVENT"]
        assert m.turn.busy

    def test_other_refused_frames_get_no_done(self):
        m = opened()
        m.receive_text(frame("TOOL_RESULT", {"callId": "tc_1"}))
        m.receive_text(frame("CONTEXT_UPDATE", {"url": 5}))
        assert [f["type"] for f in sent(m)] == ["SYSTEM_EVENT", "SYSTEM_EVENT"]


class TestContextLimits:
    """OWLLAYER_MAX_ACTIVE_TOOLS and OWLLAYER_MAX_CONTEXT_BYTES, as the machine
    holds them: exactly the limit is accepted, one more is refused with what
    was sent, what is allowed, and the frame it answers."""

    def test_exactly_the_tool_limit_is_accepted_and_one_more_is_refused_saying_both_counts(self):
        m = opened(max_active_tools=2)
        two = [TOOL, dict(TOOL, name="other")]
        [changed] = m.receive_text(frame("CONTEXT_UPDATE", {"url": "/a", "title": "A", "activeTools": two}))
        assert [t.name for t in changed.tools] == ["add_to_cart", "other"]
        m.data_to_send()

        assert m.receive_text(frame("CONTEXT_UPDATE", {"activeTools": [*two, dict(TOOL, name="third")]})) == []
        [error] = sent(m)
        assert error["payload"]["message"] == "3 tools declared; at most 2 are allowed"
        assert error["payload"]["data"] == {"code": "too_many_tools", "messageId": "msg_1"}

    def test_a_context_of_exactly_the_byte_limit_is_accepted_and_one_byte_more_is_refused(self):
        context = {"x": "y" * 10}  # {"x":"yyyyyyyyyy"} is 18 bytes
        m = opened(max_context_bytes=18)
        assert len(m.receive_text(frame("CONTEXT_UPDATE", {"context": context}))) == 1
        m.data_to_send()

        assert m.receive_text(frame("CONTEXT_UPDATE", {"context": {"x": "y" * 11}})) == []
        [error] = sent(m)
        assert error["payload"]["message"] == "context is 19 bytes; at most 18 are allowed"
        assert error["payload"]["data"] == {"code": "context_too_large", "messageId": "msg_1"}

    def test_a_tool_declaration_that_does_not_parse_is_refused_saying_which_and_why(self):
        m = opened()
        assert m.receive_text(frame("CONTEXT_UPDATE", {"activeTools": [dict(TOOL, description="")]})) == []
        [error] = sent(m)
        assert error["payload"]["message"] == "activeTools[0].description: must be a non-empty string"
        assert error["payload"]["data"] == {"code": "invalid_tool", "messageId": "msg_1"}

    def test_an_accepted_context_hands_the_consumer_its_page_and_the_sessions_surface(self):
        m = opened()
        [changed] = m.receive_text(frame("CONTEXT_UPDATE", {
            "url": "/cart", "title": "Cart", "context": {"items": 2}, "activeTools": [TOOL]}))
        assert (changed.url, changed.title, changed.context) == ("/cart", "Cart", {"items": 2})
        assert changed.surface is m.surface


def test_accepting_records_the_session_id_and_only_follows_an_asked_handshake():
    m = machine()
    with pytest.raises(AssertionError):
        m.accept_handshake("ses_early")
    m.receive_text(init())
    m.accept_handshake("ses_x")
    assert m.session_id == "ses_x"
