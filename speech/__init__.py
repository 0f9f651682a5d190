"""Speech engines behind the two small interfaces of aitp/voice/base.py, and the pure pieces of a voice turn.

Above the protocol app (which knows only the page's audio: aitp/voice/) and
below the agent and the connection, which use it. get_stt() and get_tts()
give the process-wide engines the configuration names by dotted path
(``config().voice.stt_backend``, ``tts_backend``; OWLLAYER_STT=pocketsphinx
or openai and OWLLAYER_TTS=espeak or openai stand for the engines here).
audio_available_async() says whether both work, which decides the `audio`
capability of HANDSHAKE_ACK (checked in a speech worker, once per process).
The modules:

  utterance.py  the per-turn utterance buffer, the per-connection audio budget
  vad.py        server-side end-of-speech detection (WebRTC VAD)
  speaking.py   sentences for text to speech while the model writes; the barge-in cut point
  pipeline.py   text to speech while the model writes: sentences in, their audio out, in order
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
from typing import Any

from aitp.voice.base import Audio, SpeechError, SpeechToText, TextToSpeech, Transcription

__all__ = [
    "Audio", "SpeechError", "SpeechToText", "TextToSpeech", "Transcription",
    "audio_available", "audio_available_async", "audio_problems", "audio_problems_async",
    "get_stt", "get_tts", "reset_engines",
]

logger = logging.getLogger(__name__)

_lock = threading.Lock()
# "stt" and "tts": the engine and the dotted path it was made from (made again
# when the configuration names another).
_engines: dict[str, tuple[str, Any]] = {}
_problems: dict[tuple[str, str], list[str]] = {}
# The offline engines' check under way, per configuration.
_checks: dict[tuple[str, str], concurrent.futures.Future] = {}


def _engine(path: str):
    from django.utils.module_loading import import_string

    return import_string(path)()


def get_stt() -> SpeechToText:
    """The process-wide speech-to-text engine the configuration names."""
    return _made("stt", _voice().stt_backend)


def get_tts() -> TextToSpeech:
    """The process-wide text-to-speech engine the configuration names."""
    return _made("tts", _voice().tts_backend)


def _made(kind: str, path: str) -> Any:
    with _lock:
        held = _engines.get(kind)
        if held is None or held[0] != path:
            held = _engines[kind] = (path, _engine(path))
        return held[1]


def _voice():
    from runtime.config import config

    return config().voice


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
    from .offline import EspeakTts, PocketSphinxStt, offline_problems

    voice = _voice()
    stt = voice.pocketsphinx if _is(key[0], PocketSphinxStt) else None
    tts = voice.espeak if _is(key[1], EspeakTts) else None
    if stt is None and tts is None:
        return None
    with _lock:
        running = _checks.get(key)
        if running is None or running.done():
            running = _checks[key] = jobs.get_pool().submit(offline_problems, (stt, tts))
        return running


def _is(path: str, engine: type) -> bool:
    from django.utils.module_loading import import_string

    return import_string(path) is engine


def _hosted_problems(key: tuple[str, str]) -> list[str]:
    from .hosted import HostedStt, HostedTts

    hosted = _is(key[0], HostedStt) or _is(key[1], HostedTts)
    if hosted and not _voice().hosted.api_key:
        return ["OWLLAYER_VOICE_API_KEY is not set"]
    return []


def _settings_key() -> tuple[str, str]:
    voice = _voice()
    return (voice.stt_backend, voice.tts_backend)


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
    with _lock:
        _engines.clear()
        _problems.clear()
        _checks.clear()
