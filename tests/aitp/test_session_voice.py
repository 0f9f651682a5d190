"""The session machine's voice messages: accepted only when "audio" was offered. Pure."""
from __future__ import annotations

import base64

import pytest

from aitp import protocol as p
from aitp.session import (
    AudioChunkReceived,
    Limits,
    SessionMachine,
    State,
    UserAudioReceived,
    VoiceInputEnded,
    VoiceInterrupted,
)
from aitp.turn import TurnEvent
from tests.aitp.test_session import frame, init, sent

PCM = b"\x01\x00" * 160
CHUNK = {"data": base64.b64encode(PCM).decode(), "mimeType": "audio/pcm;rate=16000"}


def voice_session(**kw) -> SessionMachine:
    m = SessionMachine(limits=Limits(**kw), server_version="0.4.0",
                       capabilities=("text", "audio", "tools"))
    m.receive_text(init())
    m.accept_handshake("ses_1")
    return m


def test_the_ack_offers_audio_when_the_session_has_the_capability():
    m = voice_session()
    [ack] = sent(m)
    assert ack["payload"]["capabilities"] == ["text", "audio", "tools"]


def test_a_microphone_chunk_becomes_its_samples():
    m = voice_session()
    m.data_to_send()
    [event] = m.receive_text(frame("AUDIO_STREAM", CHUNK))
    assert event == AudioChunkReceived(PCM)
    assert sent(m) == []


def test_the_end_of_speech_and_a_barge_in_become_events():
    m = voice_session()
    assert m.receive_text(frame("VOICE_INPUT_END", {"reason": "user_stop"})) == [VoiceInputEnded("user_stop")]
    assert m.receive_text(frame("VOICE_INTERRUPT", {"reason": "barge_in"})) == [VoiceInterrupted("barge_in")]


def test_a_whole_audio_message_starts_a_turn():
    m = voice_session()
    [event] = m.receive_text(frame("USER_INPUT", {"modality": "audio", "content": CHUNK["data"],
                                                  "mimeType": "audio/pcm;rate=16000"}))
    assert isinstance(event, UserAudioReceived) and event.audio.pcm == PCM
    assert m.turn.busy


def test_a_second_audio_message_during_a_turn_is_refused():
    m = voice_session()
    m.turn.step(TurnEvent.UTTERANCE_STARTED)
    m.data_to_send()
    assert m.receive_text(frame("USER_INPUT", {"modality": "audio", "content": CHUNK["data"],
                                               "mimeType": "audio/pcm;rate=16000"})) == []
    assert sent(m)[0]["payload"]["data"]["code"] == "turn_in_progress"


@pytest.mark.parametrize("payload, code", [
    ({"data": CHUNK["data"], "mimeType": "audio/ogg"}, "unsupported_audio_type"),
    ({"data": CHUNK["data"]}, "unsupported_audio_type"),
    ({"data": CHUNK["data"], "mimeType": "audio/pcm;rate=44100"}, "unsupported_audio_rate"),
    ({"data": base64.b64encode(b"\x01\x02\x03").decode(), "mimeType": "audio/pcm;rate=16000"},
     "invalid_audio"),
    ({"data": "not base64!", "mimeType": "audio/pcm;rate=16000"}, "invalid_audio"),
    ({"data": base64.b64encode(b"\0" * 70000).decode(), "mimeType": "audio/pcm;rate=16000"},
     "audio_too_large"),
])
def test_bad_microphone_chunks_get_their_code_and_the_session_stays_open(payload, code):
    m = voice_session()
    m.data_to_send()
    assert m.receive_text(frame("AUDIO_STREAM", payload)) == []
    [error] = sent(m)
    assert error["payload"]["data"] == {"code": code, "messageId": "msg_1"}
    assert m.state is State.OPEN


def test_an_audio_message_over_the_longest_utterance_is_refused():
    m = voice_session(max_audio_seconds=1.0)
    m.data_to_send()
    content = base64.b64encode(b"\0\0" * 16000 * 2).decode()
    assert m.receive_text(frame("USER_INPUT", {"modality": "audio", "content": content,
                                               "mimeType": "audio/pcm;rate=16000"})) == []
    assert sent(m)[0]["payload"]["data"]["code"] == "audio_too_large"
    assert not m.turn.busy


def test_voice_frames_are_never_sent_to_a_session_without_audio():
    m = SessionMachine(limits=Limits(), server_version="0.4.0")
    m.receive_text(init())
    m.accept_handshake("ses_1")
    m.data_to_send()
    m.send(p.voice_state("turn_complete"))
    m.send(p.make_message(p.MessageType.AUDIO_STREAM, {"data": "AAAA", "mimeType": "audio/pcm;rate=24000"}))
    m.send(p.system_event("transcript", data={"role": "agent", "text": "Hi."}))
    assert sent(m) == []


def test_a_voice_session_is_sent_its_voice_frames():
    m = voice_session()
    m.data_to_send()
    m.send(p.voice_state("interrupted", reason="barge_in"))
    m.send(p.system_event("transcript", data={"role": "user", "text": "add two"}))
    assert [f["type"] for f in sent(m)] == ["VOICE_STATE_EVENT", "SYSTEM_EVENT"]
