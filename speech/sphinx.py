"""PocketSphinx's blocking work: its decoders, loaded once per thread, and
the transcription of one utterance. A speech worker process runs it
(jobs.py warms each worker up with prepare); offline.py's engine
only sends it there.
"""
from __future__ import annotations

import os
import threading

from aitp.voice.audio import CLIENT_RATE, resample
from aitp.voice.base import Audio, SpeechError, Transcription
from runtime.config import PocketSphinxConfig

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


def prepare(config: PocketSphinxConfig) -> None:
    """A speech worker's warm-up: its decoders for `config`, loaded before its
    first job (nothing to send back: a decoder cannot leave the worker)."""
    load_decoder(config)


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
