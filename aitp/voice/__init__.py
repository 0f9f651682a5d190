"""Speech engines behind two small interfaces (base.py), and the pure pieces of a voice turn.

get_stt() and get_tts() give the process-wide engines named by
settings.OWLLAYER_STT ("pocketsphinx" or "openai") and OWLLAYER_TTS ("espeak"
or "openai"). audio_available_async() says whether both work, which decides
the `audio` capability of HANDSHAKE_ACK (checked in a speech worker, once per
process). The modules:

  base.py       the interfaces, Audio, Transcription, SpeechError
  audio.py      mime types, WAV, soxr resampling, the agent's AUDIO_STREAM chunks
  inbound.py    checking the page's audio (AUDIO_STREAM chunks, USER_INPUT audio)
  utterance.py  the per-turn utterance buffer, the per-connection audio budget
  vad.py        server-side end-of-speech detection (WebRTC VAD)
  speaking.py   sentences for text to speech while the model writes; the barge-in cut point
  jobs.py       the pool of speech worker processes offline engines run in
  worker.py     one speech worker process;  allowance.py  one API key's share of the pool
  offline.py    PocketSphinx and eSpeak NG;  hosted.py  OpenAI's audio endpoints
  sphinx.py     PocketSphinx's decoders and transcription (worker-side)

Django and the engines are imported only when an engine is asked for.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading

from .base import Audio, SpeechError, SpeechToText, TextToSpeech, Transcription

__all__ = [
    "Audio", "SpeechError", "SpeechToText", "TextToSpeech", "Transcription",
    "audio_available", "audio_available_async", "audio_problems", "audio_problems_async",
    "get_stt", "get_tts", "reset_engines",
]

logger = logging.getLogger(__name__)

_lock = threading.Lock()
_stt: SpeechToText | None = None
_tts: TextToSpeech | None = None
_problems: dict[tuple[str, str], list[str]] = {}
# The offline engines' check under way, per configuration.
_checks: dict[tuple[str, str], concurrent.futures.Future] = {}


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


def _known(key: tuple[str, str]) -> list[str] | None:
    with _lock:
        return _problems.get(key)


def _remember(key: tuple[str, str], problems: list[str]) -> list[str]:
    if problems:
        logger.warning("voice is not available: %s", "; ".join(problems))
    with _lock:
        _problems[key] = problems
    return problems


def _offline_check(key: tuple[str, str]) -> concurrent.futures.Future | None:
    """The offline engines' check, run in a speech worker (one at a time per
    configuration: callers meanwhile share it); None when neither engine is offline."""
    from . import jobs
    from .offline import EspeakConfig, offline_problems
    from .sphinx import PocketSphinxConfig

    stt = PocketSphinxConfig.from_settings() if key[0] == "pocketsphinx" else None
    tts = EspeakConfig.from_settings() if key[1] == "espeak" else None
    if stt is None and tts is None:
        return None
    with _lock:
        running = _checks.get(key)
        if running is None or running.done():
            running = _checks[key] = jobs.get_pool().submit(offline_problems, (stt, tts))
        return running


def _hosted_problems(key: tuple[str, str]) -> list[str]:
    from django.conf import settings

    if "openai" in key and not settings.OWLLAYER_VOICE_API_KEY:
        return ["OWLLAYER_VOICE_API_KEY is not set"]
    return []


def _settings_key() -> tuple[str, str]:
    from django.conf import settings

    return (settings.OWLLAYER_STT, settings.OWLLAYER_TTS)


def audio_problems() -> list[str]:
    """What keeps voice from working with the configured engines ([] when it works).

    Blocking the first time, never to be called on the event loop (see
    audio_problems_async): the offline engines speak and hear a word in a
    speech worker, which loads them there. Remembered for the process after
    that. A hosted engine counts as available when its API key is set:
    whether the service answers is learnt per request.
    """
    key = _settings_key()
    known = _known(key)
    if known is not None:
        return known
    offline = []
    try:
        check = _offline_check(key)
        if check is not None:
            offline = check.result()
    except SpeechError as exc:  # the workers, not the engines: asked again next time
        return [exc.detail or exc.message]
    return _remember(key, [*offline, *_hosted_problems(key)])


def audio_available() -> bool:
    """Whether HANDSHAKE_ACK may offer `audio`: both configured engines work (blocking)."""
    return not audio_problems()


async def audio_problems_async() -> list[str]:
    """audio_problems() without blocking the event loop: the check runs in a
    speech worker and is awaited; once known, the answer costs nothing."""
    key = _settings_key()
    known = _known(key)
    if known is not None:
        return known
    offline = []
    try:
        check = _offline_check(key)
        if check is not None:
            # Shielded: a page that leaves does not cancel the check others wait for.
            offline = await asyncio.shield(asyncio.wrap_future(check))
    except SpeechError as exc:
        return [exc.detail or exc.message]
    return _remember(key, [*offline, *_hosted_problems(key)])


async def audio_available_async() -> bool:
    """Whether HANDSHAKE_ACK may offer `audio`, awaited off the event loop."""
    return not await audio_problems_async()


def reset_engines() -> None:
    """Forget the engines and the availability check (tests that change settings call this)."""
    global _stt, _tts
    with _lock:
        _stt = _tts = None
        _problems.clear()
        _checks.clear()
