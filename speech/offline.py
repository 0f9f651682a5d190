"""Speech engines that need no account and no network: PocketSphinx and eSpeak NG.

- PocketSphinx (PyPI `pocketsphinx`) transcribes with the US English model its
  wheel ships. With OWLLAYER_STT_GRAMMAR (a JSGF file) it listens for that
  grammar only, which is far more accurate for a known set of commands.
  What it hears in mere noise is dropped (``heard_as_speech``).
- eSpeak NG (Debian `espeak-ng`, installed by `make setup`) speaks; its
  22,050 Hz output is resampled to the wire's 24 kHz.
They are for trying voice out; real traffic wants the hosted engines
(hosted.py). The blocking work is in module-level functions that the speech
worker processes run (jobs.py): the engine classes only send it there.
offline_problems() is the availability check behind the `audio` capability
of HANDSHAKE_ACK, run in a worker as well.
"""
from __future__ import annotations

import logging
import os
import shutil
import subprocess
from collections.abc import Hashable

from aitp.voice.audio import AGENT_RATE, CLIENT_RATE, AudioRefused, decode_wav, resample
from aitp.voice.base import Audio, SpeechError, Transcription
from runtime.config import EspeakConfig
from runtime.config import config as current_config

from .sphinx import PocketSphinxConfig, transcribe_blocking

logger = logging.getLogger(__name__)



class PocketSphinxStt:
    name = "pocketsphinx"

    def __init__(self, config: PocketSphinxConfig | None = None) -> None:
        self.config = config or current_config().voice.pocketsphinx

    async def transcribe(self, audio: Audio, *, owner: Hashable | None = None) -> Transcription:
        from . import jobs

        return await jobs.run(transcribe_blocking, self.config, audio, owner=owner, seconds=audio.seconds)

    def transcribe_now(self, audio: Audio) -> Transcription:
        """The transcription, here and now (blocking: never on the serving loop)."""
        return transcribe_blocking(self.config, audio)


class EspeakTts:
    name = "espeak"

    def __init__(self, config: EspeakConfig | None = None) -> None:
        self.config = config or current_config().voice.espeak

    async def synthesize(self, text: str, *, owner: Hashable | None = None) -> Audio:
        from . import jobs

        return await jobs.run(synthesize_blocking, self.config, text, owner=owner)

    def synthesize_now(self, text: str) -> Audio:
        """The synthesis, here and now (blocking: never on the serving loop)."""
        return synthesize_blocking(self.config, text)


def synthesize_blocking(config: EspeakConfig, text: str) -> Audio:
    """`text` spoken by eSpeak NG, as 24 kHz PCM (a speech worker's job)."""
    binary = shutil.which(config.program) if config.program else None
    if binary is None:
        raise SpeechError("speech_unavailable", detail="espeak-ng is not installed")
    # The text goes in on stdin, never as an argument: a sentence starting
    # with "-" is not an option.
    command = [binary, "--stdout", "-v", config.voice, "-s", str(config.words_per_minute)]
    try:
        done = subprocess.run(command, input=text.encode("utf-8"), capture_output=True,
                              timeout=config.timeout, check=False,
                              env={**os.environ, "LC_ALL": "C.UTF-8"})
    except subprocess.TimeoutExpired:
        raise SpeechError("speech_timeout", detail="espeak-ng took too long") from None
    except OSError as exc:
        raise SpeechError("speech_unavailable", detail=f"espeak-ng: {exc}") from None
    if done.returncode != 0:
        raise SpeechError("speech_failed", detail=f"espeak-ng exited {done.returncode}: "
                          f"{done.stderr[:200].decode('utf-8', 'replace').strip()}")
    try:
        audio = decode_wav(done.stdout)
    except AudioRefused as exc:
        raise SpeechError("speech_failed", detail=f"espeak-ng output: {exc.message}") from None
    return resample(audio, AGENT_RATE)


def offline_problems(stt: PocketSphinxConfig | None, tts: EspeakConfig | None) -> list[str]:
    """What keeps the offline engines of these configurations from working
    ([] when both work): a word spoken, then heard. Blocking: a speech
    worker runs it (so it also loads that worker's decoder)."""
    problems = []
    spoken = None
    if tts is not None:
        try:
            spoken = synthesize_blocking(tts, "ready")
            if not spoken.pcm:
                problems.append("espeak-ng produced no audio")
        except SpeechError as exc:
            problems.append(exc.detail or exc.message)
    if stt is not None:
        try:
            transcribe_blocking(stt, spoken or Audio(b"\0\0" * (CLIENT_RATE // 10), CLIENT_RATE))
        except SpeechError as exc:
            problems.append(exc.detail or exc.message)
        except ImportError as exc:
            problems.append(f"pocketsphinx: {exc}")
    return problems
