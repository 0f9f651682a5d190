"""PCM on the wire: mime types, WAV in and out, resampling, and AUDIO_STREAM chunks.

protocol.md, voice: the microphone comes up as `audio/pcm;rate=16000` (16-bit
little-endian mono, about 256 ms a chunk); the agent's voice goes down as
`audio/pcm;rate=24000`. Resampling is soxr's (a well-kept resampler), never
interpolation written here. Pure: no Django, no asyncio.
"""
from __future__ import annotations

import base64
import io
import re
import wave

import numpy as np
import soxr

from .base import SAMPLE_WIDTH, Audio

CLIENT_RATE = 16000
AGENT_RATE = 24000
CLIENT_MIME = f"audio/pcm;rate={CLIENT_RATE}"
AGENT_MIME = f"audio/pcm;rate={AGENT_RATE}"
# Agent voice frames carry this much audio each: small enough that a barge-in
# stops the voice within a fraction of a second, large enough that a sentence
# is a handful of frames (0.25 s at 24 kHz is 12,000 bytes, 16,000 in base64).
AGENT_CHUNK_SECONDS = 0.25

WAV_MIMES = frozenset({"audio/wav", "audio/wave", "audio/x-wav", "audio/vnd.wave"})
_PCM_MIME = re.compile(r"^\s*audio/(?:pcm|l16)\s*;\s*rate\s*=\s*(\d{1,6})\s*$", re.IGNORECASE)


class AudioRefused(ValueError):
    """Audio from the peer that we refuse; code is the error event's data.code (see inbound.py)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def pcm_rate(mime: str) -> int | None:
    """The rate of an `audio/pcm;rate=N` mime type, or None for any other type."""
    match = _PCM_MIME.match(mime or "")
    return int(match.group(1)) if match else None


def is_wav_mime(mime: str) -> bool:
    return (mime or "").split(";", 1)[0].strip().lower() in WAV_MIMES


def decode_wav(data: bytes) -> Audio:
    """16-bit PCM WAV (mono, or stereo mixed down) as Audio; AudioRefused otherwise."""
    try:
        with wave.open(io.BytesIO(data), "rb") as reader:
            channels = reader.getnchannels()
            width = reader.getsampwidth()
            rate = reader.getframerate()
            frames = reader.readframes(reader.getnframes())
    except (wave.Error, EOFError, ValueError) as exc:
        raise AudioRefused("invalid_audio", f"not a readable PCM WAV file ({exc})") from None
    if width != SAMPLE_WIDTH:
        raise AudioRefused("unsupported_audio_type", f"WAV samples must be 16-bit, got {8 * width}-bit")
    if channels not in (1, 2):
        raise AudioRefused("unsupported_audio_type", f"WAV must be mono or stereo, got {channels} channels")
    if not 8000 <= rate <= 48000:
        raise AudioRefused("unsupported_audio_rate", f"WAV rate {rate} Hz is outside 8000-48000 Hz")
    frames = frames[: len(frames) - len(frames) % (SAMPLE_WIDTH * channels)]
    if channels == 2:
        stereo = np.frombuffer(frames, dtype="<i2").reshape(-1, 2).astype(np.int32)
        frames = (stereo.sum(axis=1) // 2).astype("<i2").tobytes()
    return Audio(frames, rate)


def encode_wav(audio: Audio) -> bytes:
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as writer:
        writer.setnchannels(1)
        writer.setsampwidth(SAMPLE_WIDTH)
        writer.setframerate(audio.rate)
        writer.writeframes(audio.pcm)
    return buffer.getvalue()


def resample(audio: Audio, rate: int) -> Audio:
    """The same audio at `rate` (soxr, high quality); unchanged when already there."""
    if audio.rate == rate or not audio.pcm:
        return Audio(audio.pcm, rate)
    samples = np.frombuffer(audio.pcm, dtype="<i2")
    converted = soxr.resample(samples, audio.rate, rate, quality="HQ")
    return Audio(np.asarray(converted, dtype="<i2").tobytes(), rate)


def agent_chunks(audio: Audio, *, chunk_seconds: float = AGENT_CHUNK_SECONDS) -> list[bytes]:
    """The agent's 24 kHz voice cut into AUDIO_STREAM-sized pieces of whole samples."""
    if audio.rate != AGENT_RATE:
        audio = resample(audio, AGENT_RATE)
    size = max(SAMPLE_WIDTH, int(AGENT_RATE * chunk_seconds) * SAMPLE_WIDTH)
    return [audio.pcm[start:start + size] for start in range(0, len(audio.pcm), size)]


def agent_payload(chunk: bytes) -> dict:
    """The AUDIO_STREAM payload for one piece of the agent's voice."""
    return {"data": base64.b64encode(chunk).decode("ascii"), "mimeType": AGENT_MIME}
