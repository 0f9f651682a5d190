"""Speech starts with the first complete sentence, stays in order, and stops at once on a barge-in."""
from __future__ import annotations

import asyncio

import pytest

from aitp.voice.audio import AGENT_RATE
from aitp.voice.base import Audio, SpeechError
from speech.offline import EspeakTts
from speech.pipeline import SpeechPipeline
from speech.speaking import SpokenProgress

from .conftest import espeak_config, needs_espeak


class ScriptedTts:
    """A text-to-speech engine whose syntheses finish when the test says so."""

    name = "scripted"

    def __init__(self) -> None:
        self.asked: list[str] = []
        self.cancelled: list[str] = []
        self.release: dict[str, asyncio.Event] = {}
        self.fail: set[str] = set()

    async def synthesize(self, text: str, *, owner=None) -> Audio:
        self.asked.append(text)
        gate = self.release.setdefault(text, asyncio.Event())
        try:
            await gate.wait()
        except asyncio.CancelledError:
            self.cancelled.append(text)
            raise
        if text in self.fail:
            raise SpeechError("speech_failed", detail="scripted failure")
        return Audio(text.encode("utf-8").ljust(2 * len(text), b"\0"), AGENT_RATE)

    def finish(self, *texts: str) -> None:
        for text in texts:
            self.release.setdefault(text, asyncio.Event()).set()


async def next_spoken(iterator):
    return await asyncio.wait_for(anext(iterator), timeout=30)


async def test_the_first_sentence_is_spoken_before_the_model_has_finished():
    tts = ScriptedTts()
    tts.finish("Your headphones are in the cart.")
    pipeline = SpeechPipeline(tts)
    spoken = pipeline.spoken()
    pipeline.feed("Your headphones are in the cart. The total is")
    sentence, audio = await next_spoken(spoken)
    assert sentence.text == "Your headphones are in the cart."
    assert audio.rate == AGENT_RATE
    assert tts.asked == ["Your headphones are in the cart."], "the unfinished sentence waits"
    pipeline.cancel()


async def test_sentences_come_out_in_order_even_when_a_later_one_is_ready_first():
    tts = ScriptedTts()
    pipeline = SpeechPipeline(tts, prefetch=3)
    spoken = pipeline.spoken()
    pipeline.feed("One. Two. Three. ")
    pipeline.finish()
    tts.finish("Three.", "Two.")
    await asyncio.sleep(0)
    tts.finish("One.")
    texts = [sentence.text async for sentence, _ in spoken]
    assert texts == ["One.", "Two.", "Three."]


async def test_no_more_sentences_are_synthesized_ahead_than_the_prefetch():
    tts = ScriptedTts()
    pipeline = SpeechPipeline(tts, prefetch=2)
    spoken = pipeline.spoken()
    pipeline.feed("One. Two. Three. Four. Five. ")
    await asyncio.sleep(0)
    assert tts.asked == ["One.", "Two."]
    tts.finish("One.")
    await next_spoken(spoken)
    await asyncio.sleep(0)
    assert tts.asked == ["One.", "Two.", "Three."]
    pipeline.cancel()


async def test_a_barge_in_stops_the_speech_and_cancels_what_was_synthesizing():
    tts = ScriptedTts()
    tts.finish("One.")
    pipeline = SpeechPipeline(tts, prefetch=2)
    spoken = pipeline.spoken()
    pipeline.feed("One. Two. Three. ")
    await next_spoken(spoken)
    waiting = asyncio.ensure_future(next_spoken(spoken))
    await asyncio.sleep(0)
    pipeline.cancel()
    with pytest.raises(StopAsyncIteration):
        await waiting
    assert "Two." in tts.cancelled
    with pytest.raises(RuntimeError):
        pipeline.feed("more")


async def test_an_engine_failure_is_raised_for_its_sentence_and_nothing_after_it_is_spoken():
    tts = ScriptedTts()
    tts.fail.add("Two.")
    tts.finish("One.", "Two.")
    pipeline = SpeechPipeline(tts, prefetch=2)
    spoken = pipeline.spoken()
    pipeline.feed("One. Two. Three. ")
    pipeline.finish()
    assert (await next_spoken(spoken))[0].text == "One."
    with pytest.raises(SpeechError):
        await next_spoken(spoken)
    assert "Three." not in tts.asked or "Three." in tts.cancelled


async def test_the_cut_point_follows_the_audio_sent_from_the_pipeline():
    tts = ScriptedTts()
    tts.finish("First sentence here.", "Second one follows.")
    pipeline = SpeechPipeline(tts)
    progress = SpokenProgress()
    spoken = pipeline.spoken()
    pipeline.feed("First sentence here. Second one follows.")
    pipeline.finish()
    sentence, audio = await next_spoken(spoken)
    progress.queue(sentence, len(audio.pcm))
    progress.sent(len(audio.pcm))
    assert progress.spoken_text(pipeline.text) == "First sentence here."


@needs_espeak
async def test_espeak_speaks_the_first_sentence_while_the_model_is_still_writing():
    pipeline = SpeechPipeline(EspeakTts(espeak_config()))
    spoken = pipeline.spoken()
    for word in ["I", "added", "two", "Pro", "Headphones", "to", "your", "cart.", "Anything"]:
        pipeline.feed(word + " ")
    sentence, audio = await next_spoken(spoken)
    assert sentence.text == "I added two Pro Headphones to your cart."
    assert audio.rate == AGENT_RATE and audio.seconds > 1.0
    pipeline.feed("else?")
    pipeline.finish()
    rest = [sentence.text async for sentence, _ in spoken]
    assert rest == ["Anything else?"]
