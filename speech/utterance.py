"""One user utterance in the making, and the audio budget of a connection.

UtteranceBuffer collects the 16 kHz microphone chunks of one voice turn and
says when the utterance is over (the reasons of VOICE_INPUT_END):
- user_stop / vad / timeout sent by the client (end());
- vad: the server's own detector heard the speech end (OWLLAYER_SERVER_VAD);
- timeout: the longest utterance (OWLLAYER_VOICE_MAX_UTTERANCE_SECONDS) is
  buffered, or no chunk came for OWLLAYER_VOICE_IDLE_SECONDS (a stream that
  never ends). Audio past the longest utterance is not kept.

AudioBudget is the per-connection bound on audio bytes per second
(OWLLAYER_VOICE_BYTES_PER_SECOND): a token bucket that allows a short burst
after a network stall, so a page streaming in real time never hits it.

Pure: the clock comes in as `now` (seconds, monotonic), limits as arguments.
"""
from __future__ import annotations

from dataclasses import dataclass

from aitp.voice.audio import CLIENT_RATE
from aitp.voice.base import SAMPLE_WIDTH, Audio
from runtime.config import VoiceLimits

from .vad import EndOfSpeech

END_REASONS = ("user_stop", "vad", "timeout")
# How many seconds of the allowed rate a connection may send at once.
BURST_SECONDS = 4.0


@dataclass(frozen=True)
class Utterance:
    audio: Audio
    reason: str  # one of END_REASONS
    # The utterance reached the longest allowed length and later audio was dropped.
    truncated: bool = False


class AudioBudget:
    """Audio bytes per second for one connection: take() says whether a chunk fits."""

    def __init__(self, bytes_per_second: int, now: float) -> None:
        self.rate = bytes_per_second
        self.capacity = bytes_per_second * BURST_SECONDS
        self._tokens = self.capacity
        self._at = now

    def take(self, size: int, now: float) -> bool:
        self._tokens = min(self.capacity, self._tokens + (now - self._at) * self.rate)
        self._at = max(self._at, now)
        if size > self._tokens:
            return False
        self._tokens -= size
        return True


class UtteranceBuffer:
    def __init__(self, limits: VoiceLimits, now: float) -> None:
        self.limits = limits
        self._max_bytes = int(limits.max_utterance_seconds * CLIENT_RATE) * SAMPLE_WIDTH
        self._chunks: list[bytes] = []
        self._size = 0
        self._last_chunk_at = now
        self.truncated = False
        self.vad = (EndOfSpeech(silence_seconds=limits.vad_silence_seconds)
                    if limits.server_vad else None)
        # Why the utterance is over, once it is (None while it goes on).
        self.end_reason: str | None = None

    @property
    def seconds(self) -> float:
        return self._size / (SAMPLE_WIDTH * CLIENT_RATE)

    def append(self, pcm: bytes, now: float) -> str | None:
        """Add one validated chunk; returns the end reason when this chunk ended the utterance."""
        if self.end_reason is not None:
            return None
        self._last_chunk_at = now
        room = self._max_bytes - self._size
        kept = pcm[:room - room % SAMPLE_WIDTH] if len(pcm) > room else pcm
        if len(kept) < len(pcm):
            self.truncated = True
        if kept:
            self._chunks.append(kept)
            self._size += len(kept)
        if self.vad is not None and kept and self.vad.feed(kept):
            self.end_reason = "vad"
        elif self._size >= self._max_bytes:
            self.end_reason = "timeout"
        return self.end_reason

    def idle(self, now: float) -> str | None:
        """`timeout` (and the utterance ends) when no chunk came for the idle bound."""
        if self.end_reason is None and now - self._last_chunk_at >= self.limits.idle_seconds:
            self.end_reason = "timeout"
            return self.end_reason
        return None

    def idle_deadline(self) -> float:
        """When idle() will end the utterance unless another chunk comes first."""
        return self._last_chunk_at + self.limits.idle_seconds

    def end(self, reason: str) -> Utterance:
        """The utterance so far; the first reason given (by the client or by us) is the one recorded."""
        if reason not in END_REASONS:
            raise ValueError(f"unknown end reason {reason!r}")
        if self.end_reason is None:
            self.end_reason = reason
        return Utterance(Audio(b"".join(self._chunks), CLIENT_RATE), self.end_reason, self.truncated)
