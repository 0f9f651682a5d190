"""The voice side of an agent turn: hearing the user, speaking the answer.

A voice turn is the ordinary turn (``agent.loop``) with two ends added:
- ``Listening`` is one utterance on its way in: the live microphone's chunks
  in an ``UtteranceBuffer`` until VOICE_INPUT_END, the server's VAD, the
  longest utterance or a stalled stream (the idle deadline) ends it -- or a
  whole USER_INPUT audio message, already complete. ``hear()`` transcribes it
  (offline engines: in the process's speech workers, counted against the
  page's API key, its ``owner``) and tells the page what was heard
  (SYSTEM_EVENT transcript, role "user").
- ``Speaker`` takes the model's text as it streams, has each sentence
  synthesized as soon as it is complete (``SpeechPipeline``), and sends its
  audio as AUDIO_STREAM frames in order, each sentence announced by its
  transcript fragment (role "agent"). ``SpokenProgress`` follows what was
  sent, so a barge-in (``stop()``) knows where the user stopped hearing.
A SpeechError becomes the page's error event with its code (and its data:
the bound that refused); the turn goes on (or ends) as text.

What a voice turn leaves in the record: ``audio_usage`` (milliseconds of
the utterance heard and of the agent's audio actually sent, counted with the
turn's tokens) and ``voice_record`` (the stored copy of a message marked as
heard, said, or said until a barge-in interrupted it; the model's copy is
left as it is).
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Hashable

from aitp import protocol as p
from aitp.turn import TurnEvent
from aitp.voice.audio import AGENT_RATE, agent_chunks, agent_payload
from aitp.voice.base import SAMPLE_WIDTH, Audio, Transcription
from runtime.config import config
from speech import SpeechError, get_stt, get_tts
from speech.pipeline import SpeechPipeline
from speech.speaking import SpokenProgress
from speech.utterance import Utterance, UtteranceBuffer, VoiceLimits

logger = logging.getLogger(__name__)

Send = Callable[[p.Message], Awaitable[None]]
# The turn's port (``TurnIO.send``): frames, and where the turn is.
TurnSend = Callable[[p.Message | TurnEvent], Awaitable[None]]

NO_SPEECH = "I didn't catch that. Please try again."


def _now() -> float:
    return asyncio.get_running_loop().time()


class Listening:
    """One user utterance: live chunks until it ends, or a whole audio message."""

    def __init__(self, limits: VoiceLimits | None = None, *, audio: Audio | None = None,
                 owner: Hashable | None = None) -> None:
        self._audio = audio
        # Whose speech allowance the turn's speech jobs count against (the API key).
        self.owner = owner
        self.buffer = None if audio is not None else UtteranceBuffer(limits or config().voice.limits, _now())
        self._changed = asyncio.Event()
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

    async def hear(self, send: TurnSend) -> tuple[str, Transcription | None]:
        """The words of the utterance, sent to the page as the user's
        transcript; the turn is told the moment the utterance is over.

        ("", None) when the engine failed or nothing was heard: the page was
        told why, with an error event.
        """
        utterance = await self.wait()
        await send(TurnEvent.HEARD)
        logger.info("utterance ended (%s): %.1f s of audio%s", utterance.reason, utterance.audio.seconds,
                    ", cut at the longest utterance" if utterance.truncated else "")
        if not utterance.audio.pcm:
            await send(p.error_event("empty_audio", "No audio was received."))
            return "", None
        try:
            heard = await get_stt().transcribe(utterance.audio, owner=self.owner)
        except SpeechError as exc:
            logger.warning("transcription failed: %s", exc)
            await send(p.error_event(exc.code, exc.message, **exc.data))
            return "", None
        text = heard.text.strip()
        if not text:
            if heard.noise:
                logger.info("utterance heard as noise only: no words kept")
            await send(p.error_event("no_speech", NO_SPEECH))
            return "", heard
        await send(p.system_event("transcript", data={"role": "user", "text": text}))
        return text, heard


class Speaker:
    """The agent's answer spoken while the model writes it."""

    def __init__(self, send: Send, *, ahead: float | None = None, owner: Hashable | None = None) -> None:
        self._send = send
        self.pipeline = SpeechPipeline(get_tts(), owner=owner)
        self.progress = SpokenProgress()
        self.stopped = False
        self.failed: SpeechError | None = None
        self.sent_bytes = 0  # of audio sent (24 kHz 16-bit mono)
        # How far the audio sent may run ahead of the page's playback (0: not
        # paced). Paced, a barge-in finds the rest of the answer unsent, and
        # what is stored as said is what was played, give or take this much.
        if ahead is None:
            ahead = config().voice.send_ahead_seconds
        self._ahead = ahead
        # When the page will have played everything sent so far.
        self._played_by: float | None = None
        self._task = asyncio.create_task(self._speak())

    @property
    def seconds(self) -> float:
        """Of audio sent: a barge-in stops the count with the voice."""
        return self.sent_bytes / (SAMPLE_WIDTH * AGENT_RATE)

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
                    await self._keep_pace()
                    if self.stopped:
                        return
                    # Counted as it is handed over: the connection queues a
                    # frame before its first pause (its ``send``), so a
                    # barge-in cancelling this await no longer stops it.
                    self.progress.sent(len(chunk))
                    self.sent_bytes += len(chunk)
                    now = _now()
                    self._played_by = max(self._played_by or now, now) + (
                        len(chunk) / (SAMPLE_WIDTH * AGENT_RATE))
                    await self._send(p.make_message(p.MessageType.AUDIO_STREAM, agent_payload(chunk)))
        except SpeechError as exc:
            logger.warning("speech synthesis failed: %s", exc)
            self.failed = exc
            await self._send(p.error_event(exc.code, exc.message, **exc.data))

    async def _keep_pace(self) -> None:
        """Wait until the page has at most ``ahead`` seconds of what was sent
        left to play. Its playback starts with the first frame and resumes
        with the next after a pause (a tool call, a slow sentence)."""
        if self._ahead <= 0 or self._played_by is None:
            return
        wait = self._played_by - self._ahead - _now()
        if wait > 0:
            await asyncio.sleep(wait)


