"""Speech made at test time with eSpeak NG, and a skip when it is not installed."""
from __future__ import annotations

import os
import shutil

import pytest

from aitp.voice.audio import CLIENT_RATE, resample
from aitp.voice.base import Audio

# Skipped on a laptop without it; in CI (which `make setup` provisions) the
# tests run anyway and fail, so a missing engine is never a quiet skip.
needs_espeak = pytest.mark.skipif(
    shutil.which("espeak-ng") is None and os.environ.get("CI") != "true",
    reason="espeak-ng is not installed (make setup installs it)",
)


def speak(text: str, *, rate: int = CLIENT_RATE, words_per_minute: int = 150) -> Audio:
    """`text` spoken by eSpeak NG, as PCM at `rate` (the microphone's 16 kHz by default)."""
    from aitp.voice.offline import EspeakConfig, EspeakTts

    spoken = EspeakTts(EspeakConfig(words_per_minute=words_per_minute)).synthesize_now(text)
    return resample(spoken, rate)


def silence(seconds: float, rate: int = CLIENT_RATE) -> bytes:
    return b"\0\0" * int(seconds * rate)
