"""What operators watching a voice session are told: the page's and the
agent's audio as its length, never its samples, and every other frame as it
was sent. Pure."""
from __future__ import annotations

import base64
import json

from aitp import protocol as p
from aitp.session import (
    AudioChunkReceived,
    UserAudioReceived,
    UserTextReceived,
    VoiceInputEnded,
    VoiceInterrupted,
)
from aitp.voice.base import Audio
from aitp.watch_feed import describe_inbound, describe_outbound


def frame(type_: str, payload: dict) -> str:
    return json.dumps({"id": "msg_1", "type": type_, "timestamp": 1706000000000, "payload": payload})


def test_watchers_are_told_the_voice_messages_from_the_page_with_audio_as_its_length():
    said = [
        (AudioChunkReceived(b"\0\0" * 4000), frame("AUDIO_STREAM", {"data": "AAAA" * 2000})),
        (UserAudioReceived(Audio(b"\0\0" * 8000, 16000)),
         frame("USER_INPUT", {"modality": "audio", "content": "AAAA" * 4000})),
        (VoiceInputEnded("vad"), frame("VOICE_INPUT_END", {"reason": "vad"})),
        (VoiceInterrupted("barge_in"), frame("VOICE_INTERRUPT", {"reason": "barge_in"}).encode()),
    ]
    described = [json.loads(describe_inbound(event, text)) for event, text in said]
    for told in described[2:]:
        del told["id"], told["timestamp"]
    assert described == [
        {"type": "AUDIO_STREAM", "payload": {"mimeType": "audio/pcm;rate=16000", "bytes": 8000, "seconds": 0.25}},
        {"type": "USER_INPUT", "payload": {"modality": "audio", "mimeType": "audio/pcm;rate=16000",
                                           "bytes": 16000, "seconds": 0.5}},
        {"type": "VOICE_INPUT_END", "payload": {"reason": "vad"}},
        {"type": "VOICE_INTERRUPT", "payload": {"reason": "barge_in"}},
    ]


def test_watchers_are_told_the_agents_audio_as_its_length_and_every_other_frame_as_sent():
    chunk = b"\1\0" * 6000  # 0.25 s at 24 kHz
    audio = p.serialize(p.make_message(p.MessageType.AUDIO_STREAM, {
        "data": base64.b64encode(chunk).decode(), "mimeType": "audio/pcm;rate=24000"}))
    told = json.loads(describe_outbound(audio))
    assert told["type"] == "AUDIO_STREAM"
    assert told["payload"] == {"mimeType": "audio/pcm;rate=24000", "bytes": 12000, "seconds": 0.25}
    said = p.serialize(p.system_event("transcript", data={"role": "agent", "text": "Sure."}))
    assert describe_outbound(said) == said


def test_watchers_are_told_every_other_frame_from_the_page_as_it_was_sent():
    sent = frame("USER_INPUT", {"modality": "text", "content": "Where is my order?", "extra": 1})
    assert describe_inbound(UserTextReceived("Where is my order?"), sent) == sent
