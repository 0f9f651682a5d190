"""The hosted pair talks to OpenAI's audio endpoints as they are (a local fake that speaks their API)."""
from __future__ import annotations

import io
import socket
import wave
from dataclasses import replace

import pytest

import speech
from aitp.voice.audio import AGENT_RATE
from aitp.voice.base import Audio, SpeechError
from runtime.config import config as current
from speech.hosted import HostedConfig, HostedStt, HostedTts
from tests.support.fake_speech import SECONDS_PER_CHAR, FakeSpeechServer

KEY = "sk-test-voice"


@pytest.fixture
def fake():
    with FakeSpeechServer(api_key=KEY) as server:
        yield server


def config(server: FakeSpeechServer, **overrides) -> HostedConfig:
    return replace(current().voice.hosted, **{"api_key": KEY, "base_url": server.base_url, **overrides})


UTTERANCE = Audio(b"\1\0\2\0" * 8000, 16000)  # one second


async def test_an_utterance_is_uploaded_as_a_wav_file_and_its_text_comes_back(fake):
    fake.transcripts.append(" add two headphones ")
    result = await HostedStt(config(fake)).transcribe(UTTERANCE)
    assert result.text == "add two headphones"
    assert result.seconds == 1.0
    request = fake.requests[-1]
    assert request.path == "/v1/audio/transcriptions"
    assert request.api_key == KEY
    assert request.fields == {"model": "gpt-4o-mini-transcribe", "response_format": "json"}
    assert request.file_type == "audio/wav"
    with wave.open(io.BytesIO(request.file_bytes)) as reader:
        assert (reader.getframerate(), reader.getnchannels(), reader.getsampwidth()) == (16000, 1, 2)
        assert reader.readframes(reader.getnframes()) == UTTERANCE.pcm


async def test_a_sentence_comes_back_as_24_khz_pcm_from_the_speech_endpoint(fake):
    text = "Your headphones are in the cart."
    audio = await HostedTts(config(fake, tts_voice="verse")).synthesize(text)
    assert audio.rate == AGENT_RATE
    assert audio.seconds == pytest.approx(SECONDS_PER_CHAR * len(text), abs=0.001)
    request = fake.requests[-1]
    assert request.path == "/v1/audio/speech"
    assert request.fields == {"model": "gpt-4o-mini-tts", "input": text, "voice": "verse",
                              "response_format": "pcm"}


async def test_a_wrong_key_is_reported_as_a_setup_problem_not_retried(fake):
    with pytest.raises(SpeechError) as caught:
        await HostedStt(config(fake, api_key="sk-wrong")).transcribe(UTTERANCE)
    assert (caught.value.code, caught.value.status) == ("speech_auth_failed", 401)
    assert "Incorrect API key" in caught.value.detail
    assert len(fake.requests) == 1


@pytest.mark.parametrize("status, error_type, code", [
    (429, "rate_limit_error", "speech_busy"),
    (500, "server_error", "speech_failed"),
    (503, "server_error", "speech_failed"),
    (400, "invalid_request_error", "speech_rejected"),
])
async def test_each_error_of_the_service_becomes_its_speech_error(fake, status, error_type, code):
    fake.fail_next(status, error_type, "something went wrong upstream")
    with pytest.raises(SpeechError) as caught:
        await HostedTts(config(fake)).synthesize("Hello.")
    assert (caught.value.code, caught.value.status) == (code, status)
    assert "something went wrong upstream" in caught.value.detail
    # The page user sees our sentence, never the upstream text.
    assert "upstream" not in caught.value.message


async def test_no_key_at_all_fails_before_any_request(fake):
    with pytest.raises(SpeechError) as caught:
        await HostedTts(config(fake, api_key="")).synthesize("Hello.")
    assert caught.value.code == "speech_auth_failed"
    assert fake.requests == []


async def test_a_service_that_does_not_answer_in_time_is_a_timeout():
    with FakeSpeechServer(api_key=KEY, delay=5.0) as slow:
        with pytest.raises(SpeechError) as caught:
            await HostedStt(config(slow, timeout=0.5)).transcribe(UTTERANCE)
    assert caught.value.code == "speech_timeout"


async def test_a_service_that_cannot_be_reached_is_unavailable():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    stt = HostedStt(replace(current().voice.hosted, api_key=KEY, base_url=f"http://127.0.0.1:{port}/v1"))
    with pytest.raises(SpeechError) as caught:
        await stt.transcribe(UTTERANCE)
    assert caught.value.code == "speech_unavailable"


def test_settings_choose_the_hosted_pair_and_it_counts_as_available_with_a_key(settings, fake):
    settings.OWLLAYER_STT = settings.OWLLAYER_TTS = "openai"
    settings.OWLLAYER_VOICE_API_KEY = KEY
    settings.OWLLAYER_VOICE_BASE_URL = fake.base_url
    speech.reset_engines()
    try:
        assert isinstance(speech.get_stt(), HostedStt)
        assert isinstance(speech.get_tts(), HostedTts)
        assert speech.get_tts().config.base_url == fake.base_url
        assert speech.audio_available()
    finally:
        speech.reset_engines()
