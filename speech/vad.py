"""Server-side voice-activity detection: where the user's speech ends.

WebRTC's detector (the `webrtcvad-wheels` package: compiled C, no model file
to fetch) classifies 30 ms frames of 16 kHz PCM as speech or not. Speech has
begun after a run of voiced frames; it has ended after a run of unvoiced
frames as long as the configured silence. Pure: no clock, positions are
counted in samples, so a recording gives the same answer however fast it is fed.
"""
from __future__ import annotations

import webrtcvad

from aitp.voice.audio import CLIENT_RATE
from aitp.voice.base import SAMPLE_WIDTH

FRAME_SECONDS = 0.03
# Voiced frames in a row before the audio counts as speech (a click or a
# breath is one or two frames).
SPEECH_START_SECONDS = 0.15
# 0 (least aggressive about calling a frame non-speech) to 3 (most).
DEFAULT_AGGRESSIVENESS = 2


class EndOfSpeech:
    """Feed microphone PCM in any chunk sizes; `ended` turns True once speech began and then paused."""

    def __init__(self, *, silence_seconds: float, aggressiveness: int = DEFAULT_AGGRESSIVENESS,
                 rate: int = CLIENT_RATE) -> None:
        if rate not in (8000, 16000, 32000, 48000):
            raise ValueError(f"voice activity detection needs 8, 16, 32 or 48 kHz, got {rate}")
        self._vad = webrtcvad.Vad(aggressiveness)
        self._rate = rate
        self._frame_bytes = int(rate * FRAME_SECONDS) * SAMPLE_WIDTH
        self._start_frames = max(1, round(SPEECH_START_SECONDS / FRAME_SECONDS))
        self._silence_frames = max(1, round(silence_seconds / FRAME_SECONDS))
        self._pending = b""
        self._frames = 0
        self._voiced_run = 0
        self._unvoiced_run = 0
        self.speech_started = False
        self.ended = False
        # Where the speech stopped, in seconds from the first sample fed
        # (set when `ended` turns True).
        self.speech_end_seconds: float | None = None

    def feed(self, pcm: bytes) -> bool:
        """Classify the whole frames now available; returns `ended`."""
        if self.ended:
            return True
        data = self._pending + pcm
        usable = len(data) - len(data) % self._frame_bytes
        for start in range(0, usable, self._frame_bytes):
            self._frame(data[start:start + self._frame_bytes])
            if self.ended:
                break
        self._pending = data[usable:]
        return self.ended

    def _frame(self, frame: bytes) -> None:
        self._frames += 1
        if self._vad.is_speech(frame, self._rate):
            self._voiced_run += 1
            self._unvoiced_run = 0
            if self._voiced_run >= self._start_frames:
                self.speech_started = True
            return
        self._voiced_run = 0
        self._unvoiced_run += 1
        if self.speech_started and self._unvoiced_run >= self._silence_frames:
            self.ended = True
            self.speech_end_seconds = (self._frames - self._unvoiced_run) * FRAME_SECONDS
