"""Speech engines that need no account and no network: PocketSphinx and eSpeak NG.

- PocketSphinx (PyPI `pocketsphinx`) transcribes with the US English model its
  wheel ships. With OWLLAYER_STT_GRAMMAR (a JSGF file) it listens for that
  grammar only, which is far more accurate for a known set of commands.
- eSpeak NG (Debian `espeak-ng`, installed by `make setup`) speaks; its
  22,050 Hz output is resampled to the wire's 24 kHz.
Both run in the bounded speech pool (jobs.py). offline_problems() is the
availability check behind the `audio` capability of HANDSHAKE_ACK.
"""
from __future__ import annotations

import logging
import os
import shutil
import subprocess
import threading
from dataclasses import dataclass

from . import jobs
from .audio import AGENT_RATE, CLIENT_RATE, AudioRefused, decode_wav, resample
from .base import Audio, SpeechError, Transcription

logger = logging.getLogger(__name__)

ESPEAK = "espeak-ng"


@dataclass(frozen=True)
class PocketSphinxConfig:
    grammar: str = ""  # path of a JSGF grammar file, or "" for the full language model

    @classmethod
    def from_settings(cls) -> PocketSphinxConfig:
        from django.conf import settings

        return cls(grammar=settings.OWLLAYER_STT_GRAMMAR)


class PocketSphinxStt:
    name = "pocketsphinx"

    def __init__(self, config: PocketSphinxConfig | None = None) -> None:
        self.config = config or PocketSphinxConfig.from_settings()
        # A decoder is not thread-safe and takes most of a second to load:
        # one per pool thread, kept.
        self._local = threading.local()

    async def transcribe(self, audio: Audio) -> Transcription:
        return await jobs.run(self.transcribe_now, audio)

    def transcribe_now(self, audio: Audio) -> Transcription:
        """The blocking transcription (pool threads and the availability check call it)."""
        pcm = resample(audio, CLIENT_RATE).pcm
        decoder = self._decoder()
        try:
            decoder.start_utt()
            decoder.process_raw(pcm, full_utt=True)
            decoder.end_utt()
        except RuntimeError as exc:
            # The decoder may be left mid-utterance: build a fresh one next time.
            self._local.decoder = None
            raise SpeechError("speech_failed", detail=f"pocketsphinx: {exc}") from None
        hypothesis = decoder.hyp()
        text = hypothesis.hypstr.strip() if hypothesis is not None else ""
        return Transcription(text, audio.seconds)

    def _decoder(self):
        decoder = getattr(self._local, "decoder", None)
        if decoder is None:
            from pocketsphinx import Decoder

            try:
                decoder = Decoder(samprate=CLIENT_RATE, loglevel="FATAL")
                if self.config.grammar:
                    decoder.add_jsgf_file("grammar", self.config.grammar)
                    decoder.activate_search("grammar")
            except (RuntimeError, OSError, ValueError) as exc:
                raise SpeechError("speech_unavailable", detail=f"pocketsphinx: {exc}") from None
            self._local.decoder = decoder
        return decoder


@dataclass(frozen=True)
class EspeakConfig:
    voice: str = "en-us"
    words_per_minute: int = 175
    timeout: float = 30.0

    @classmethod
    def from_settings(cls) -> EspeakConfig:
        from django.conf import settings

        return cls(voice=settings.OWLLAYER_ESPEAK_VOICE,
                   words_per_minute=settings.OWLLAYER_ESPEAK_WPM,
                   timeout=settings.OWLLAYER_VOICE_TIMEOUT)


class EspeakTts:
    name = "espeak"

    def __init__(self, config: EspeakConfig | None = None) -> None:
        self.config = config or EspeakConfig.from_settings()

    async def synthesize(self, text: str) -> Audio:
        return await jobs.run(self.synthesize_now, text)

    def synthesize_now(self, text: str) -> Audio:
        """The blocking synthesis (pool threads and the availability check call it)."""
        binary = shutil.which(ESPEAK)
        if binary is None:
            raise SpeechError("speech_unavailable", detail="espeak-ng is not installed")
        # The text goes in on stdin, never as an argument: a sentence starting
        # with "-" is not an option.
        command = [binary, "--stdout", "-v", self.config.voice, "-s", str(self.config.words_per_minute)]
        try:
            done = subprocess.run(command, input=text.encode("utf-8"), capture_output=True,
                                  timeout=self.config.timeout, check=False,
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


def offline_problems(stt: PocketSphinxStt | None, tts: EspeakTts | None) -> list[str]:
    """What keeps the given offline engines from working ([] when both work); blocking."""
    problems = []
    spoken = None
    if tts is not None:
        try:
            spoken = tts.synthesize_now("ready")
            if not spoken.pcm:
                problems.append("espeak-ng produced no audio")
        except SpeechError as exc:
            problems.append(exc.detail or exc.message)
    if stt is not None:
        try:
            stt.transcribe_now(spoken or Audio(b"\0\0" * (CLIENT_RATE // 10), CLIENT_RATE))
        except SpeechError as exc:
            problems.append(exc.detail or exc.message)
        except ImportError as exc:
            problems.append(f"pocketsphinx: {exc}")
    return problems
