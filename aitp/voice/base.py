"""The two small interfaces every speech engine speaks, and the shapes they share.

Speech to text takes one utterance of 16-bit mono PCM (any rate) and returns
its words; text to speech takes one sentence and returns 16-bit mono PCM at
24 kHz, the rate the agent's voice has on the wire (an engine that produces
another rate resamples off the event loop). Both are
async: offline engines run their work in the process's pool of speech worker
processes (speech/jobs.py), hosted ones await HTTP. Each call names its
``owner`` (the page's API key), whose share of the pool speech/allowance.py
bounds; an engine without a pool takes it and ignores it. Kept free of
Django, like aitp/llm.py, so the voice turn can be tested with a
hand-written engine. The engines themselves live above this app, in speech/.
"""
from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import Protocol

SAMPLE_WIDTH = 2  # bytes per sample: 16-bit little-endian, mono, everywhere


@dataclass(frozen=True)
class Audio:
    """16-bit little-endian mono PCM at `rate` samples per second."""

    pcm: bytes
    rate: int

    @property
    def seconds(self) -> float:
        return len(self.pcm) / (SAMPLE_WIDTH * self.rate) if self.rate else 0.0


@dataclass(frozen=True)
class Transcription:
    text: str
    # Length of the audio that was transcribed (what usage counts).
    seconds: float
    # Words were heard, but in what the engine takes for noise: none are kept.
    noise: bool = False


# Sentences a page user may see; the detail of what went wrong goes to the log.
ERROR_MESSAGES: dict[str, str] = {
    "speech_unavailable": "Voice is not available on this server right now.",
    "speech_failed": "The voice service ran into a problem, please try again.",
    "speech_timeout": "The voice service took too long, please try again.",
    "speech_busy": "The voice service is busy right now, please try again shortly.",
    "speech_rate_limited": "Voice is in heavy use on this site right now, please try again shortly.",
    "speech_auth_failed": "Voice is not set up correctly on this server.",
    "speech_rejected": "The voice service could not handle this audio.",
}


class SpeechError(Exception):
    """Every failure of a speech engine, whatever the engine, as one of a few codes.

    code: one of ERROR_MESSAGES; message: a sentence safe to show a page user;
    detail: a short technical fact for the log only; data: what the error
    event carries beside its code (the bound that refused, when to retry).
    """

    def __init__(self, code: str, *, detail: str = "", status: int | None = None,
                 data: dict | None = None) -> None:
        if code not in ERROR_MESSAGES:
            raise ValueError(f"unknown speech error code {code!r}")
        self.code = code
        self.message = ERROR_MESSAGES[code]
        self.detail = detail
        self.status = status
        self.data = data or {}
        super().__init__(f"{code}: {detail or self.message}")


class SpeechToText(Protocol):
    name: str

    async def transcribe(self, audio: Audio, *, owner: Hashable | None = None) -> Transcription:
        """The words of one utterance ("" when nothing was understood, or only noise).

        Raises SpeechError for every engine failure. Cancellable: a cancelled
        call returns no result (an offline job already running finishes in its
        worker and is dropped).
        """
        ...


class TextToSpeech(Protocol):
    name: str

    async def synthesize(self, text: str, *, owner: Hashable | None = None) -> Audio:
        """One sentence spoken, as 24 kHz PCM. Raises SpeechError for every engine failure."""
        ...
