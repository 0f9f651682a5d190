"""The voice side of an agent turn: hearing the user, speaking the answer.

A voice turn is the ordinary turn (``aitp.agent``) with two ends added:
- ``Listening`` is one utterance on its way in: the live microphone's chunks
  in an ``UtteranceBuffer`` until VOICE_INPUT_END, the server's VAD, the
  longest utterance or a stalled stream (the idle deadline) ends it -- or a
  whole USER_INPUT audio message, already complete. ``hear()`` transcribes it
  in the speech pool and tells the page what was heard (SYSTEM_EVENT
  transcript, role "user").
- ``Speaker`` takes the model's text as it streams, has each sentence
  synthesized as soon as it is complete (``SpeechPipeline``), and sends its
  audio as AUDIO_STREAM frames in order, each sentence announced by its
  transcript fragment (role "agent"). ``SpokenProgress`` follows what was
  sent, so a barge-in (``stop()``) knows where the user stopped hearing.
A SpeechError becomes the page's error event with its code; the turn goes on
(or ends) as text.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from aitp import protocol as p
from aitp.voice import SpeechError, get_stt, get_tts
from aitp.voice.audio import agent_chunks, agent_payload
from aitp.voice.base import Audio, Transcription
from aitp.voice.pipeline import SpeechPipeline
from aitp.voice.speaking import SpokenProgress
from aitp.voice.utterance import Utterance, UtteranceBuffer, VoiceLimits

logger = logging.getLogger(__name__)

Send = Callable[[p.Message], Awaitable[None]]

NO_SPEECH = "I didn't catch that. Please try again."


def _now() -> float:
    return asyncio.get_running_loop().time()


class Listening:
    """One user utterance: live chunks until it ends, or a whole audio message."""

    def __init__(self, limits: VoiceLimits | None = None, *, audio: Audio | None = None) -> None:
        self._audio = audio
        self.buffer = None if audio is not None else UtteranceBuffer(limits or VoiceLimits.from_settings(), _now())
        self._changed = asyncio.Event()
        # Set once a turn has taken this utterance (the consumer's bookkeeping).
        self.claimed = False
        self.utterance: Utterance | None = None

    @property
    def over(self) -> bool:
        """No more audio belongs to this utterance."""
        return self.buffer is None or self.buffer.end_reason is not None

    def add(self, pcm: bytes) -> None:
        if self.buffer is not None and self.buffer.append(pcm, _now()) is not None:
            self._changed.set()

    def end(self, reason: str) -> None:
        """VOICE_INPUT_END: the first reason given, ours or the page's, is the one kept."""
        if self.buffer is not None and self.buffer.end_reason is None:
            self.buffer.end(reason)
            self._changed.set()

    async def wait(self) -> Utterance:
        """The utterance, once it is over (a stalled stream ends it at the idle deadline)."""
        if self.buffer is None:
            assert self._audio is not None
            self.utterance = Utterance(self._audio, "user_stop")
            return self.utterance
        while self.buffer.end_reason is None:
            self._changed.clear()
            delay = self.buffer.idle_deadline() - _now()
            if delay > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), delay)
            else:
                self.buffer.idle(_now())
        self.utterance = self.buffer.end(self.buffer.end_reason)
        return self.utterance

    async def hear(self, send: Send) -> tuple[str, Transcription | None]:
        """The words of the utterance, sent to the page as the user's transcript.

        ("", None) when the engine failed or nothing was heard: the page was
        told why, with an error event.
        """
        utterance = await self.wait()
        logger.info("utterance ended (%s): %.1f s of audio%s", utterance.reason, utterance.audio.seconds,
                    ", cut at the longest utterance" if utterance.truncated else "")
        if not utterance.audio.pcm:
            await send(p.error_event("empty_audio", "No audio was received."))
            return "", None
        try:
            heard = await get_stt().transcribe(utterance.audio)
        except SpeechError as exc:
            logger.warning("transcription failed: %s", exc)
            await send(p.error_event(exc.code, exc.message))
            return "", None
        text = heard.text.strip()
        if not text:
            await send(p.error_event("no_speech", NO_SPEECH))
            return "", heard
        await send(p.system_event("transcript", data={"role": "user", "text": text}))
        return text, heard


class Speaker:
    """The agent's answer spoken while the model writes it."""

    def __init__(self, send: Send) -> None:
        self._send = send
        self.pipeline = SpeechPipeline(get_tts())
        self.progress = SpokenProgress()
        self.stopped = False
        self.failed: SpeechError | None = None
        self.seconds = 0.0  # of audio sent
        self._task = asyncio.create_task(self._speak())

    def feed(self, text: str) -> None:
        if self.stopped or self.failed is not None:
            return
        with contextlib.suppress(RuntimeError):  # the pipeline stopped on an engine failure
            self.pipeline.feed(text)

    async def finish(self) -> None:
        """Every sentence of the finished answer sent."""
        self.pipeline.finish()
        await asyncio.shield(self._task)

    def stop(self) -> None:
        """Barge-in: not one more frame, nothing more synthesized."""
        self.stopped = True
        self.pipeline.cancel()
        self._task.cancel()

    async def aclose(self) -> None:
        if not self._task.done():
            self.stop()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task

    def spoken_text(self, full_text: str) -> str:
        """The part of full_text the user heard."""
        return self.progress.spoken_text(full_text)

    async def _speak(self) -> None:
        try:
            async for sentence, audio in self.pipeline.spoken():
                chunks = agent_chunks(audio)
                self.progress.queue(sentence, sum(len(chunk) for chunk in chunks))
                if self.stopped:
                    return
                await self._send(p.system_event("transcript", data={"role": "agent", "text": sentence.text}))
                for chunk in chunks:
                    if self.stopped:
                        return
                    await self._send(p.make_message(p.MessageType.AUDIO_STREAM, agent_payload(chunk)))
                    self.progress.sent(len(chunk))
                    self.seconds += len(chunk) / (2 * 24000)
        except SpeechError as exc:
            logger.warning("speech synthesis failed: %s", exc)
            self.failed = exc
            await self._send(p.error_event(exc.code, exc.message))
