"""Speech engines behind two small interfaces (base.py), and the pure pieces of a voice turn.

get_stt() and get_tts() give the process-wide engines named by
settings.OWLLAYER_STT ("pocketsphinx" or "openai") and OWLLAYER_TTS ("espeak"
or "openai"). audio_available() says whether both work, which decides the
`audio` capability of HANDSHAKE_ACK. The modules:

  base.py       the interfaces, Audio, Transcription, SpeechError
  audio.py      mime types, WAV, soxr resampling, the agent's AUDIO_STREAM chunks
  inbound.py    checking the page's audio (AUDIO_STREAM chunks, USER_INPUT audio)
  utterance.py  the per-turn utterance buffer, the per-connection audio budget
  vad.py        server-side end-of-speech detection (WebRTC VAD)
  speaking.py   sentences for text to speech while the model writes; the barge-in cut point
  jobs.py       the bounded pool speech engines run in (OWLLAYER_VOICE_JOBS)
  offline.py    PocketSphinx and eSpeak NG;  hosted.py  OpenAI's audio endpoints

Django and the engines are imported only when an engine is asked for.
"""
from __future__ import annotations

import logging
import threading

from .base import Audio, SpeechError, SpeechToText, TextToSpeech, Transcription

__all__ = [
    "Audio", "SpeechError", "SpeechToText", "TextToSpeech", "Transcription",
    "audio_available", "audio_problems", "get_stt", "get_tts", "reset_engines",
]

logger = logging.getLogger(__name__)

_lock = threading.Lock()
_stt: SpeechToText | None = None
_tts: TextToSpeech | None = None
_problems: dict[tuple[str, str], list[str]] = {}


# The engines each setting may name: (module in this package, class).
_STT_ENGINES = {"pocketsphinx": (".offline", "PocketSphinxStt"), "openai": (".hosted", "HostedStt")}
_TTS_ENGINES = {"espeak": (".offline", "EspeakTts"), "openai": (".hosted", "HostedTts")}


def _make(engines: dict[str, tuple[str, str]], choice: str, what: str):
    if choice not in engines:
        raise ValueError(f"unknown {what} engine {choice!r}")
    import importlib

    module, name = engines[choice]
    return getattr(importlib.import_module(module, __name__), name)()


def get_stt() -> SpeechToText:
    """The process-wide speech-to-text engine for settings.OWLLAYER_STT."""
    global _stt
    from django.conf import settings

    choice = settings.OWLLAYER_STT
    with _lock:
        if _stt is None or _stt.name != choice:
            _stt = _make(_STT_ENGINES, choice, "speech-to-text")
        return _stt


def get_tts() -> TextToSpeech:
    """The process-wide text-to-speech engine for settings.OWLLAYER_TTS."""
    global _tts
    from django.conf import settings

    choice = settings.OWLLAYER_TTS
    with _lock:
        if _tts is None or _tts.name != choice:
            _tts = _make(_TTS_ENGINES, choice, "text-to-speech")
        return _tts


def audio_problems() -> list[str]:
    """What keeps voice from working with the configured engines ([] when it works).

    Blocking the first time (it speaks and transcribes a word with the offline
    engines, which loads them); remembered for the process after that. A
    hosted engine counts as available when its API key is set: whether the
    service answers is learnt per request.
    """
    from django.conf import settings

    key = (settings.OWLLAYER_STT, settings.OWLLAYER_TTS)
    with _lock:
        known = _problems.get(key)
    if known is not None:
        return known
    from .offline import EspeakTts, PocketSphinxStt, offline_problems

    stt, tts = get_stt(), get_tts()
    problems = offline_problems(stt if isinstance(stt, PocketSphinxStt) else None,
                                tts if isinstance(tts, EspeakTts) else None)
    if "openai" in key and not settings.OWLLAYER_VOICE_API_KEY:
        problems.append("OWLLAYER_VOICE_API_KEY is not set")
    if problems:
        logger.warning("voice is not available: %s", "; ".join(problems))
    with _lock:
        _problems[key] = problems
    return problems


def audio_available() -> bool:
    """Whether HANDSHAKE_ACK may offer `audio`: both configured engines work."""
    return not audio_problems()


async def audio_available_async() -> bool:
    """audio_available() without blocking the event loop (the first check loads
    the engines on a speech thread; once known, the answer costs no thread)."""
    from django.conf import settings

    from . import jobs

    with _lock:
        known = _problems.get((settings.OWLLAYER_STT, settings.OWLLAYER_TTS))
    if known is not None:
        return not known
    return await jobs.run(audio_available)


def reset_engines() -> None:
    """Forget the engines and the availability check (tests that change settings call this)."""
    global _stt, _tts
    with _lock:
        _stt = _tts = None
        _problems.clear()
