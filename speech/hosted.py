"""A hosted speech pair over HTTP: OpenAI's audio endpoints (or any server that speaks them).

- speech to text: POST {base}/audio/transcriptions, multipart/form-data with
  `file` (the utterance as 16-bit WAV), `model` and `response_format=json`;
  the answer is {"text": ...}.
- text to speech: POST {base}/audio/speech, JSON {model, input, voice,
  response_format:"pcm"}; the answer is raw 24 kHz 16-bit little-endian mono
  PCM, the rate the agent's voice has on the wire.
Errors come back as {"error": {"message", "type", "code"}} with an HTTP
status, mapped here to SpeechError codes. Requests are awaited on the event
loop (no speech worker is involved, so a call's `owner` is not counted: the
service applies its own limits, a 429 being speech_busy). Configured by OWLLAYER_VOICE_API_KEY
and OWLLAYER_VOICE_BASE_URL (tests point it at tests/support/fake_speech.py).
"""
from __future__ import annotations

import json
import logging
from collections.abc import Hashable

import httpx

from aitp.voice.audio import AGENT_RATE, encode_wav
from aitp.voice.base import SAMPLE_WIDTH, Audio, SpeechError, Transcription
from runtime.config import HostedConfig
from runtime.config import config as current_config

logger = logging.getLogger(__name__)

# Bounds on what a hosted service may send back: an answer larger than this
# is not one sentence of speech or one transcript.
MAX_SPEECH_BYTES = 60 * AGENT_RATE * SAMPLE_WIDTH
MAX_TRANSCRIPT_BYTES = 256 * 1024


async def _post(config: HostedConfig, path: str, *, max_bytes: int, **kwargs) -> bytes:
    """The body of a successful answer; SpeechError for everything else."""
    if not config.api_key:
        raise SpeechError("speech_auth_failed", detail="OWLLAYER_VOICE_API_KEY is not set")
    headers = {"Authorization": f"Bearer {config.api_key}"}
    try:
        async with httpx.AsyncClient(timeout=config.timeout) as client:
            async with client.stream("POST", config.url(path), headers=headers, **kwargs) as response:
                body = bytearray()
                async for piece in response.aiter_bytes():
                    body += piece
                    if len(body) > max_bytes:
                        raise SpeechError("speech_failed", status=response.status_code,
                                          detail=f"{path}: answer larger than {max_bytes} bytes")
    except httpx.TimeoutException:
        raise SpeechError("speech_timeout", detail=f"{path}: no answer in {config.timeout:g} s") from None
    except httpx.HTTPError as exc:
        raise SpeechError("speech_unavailable", detail=f"{path}: {type(exc).__name__}") from None
    if response.status_code >= 400:
        raise _status_error(path, response.status_code, bytes(body))
    return bytes(body)


def _status_error(path: str, status: int, body: bytes) -> SpeechError:
    try:
        error = json.loads(body).get("error") or {}
        fact = str(error.get("message") or error.get("type") or "")[:200]
    except (ValueError, AttributeError):
        fact = ""
    detail = f"{path}: HTTP {status}" + (f": {fact}" if fact else "")
    if status in (401, 403):
        code = "speech_auth_failed"
    elif status == 429:
        code = "speech_busy"
    elif status in (400, 404, 413, 415, 422):
        code = "speech_rejected"
    else:
        code = "speech_failed"
    return SpeechError(code, detail=detail, status=status)


class HostedStt:
    name = "openai"

    def __init__(self, config: HostedConfig | None = None) -> None:
        self.config = config or current_config().voice.hosted

    async def transcribe(self, audio: Audio, *, owner: Hashable | None = None) -> Transcription:
        body = await _post(
            self.config, "/audio/transcriptions", max_bytes=MAX_TRANSCRIPT_BYTES,
            files={"file": ("speech.wav", encode_wav(audio), "audio/wav")},
            data={"model": self.config.stt_model, "response_format": "json"},
        )
        try:
            text = json.loads(body)["text"]
        except (ValueError, KeyError, TypeError):
            raise SpeechError("speech_failed", detail="/audio/transcriptions: answer has no text") from None
        if not isinstance(text, str):
            raise SpeechError("speech_failed", detail="/audio/transcriptions: text is not a string")
        return Transcription(text.strip(), audio.seconds)


class HostedTts:
    name = "openai"

    def __init__(self, config: HostedConfig | None = None) -> None:
        self.config = config or current_config().voice.hosted

    async def synthesize(self, text: str, *, owner: Hashable | None = None) -> Audio:
        pcm = await _post(
            self.config, "/audio/speech", max_bytes=MAX_SPEECH_BYTES,
            json={"model": self.config.tts_model, "input": text,
                  "voice": self.config.tts_voice, "response_format": "pcm"},
        )
        return Audio(pcm[: len(pcm) - len(pcm) % SAMPLE_WIDTH], AGENT_RATE)
