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
import threading
from collections.abc import Hashable
from dataclasses import dataclass

from .audio import AGENT_RATE, CLIENT_RATE, AudioRefused, decode_wav, resample
from .base import Audio, SpeechError, Transcription

logger = logging.getLogger(__name__)

ESPEAK = "espeak-ng"


@dataclass(frozen=True)
class PocketSphinxConfig:
    grammar: str = ""  # path of a JSGF grammar file, or "" for the full language model
    # Seconds of vowels the phone-by-phone pass must hear for the words to
    # count (0: no such pass, whatever is heard counts).
    min_voiced_seconds: float = 0.0

    @classmethod
    def from_settings(cls) -> PocketSphinxConfig:
        from django.conf import settings

        return cls(grammar=settings.OWLLAYER_STT_GRAMMAR,
                   min_voiced_seconds=settings.OWLLAYER_STT_MIN_VOICED_SECONDS)


class PocketSphinxStt:
    name = "pocketsphinx"

    def __init__(self, config: PocketSphinxConfig | None = None) -> None:
        self.config = config or PocketSphinxConfig.from_settings()

    async def transcribe(self, audio: Audio, *, owner: Hashable | None = None) -> Transcription:
        from . import jobs

        return await jobs.run(transcribe_blocking, self.config, audio, owner=owner, seconds=audio.seconds)

    def transcribe_now(self, audio: Audio) -> Transcription:
        """The transcription, here and now (blocking: never on the serving loop)."""
        return transcribe_blocking(self.config, audio)


# A decoder is not thread-safe and takes most of a second to load: one per
# configuration and thread, kept (a worker process has one thread, and keeps
# its decoders across jobs).
_decoders = threading.local()
# The phone-by-phone pass: the phones of the US English model, free of any
# word, the phone language model weighted lightly, so that speech shows its
# vowels even when spoken fast; noise, whatever its colour, is silence to it.
PHONE_WEIGHT = 2.0
VOWELS = frozenset({"AA", "AE", "AH", "AO", "AW", "AY", "EH", "ER", "EY", "IH", "IY", "OW", "OY", "UH", "UW"})


def _loaded() -> dict:
    loaded = getattr(_decoders, "by_config", None)
    if loaded is None:
        loaded = _decoders.by_config = {}
    return loaded


def load_decoder(config: PocketSphinxConfig):
    """The word decoder for `config` (and the phone decoder it needs),
    loaded once per thread: a worker's warm-up."""
    loaded = _loaded()
    decoder = loaded.get(config)
    if decoder is None:
        from pocketsphinx import Decoder

        try:
            decoder = Decoder(samprate=CLIENT_RATE, loglevel="FATAL")
            if config.grammar:
                decoder.add_jsgf_file("grammar", config.grammar)
                decoder.activate_search("grammar")
        except (RuntimeError, OSError, ValueError) as exc:
            raise SpeechError("speech_unavailable", detail=f"pocketsphinx: {exc}") from None
        loaded[config] = decoder
    if config.min_voiced_seconds > 0:
        _phone_decoder()
    return decoder


def _phone_decoder():
    loaded = _loaded()
    decoder = loaded.get("phones")
    if decoder is None:
        from pocketsphinx import Decoder, get_model_path

        try:
            decoder = Decoder(samprate=CLIENT_RATE, loglevel="FATAL", lw=PHONE_WEIGHT)
            decoder.add_allphone_file("phones", os.path.join(get_model_path(), "en-us", "en-us-phone.lm.bin"))
            decoder.activate_search("phones")
        except (RuntimeError, OSError, ValueError) as exc:
            raise SpeechError("speech_unavailable", detail=f"pocketsphinx phones: {exc}") from None
        loaded["phones"] = decoder
    return decoder


def _decode(decoder, pcm: bytes, key: object) -> None:
    try:
        decoder.start_utt()
        decoder.process_raw(pcm, full_utt=True)
        decoder.end_utt()
    except RuntimeError as exc:
        # The decoder may be left mid-utterance: build a fresh one next time.
        _loaded().pop(key, None)
        raise SpeechError("speech_failed", detail=f"pocketsphinx: {exc}") from None


def voiced_seconds(pcm: bytes) -> float:
    """Seconds of vowels PocketSphinx hears in 16 kHz PCM, phone by phone."""
    decoder = _phone_decoder()
    _decode(decoder, pcm, "phones")
    frames = sum(segment.end_frame - segment.start_frame + 1 for segment in decoder.seg()
                 if segment.word in VOWELS)
    return frames / decoder.config["frate"]


def transcribe_blocking(config: PocketSphinxConfig, audio: Audio) -> Transcription:
    """The words PocketSphinx hears in one utterance (a speech worker's job).

    Words heard in what the phone-by-phone pass finds fewer vowels in than
    config.min_voiced_seconds are noise (room noise heard as "ah" or "if"):
    none are returned."""
    pcm = resample(audio, CLIENT_RATE).pcm
    decoder = load_decoder(config)
    _decode(decoder, pcm, config)
    hypothesis = decoder.hyp()
    text = hypothesis.hypstr.strip() if hypothesis is not None else ""
    if text and config.min_voiced_seconds > 0 and voiced_seconds(pcm) < config.min_voiced_seconds:
        return Transcription("", audio.seconds, noise=True)
    return Transcription(text, audio.seconds)


@dataclass(frozen=True)
class EspeakConfig:
    voice: str = "en-us"
    words_per_minute: int = 175
    timeout: float = 30.0
    # The program: found on the serving process's PATH when the settings are
    # read ("" when it is not there), so that every worker runs the same one.
    program: str = ESPEAK

    @classmethod
    def from_settings(cls) -> EspeakConfig:
        from django.conf import settings

        return cls(voice=settings.OWLLAYER_ESPEAK_VOICE,
                   words_per_minute=settings.OWLLAYER_ESPEAK_WPM,
                   timeout=settings.OWLLAYER_VOICE_TIMEOUT,
                   program=shutil.which(ESPEAK) or "")


class EspeakTts:
    name = "espeak"

    def __init__(self, config: EspeakConfig | None = None) -> None:
        self.config = config or EspeakConfig.from_settings()

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
