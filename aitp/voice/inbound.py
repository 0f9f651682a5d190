"""Checking the audio a page sends, before any of it is buffered or transcribed.

Two ways in (docs/protocol.md, voice turns):
- AUDIO_STREAM chunks of the live microphone: `audio/pcm;rate=16000`, base64
  of 16-bit little-endian mono samples, about 256 ms each;
- USER_INPUT {modality:"audio", content, mimeType}: one whole message, PCM
  (`audio/pcm;rate=N`) or 16-bit WAV.

Each refusal is an AudioRefused whose code becomes the error event's data.code:
  unsupported_audio_type  mimeType missing, or not PCM / WAV
  unsupported_audio_rate  a rate other than the stream's 16000, or outside 8000-48000 Hz
  invalid_audio           not base64, an odd byte count, an unreadable WAV
  empty_audio             no samples at all
  audio_too_large         a chunk or a whole message over its bound
Pure: no Django, no asyncio; the bounds come in as arguments.
"""
from __future__ import annotations

import base64
import binascii

from .audio import CLIENT_RATE, AudioRefused, decode_wav, is_wav_mime, pcm_rate
from .base import SAMPLE_WIDTH, Audio

# One live chunk is about 256 ms; two seconds leaves room for a client that
# batches after a stall, and anything larger is not a microphone stream.
MAX_STREAM_CHUNK_SECONDS = 2.0
MIN_RATE, MAX_RATE = 8000, 48000


def _decode_base64(data: str, max_bytes: int, what: str) -> bytes:
    # Refuse by length before decoding: base64 is 4 characters per 3 bytes.
    if len(data) > 4 * (max_bytes // 3 + 1) + 4:
        raise AudioRefused("audio_too_large", f"{what} is larger than {max_bytes} bytes")
    try:
        raw = base64.b64decode(data.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError, ValueError):
        raise AudioRefused("invalid_audio", f"{what} is not valid base64") from None
    if len(raw) > max_bytes:
        raise AudioRefused("audio_too_large", f"{what} is {len(raw)} bytes; at most {max_bytes} are allowed")
    if not raw:
        raise AudioRefused("empty_audio", f"{what} holds no audio")
    return raw


def stream_chunk(data: str, mime_type: str | None) -> bytes:
    """The PCM samples of one AUDIO_STREAM chunk from the microphone."""
    if not mime_type:
        raise AudioRefused("unsupported_audio_type", f"mimeType is required; send {_stream_mime()}")
    rate = pcm_rate(mime_type)
    if rate is None:
        raise AudioRefused("unsupported_audio_type",
                           f"mimeType must be {_stream_mime()}, got {_shown(mime_type)}")
    if rate != CLIENT_RATE:
        raise AudioRefused("unsupported_audio_rate",
                           f"live audio must be {CLIENT_RATE} Hz, got {rate} Hz")
    max_bytes = int(MAX_STREAM_CHUNK_SECONDS * CLIENT_RATE) * SAMPLE_WIDTH
    pcm = _decode_base64(data, max_bytes, "audio chunk")
    if len(pcm) % SAMPLE_WIDTH:
        raise AudioRefused("invalid_audio",
                           f"audio chunk is {len(pcm)} bytes; 16-bit samples need an even count")
    return pcm


def whole_message(content: str, mime_type: str | None, *, max_seconds: float) -> Audio:
    """The audio of a USER_INPUT {modality:"audio"}: PCM or 16-bit WAV, at most max_seconds long."""
    if not mime_type:
        raise AudioRefused("unsupported_audio_type",
                           f"mimeType is required for audio input; send {_stream_mime()} or audio/wav")
    rate = pcm_rate(mime_type)
    wav = is_wav_mime(mime_type)
    if rate is None and not wav:
        raise AudioRefused("unsupported_audio_type",
                           f"audio input must be audio/pcm;rate=N or audio/wav, got {_shown(mime_type)}")
    if rate is not None and not MIN_RATE <= rate <= MAX_RATE:
        raise AudioRefused("unsupported_audio_rate",
                           f"audio rate {rate} Hz is outside {MIN_RATE}-{MAX_RATE} Hz")
    # The byte bound of the slowest-to-fill case: max_seconds at the highest
    # rate, in stereo with a WAV header; the duration is checked once decoded.
    max_bytes = int(max_seconds * MAX_RATE) * SAMPLE_WIDTH * 2 + 4096
    raw = _decode_base64(content, max_bytes, "audio message")
    if wav:
        audio = decode_wav(raw)
        if not audio.pcm:
            raise AudioRefused("empty_audio", "audio message holds no audio")
    else:
        if len(raw) % SAMPLE_WIDTH:
            raise AudioRefused("invalid_audio",
                               f"audio message is {len(raw)} bytes; 16-bit samples need an even count")
        audio = Audio(raw, rate)
    if audio.seconds > max_seconds:
        raise AudioRefused("audio_too_large",
                           f"audio message is {audio.seconds:.1f} s long; at most {max_seconds:g} s are allowed")
    return audio


def _stream_mime() -> str:
    return f"audio/pcm;rate={CLIENT_RATE}"


def _shown(text: str) -> str:
    text = "".join(ch if ch.isprintable() else "?" for ch in text)
    return repr(text if len(text) <= 40 else text[:40] + "...")
