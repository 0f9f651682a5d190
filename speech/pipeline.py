"""Text to speech while the model is still writing: sentences in, their audio out, in order.

The agent's stream loop calls feed() with each text delta; a sender task
iterates spoken() and sends each sentence's audio as AUDIO_STREAM frames.
A sentence is synthesized as soon as it is complete, with at most `prefetch`
sentences synthesized ahead of the one being sent, so the first audio leaves
while the model writes the rest and a barge-in wastes little work. cancel()
(barge-in, turn cancelled) drops every synthesis not yet sent; a job already
running in a speech worker finishes there and its result is dropped.
"""
from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import AsyncIterator, Hashable

from aitp.voice.base import Audio, TextToSpeech

from .speaking import Sentence, SentenceSplitter

logger = logging.getLogger(__name__)


class SpeechPipeline:
    def __init__(self, tts: TextToSpeech, *, prefetch: int = 2, owner: Hashable | None = None) -> None:
        self.tts = tts
        self.owner = owner  # whose speech allowance the syntheses count against
        self.splitter = SentenceSplitter()
        self._prefetch = max(1, prefetch)
        self._waiting: deque[Sentence] = deque()  # complete, not yet being synthesized
        self._started: deque[tuple[Sentence, asyncio.Task[Audio]]] = deque()
        self._changed = asyncio.Event()
        self._finished = False
        self._cancelled = False

    @property
    def text(self) -> str:
        """All the agent's text fed so far (what SpokenProgress.cut() offsets point into)."""
        return self.splitter.text

    def feed(self, delta: str) -> None:
        """The model wrote more text (call from the event loop)."""
        if self._finished or self._cancelled:
            raise RuntimeError("speech pipeline no longer takes text")
        self._waiting.extend(self.splitter.feed(delta))
        self._start_more()

    def finish(self) -> None:
        """The model is done: the rest of the text is the last sentence."""
        if self._finished or self._cancelled:
            return
        last = self.splitter.flush()
        if last is not None:
            self._waiting.append(last)
        self._finished = True
        self._start_more()

    def cancel(self) -> None:
        """Stop: nothing more is synthesized or handed out."""
        self._cancelled = True
        self._waiting.clear()
        while self._started:
            _, task = self._started.popleft()
            task.cancel()
        self._changed.set()

    async def spoken(self) -> AsyncIterator[tuple[Sentence, Audio]]:
        """Each sentence with its audio, in order, until finish() (or cancel()).

        A SpeechError of the engine is raised here, for the sentence it hit;
        the pipeline is cancelled first, so nothing after it is spoken.
        """
        while not self._cancelled:
            if self._started:
                sentence, task = self._started[0]
                try:
                    audio = await task
                except asyncio.CancelledError:
                    current = asyncio.current_task()
                    # The synthesis was cancelled by cancel(): the pipeline is
                    # over. Our own task being cancelled is never swallowed.
                    if self._cancelled and not (current and current.cancelling()):
                        return
                    raise
                except Exception:
                    self.cancel()
                    raise
                if self._cancelled:
                    return
                self._started.popleft()
                self._start_more()
                yield sentence, audio
            elif self._finished and not self._waiting:
                return
            else:
                self._changed.clear()
                await self._changed.wait()

    def _start_more(self) -> None:
        while self._waiting and len(self._started) < self._prefetch:
            sentence = self._waiting.popleft()
            task = asyncio.ensure_future(self.tts.synthesize(sentence.text, owner=self.owner))
            task.add_done_callback(_log_failure)
            self._started.append((sentence, task))
        self._changed.set()


def _log_failure(task: asyncio.Task) -> None:
    if not task.cancelled() and task.exception() is not None:
        logger.debug("speech synthesis failed: %s", task.exception())
