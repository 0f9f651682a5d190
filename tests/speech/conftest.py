"""Speech made at test time with eSpeak NG (and noise with numpy), and a skip when eSpeak NG is not installed."""
from __future__ import annotations

import os
import shutil
from dataclasses import replace

import numpy as np
import pytest

from aitp.voice.audio import CLIENT_RATE, resample
from aitp.voice.base import Audio
from runtime.config import EspeakConfig, PocketSphinxConfig, config

# Skipped on a laptop without it; in CI (which `make setup` provisions) the
# tests run anyway and fail, so a missing engine is never a quiet skip.
needs_espeak = pytest.mark.skipif(
    shutil.which("espeak-ng") is None and os.environ.get("CI") != "true",
    reason="espeak-ng is not installed (make setup installs it)",
)


def espeak_config(**changes) -> EspeakConfig:
    """The configured eSpeak NG, with these changes."""
    return replace(config().voice.espeak, **changes)


def sphinx_config(**changes) -> PocketSphinxConfig:
    """PocketSphinx with the full language model and no phone-by-phone pass
    (whatever it hears counts), with these changes."""
    return replace(config().voice.pocketsphinx, **{"grammar": "", "min_voiced_seconds": 0.0, **changes})


def speak(text: str, *, rate: int = CLIENT_RATE, words_per_minute: int = 150) -> Audio:
    """`text` spoken by eSpeak NG, as PCM at `rate` (the microphone's 16 kHz by default)."""
    from speech.offline import EspeakTts

    spoken = EspeakTts(espeak_config(words_per_minute=words_per_minute)).synthesize_now(text)
    return resample(spoken, rate)


def silence(seconds: float, rate: int = CLIENT_RATE) -> bytes:
    return b"\0\0" * int(seconds * rate)


def room_noise(colour: str, seconds: float = 4.0, *, level: float = 0.02, seed: int,
               rate: int = CLIENT_RATE) -> Audio:
    """`colour` noise ("white" or "pink") whose loudness changes every tenth
    of a second, as a room's does (`level`: its RMS, full scale 1), as PCM."""
    rng = np.random.default_rng(seed)
    n = int(seconds * rate)
    samples = rng.normal(0.0, 1.0, n)
    if colour == "pink":  # power falling as 1/f
        frequencies = np.fft.rfftfreq(n)
        frequencies[0] = frequencies[1]
        samples = np.fft.irfft(np.fft.rfft(samples) / np.sqrt(frequencies), n)
    tenth = rate // 10
    samples *= np.repeat(rng.uniform(0.2, 1.5, n // tenth + 1), tenth)[:n]
    samples *= level / np.std(samples)
    return Audio((np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes(), rate)
