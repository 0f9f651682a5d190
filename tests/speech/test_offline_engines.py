"""eSpeak NG speaks, PocketSphinx understands, WebRTC's VAD hears the speech end: no network, no account."""
from __future__ import annotations

import asyncio
import os

import pytest

import speech
from aitp.voice.audio import AGENT_RATE, CLIENT_RATE, resample
from aitp.voice.base import Audio, Transcription
from runtime.config import config
from speech import jobs
from speech.offline import (
    EspeakTts,
    PocketSphinxStt,
    synthesize_blocking,
)
from speech.sphinx import voiced_seconds
from speech.utterance import UtteranceBuffer, VoiceLimits
from speech.vad import EndOfSpeech

from .conftest import espeak_config, needs_espeak, room_noise, silence, speak, sphinx_config

pytestmark = needs_espeak

GRAMMAR = """#JSGF V1.0;
grammar shop;
public <command> = (add | remove) (one | two | three) (headphones | speakers) to my cart
                 | what is in my cart;
"""


@pytest.fixture
def grammar(tmp_path):
    path = tmp_path / "shop.gram"
    path.write_text(GRAMMAR)
    return str(path)


async def test_espeak_speech_is_24_khz_pcm_as_long_as_the_sentence():
    audio = await EspeakTts(espeak_config()).synthesize("Your headphones are in the cart.")
    assert audio.rate == AGENT_RATE
    assert len(audio.pcm) % 2 == 0
    assert 1.0 < audio.seconds < 5.0


async def test_a_sentence_starting_with_a_dash_is_spoken_not_taken_as_an_option():
    audio = await EspeakTts(espeak_config()).synthesize("--version two")
    assert audio.seconds > 0.3


# eSpeak's en-us voice at 175 words a minute and more swallows "my cart" for
# this model; a person speaking a command is nearer 130-150.
@pytest.mark.parametrize("words_per_minute", [130, 150])
async def test_spoken_words_are_understood_against_a_grammar(grammar, words_per_minute):
    stt = PocketSphinxStt(sphinx_config(grammar=grammar))
    spoken = speak("add two headphones to my cart", words_per_minute=words_per_minute)
    result = await stt.transcribe(spoken)
    assert result.text == "add two headphones to my cart"
    assert result.seconds == pytest.approx(spoken.seconds)


async def test_the_same_words_at_another_rate_are_resampled_before_they_are_understood(grammar):
    stt = PocketSphinxStt(sphinx_config(grammar=grammar))
    result = await stt.transcribe(speak("remove three speakers to my cart", rate=22050))
    assert result.text == "remove three speakers to my cart"


async def test_the_full_english_model_answers_with_some_words():
    result = await PocketSphinxStt(sphinx_config()).transcribe(speak("hello, what is in my cart"))
    assert isinstance(result.text, str) and result.text.strip()


async def test_silence_is_understood_as_nothing(grammar):
    stt = PocketSphinxStt(sphinx_config(grammar=grammar))
    result = await stt.transcribe(speech.Audio(silence(1.0), CLIENT_RATE))
    assert result.text == ""


def test_the_server_vad_finds_where_espeak_speech_ends_before_the_silence():
    speech = speak("add two headphones to my cart")
    detector = EndOfSpeech(silence_seconds=0.6)
    recording = speech.pcm + silence(3.0)
    chunk = 8192  # the client's 256 ms chunks
    fed = 0
    for start in range(0, len(recording), chunk):
        fed = start + chunk
        if detector.feed(recording[start:fed]):
            break
    assert detector.ended
    assert detector.speech_started
    # It ends where the speech ends (eSpeak trails a little quiet), and only
    # once the configured silence followed it.
    assert speech.seconds - 0.5 < detector.speech_end_seconds <= speech.seconds + 0.1
    heard_seconds = fed / (2 * CLIENT_RATE)
    assert heard_seconds >= detector.speech_end_seconds + 0.6
    assert heard_seconds < speech.seconds + 3.0, "the end is found inside the silence, not at its end"


def test_with_server_vad_an_utterance_ends_as_vad_once_the_user_stops_speaking():
    limits = VoiceLimits(max_utterance_seconds=30, bytes_per_second=64000, idle_seconds=5,
                         server_vad=True, vad_silence_seconds=0.8)
    buffer = UtteranceBuffer(limits, now=0.0)
    recording = speak("what is in my cart").pcm + silence(4.0)
    reasons = [buffer.append(recording[start:start + 8192], now=start / 32000)
               for start in range(0, len(recording), 8192)]
    assert "vad" in reasons
    assert buffer.end("user_stop").reason == "vad"
    assert buffer.seconds < len(recording) / 32000, "the end is found before the silence is over"