# --- what a voice turn leaves in the record ---------------------------------------

# The "voice" mark on a stored text block (aitp.transcript reads it).
HEARD = "heard"  # the user's words, transcribed from their speech
SAID = "said"  # the agent's words, spoken
INTERRUPTED = "interrupted"  # spoken until the user spoke over it: the text ends where the voice stopped


def audio_usage(voice: Listening | None, speaker: Speaker | None) -> dict[str, int] | None:
    """The turn's audio, in milliseconds, for its session and its tenant's
    day: the utterance heard (once it ended) and the agent's audio sent.
    None for a typed turn."""
    if voice is None:
        return None
    heard = voice.utterance.audio.seconds if voice.utterance is not None else 0.0
    spoken = speaker.seconds if speaker is not None else 0.0
    return {"audio_heard_ms": round(heard * 1000), "audio_spoken_ms": round(spoken * 1000)}


def voice_record(role: str, content: list[dict], speaker: Speaker, *, interrupted: bool) -> list[dict]:
    """The stored copy of a voice turn's message: the user's words marked
    heard; the agent's text marked said, or interrupted for the message a
    barge-in cut (stored as far as it was said). Text the voice failed to
    say is left unmarked. New blocks: the model's copy keeps none of this."""
    if role == "user":
        # The words come first, the page's description after (agent.loop).
        first = content[0] if content else None
        if isinstance(first, dict) and first.get("type") == "text":
            return [{**first, "voice": HEARD}, *content[1:]]
        return content  # tool results
    if speaker.failed is not None and not interrupted:
        return content
    mark = INTERRUPTED if interrupted else SAID
    return [{**block, "voice": mark} if isinstance(block, dict) and block.get("type") == "text" else block
            for block in content]
