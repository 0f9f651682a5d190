"""The fake speech server answers as OpenAI's audio endpoints do, so the hosted tests mean something."""
from __future__ import annotations

import io
import wave

import httpx
import pytest

from tests.support.fake_speech import SPEECH_RATE, FakeSpeechServer

KEY = "sk-fake"


@pytest.fixture
def server():
    with FakeSpeechServer(api_key=KEY, default_transcript="hello there") as fake:
        yield fake


def wav(seconds: float = 0.5, rate: int = 16000) -> bytes:
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as writer:
        writer.setnchannels(1)
        writer.setsampwidth(2)
        writer.setframerate(rate)
        writer.writeframes(b"\0\0" * int(seconds * rate))
    return buffer.getvalue()


def post(server, path, **kwargs) -> httpx.Response:
    return httpx.post(server.base_url + path, headers={"Authorization": f"Bearer {KEY}"},
                      timeout=30, **kwargs)


@pytest.mark.parametrize("response_format, expected", [
    ("json", {"text": "hello there"}),
    ("verbose_json", {"task": "transcribe", "language": "english", "duration": 0.5,
                      "text": "hello there", "segments": []}),
])
def test_a_transcription_answers_in_the_format_asked(server, response_format, expected):
    reply = post(server, "/audio/transcriptions", files={"file": ("a.wav", wav(), "audio/wav")},
                 data={"model": "whisper-1", "response_format": response_format})
    assert reply.status_code == 200
    assert reply.json() == expected


def test_a_plain_text_transcription_is_the_words_alone(server):
    reply = post(server, "/audio/transcriptions", files={"file": ("a.wav", wav(), "audio/wav")},
                 data={"model": "whisper-1", "response_format": "text"})
    assert (reply.status_code, reply.text) == (200, "hello there")


@pytest.mark.parametrize("files, data, param", [
    ({"file": ("a.wav", wav(), "audio/wav")}, {}, "model"),
    ({"model": (None, "whisper-1")}, {}, "file"),
    ({"file": ("a.mp3", b"ID3 not a wav", "audio/mpeg")}, {"model": "whisper-1"}, "file"),
])
def test_a_transcription_missing_a_part_is_a_400_naming_it(server, files, data, param):
    reply = post(server, "/audio/transcriptions", files=files, data=data)
    assert reply.status_code == 400
    assert reply.json()["error"]["param"] == param
    assert reply.json()["error"]["type"] == "invalid_request_error"


def test_a_transcription_that_is_not_multipart_is_refused(server):
    reply = post(server, "/audio/transcriptions", data={"model": "whisper-1"})
    assert reply.status_code == 400
    assert "multipart/form-data" in reply.json()["error"]["message"]


def test_speech_as_wav_is_a_24_khz_mono_file(server):
    reply = post(server, "/audio/speech", json={"model": "tts-1", "input": "Hi.", "voice": "alloy",
                                               "response_format": "wav"})
    assert reply.status_code == 200
    with wave.open(io.BytesIO(reply.content)) as reader:
        assert (reader.getframerate(), reader.getnchannels()) == (SPEECH_RATE, 1)


def test_speech_without_input_or_in_an_unknown_format_is_refused(server):
    missing = post(server, "/audio/speech", json={"model": "tts-1", "voice": "alloy"})
    assert (missing.status_code, missing.json()["error"]["param"]) == (400, "input")
    unknown = post(server, "/audio/speech", json={"model": "tts-1", "input": "Hi.", "voice": "alloy",
                                                 "response_format": "midi"})
    assert (unknown.status_code, unknown.json()["error"]["param"]) == (400, "response_format")


def test_a_request_without_the_key_is_a_401_and_an_unknown_path_a_404(server):
    anonymous = httpx.post(server.base_url + "/audio/speech", json={}, timeout=30)
    assert (anonymous.status_code, anonymous.json()["error"]["code"]) == (401, "invalid_api_key")
    assert post(server, "/audio/translations", json={}).status_code == 404