def test_the_server_vad_never_ends_an_utterance_that_has_not_started():
    detector = EndOfSpeech(silence_seconds=0.3)
    assert detector.feed(silence(5.0)) is False
    assert not detector.speech_started


def test_the_configured_offline_engines_are_available(settings):
    settings.OWLLAYER_STT, settings.OWLLAYER_TTS = "pocketsphinx", "espeak"
    speech.reset_engines()
    try:
        assert speech.audio_problems() == []
        assert speech.audio_available()
    finally:
        speech.reset_engines()


async def test_the_availability_check_runs_in_a_speech_worker_while_the_loop_goes_on(settings):
    settings.OWLLAYER_STT, settings.OWLLAYER_TTS = "pocketsphinx", "espeak"
    speech.reset_engines()
    jobs.shutdown()
    try:
        checks = [asyncio.ensure_future(speech.audio_problems_async()) for _ in range(3)]
        ticks = 0
        while not all(check.done() for check in checks):
            ticks += 1
            await asyncio.sleep(0.001)
        assert ticks > 1, "the loop ran while the engines were checked"
        assert [check.result() for check in checks] == [[], [], []]
        pool = jobs.get_pool()
        assert pool.pids() and os.getpid() not in pool.pids()
        # Asked together, checked once; remembered afterwards.
        assert len(speech._checks) == 1
        assert await speech.audio_available_async()
    finally:
        speech.reset_engines()
        jobs.shutdown()


def test_voice_is_not_available_when_espeak_ng_is_missing(settings, monkeypatch, tmp_path):
    settings.OWLLAYER_STT, settings.OWLLAYER_TTS = "pocketsphinx", "espeak"
    monkeypatch.setenv("PATH", str(tmp_path))
    speech.reset_engines()
    try:
        assert not speech.audio_available()
        assert any("espeak-ng" in problem for problem in speech.audio_problems())
    finally:
        speech.reset_engines()


async def test_a_long_transcription_leaves_the_event_loop_free():
    stt = PocketSphinxStt(sphinx_config())
    long_utterance = speak("the quick brown fox jumps over the lazy dog and then runs away " * 2)
    assert long_utterance.seconds > 5
    transcription = asyncio.create_task(stt.transcribe(long_utterance))
    # Another session's frame: a short wait on the loop. Were the engine on the
    # loop, the transcription would finish first (or both at once).
    frame = asyncio.create_task(asyncio.sleep(0.05))
    done, _ = await asyncio.wait({transcription, frame}, return_when=asyncio.FIRST_COMPLETED)
    assert done == {frame}
    assert (await transcription).text


# --- noise is not speech -----------------------------------------------------------


@pytest.mark.parametrize("colour", ["white", "pink"])
async def test_four_seconds_of_room_noise_are_heard_as_no_words(colour):
    noise = room_noise(colour, seconds=4.0, seed=6)
    # The full language model alone makes a word or two of it ("thank", "up")...
    assert PocketSphinxStt(sphinx_config()).transcribe_now(noise).text
    # ...which the configured floor of voiced audio drops.
    heard = await PocketSphinxStt(config().voice.pocketsphinx).transcribe(noise)
    assert heard == Transcription("", 4.0, noise=True)


@pytest.mark.parametrize("text, voice, words_per_minute", [
    ("yes", "en-us+f3", 220),
    ("stop", "en-gb", 220),
    ("no", "en-us", 175),
    ("what is in my cart", "en-us", 175),
])
async def test_short_quick_words_are_still_heard_above_the_noise_floor(text, voice, words_per_minute):
    spoken = resample(synthesize_blocking(espeak_config(voice=voice, words_per_minute=words_per_minute), text),
                      CLIENT_RATE)
    utterance = Audio(silence(0.3) + spoken.pcm + silence(0.3), CLIENT_RATE)
    assert voiced_seconds(utterance.pcm) >= config().voice.pocketsphinx.min_voiced_seconds
    heard = await PocketSphinxStt(config().voice.pocketsphinx).transcribe(utterance)
    assert heard.text and not heard.noise
