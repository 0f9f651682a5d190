"""What operators watching a voice session are told: the page's voice
messages and the agent's audio as their length, never their samples, and
every other frame as it was sent. Pure."""
from __future__ import annotations

import base64
import json

from aitp import protocol as p
from aitp.session import AudioChunkReceived, UserAudioReceived, VoiceInputEnded, VoiceInterrupted
from aitp.voice.base import Audio
from aitp.watch_feed import describe_inbound, describe_outbound


def test_watchers_are_told_the_voice_messages_from_the_page_with_audio_as_its_length():
    described = [json.loads(describe_inbound(event)) for event in (
        AudioChunkReceived(b"\0\0" * 4000),
        UserAudioReceived(Audio(b"\0\0" * 8000, 16000)),
        VoiceInputEnded("vad"),
        VoiceInterrupted("barge_in"),
    )]
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
