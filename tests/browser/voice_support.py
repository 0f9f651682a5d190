"""Voice in the browser tests: Chromium whose microphone is a recording eSpeak
NG made at test time (Chromium's fake capture device plays the WAV file in a
loop), and the agent's voice as AITP frames.

A test module takes the microphone by importing `microphone`,
`microphone_loops`, `microphone_allowed` and `browser` from here: its `browser` then replaces the plain one of
conftest.py for that module."""
from __future__ import annotations

import array
import base64
import json
import math
import subprocess
import wave
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest
from playwright.async_api import Browser, WebSocketRoute, async_playwright

from tests.browser.conftest import ack, frame
from tests.conftest import CHROMIUM_ARGS

SPOKEN = "Please add two pro headphones to my cart."
# protocol.md, voice: 16-bit mono PCM at 16 kHz up, about 256 ms a chunk.
MIC_MIME = "audio/pcm;rate=16000"
MIC_CHUNK_BYTES = 4096 * 2
AGENT_RATE = 24000
AGENT_CHUNK_SECONDS = 0.25
# Between two playings of the utterance: long enough for the level
# detector to hear the user stop, so that the next one is heard starting.
PAUSE_SECONDS = 1.5


def speech_wav(folder: Path, text: str = SPOKEN, *, words_per_minute: int | None = None,
               lead_seconds: float = 0.0, pause_seconds: float = PAUSE_SECONDS,
               hiss: float = 0.0) -> Path:
    """eSpeak NG saying `text` (after `lead_seconds` of silence), then a
    pause: 16-bit mono PCM, the WAV Chromium's fake capture device plays.

    `hiss`: the level (standard deviation, in samples) of a quiet room's
    noise under all of it. A real microphone never hears exact digital
    silence, and PocketSphinx's noise estimate goes wrong on one that does.
    """
    spoken = folder / "spoken.wav"
    speed = ["-s", str(words_per_minute)] if words_per_minute else []
    subprocess.run(["espeak-ng", *speed, "-w", str(spoken), text], check=True, timeout=60)
    with wave.open(str(spoken)) as source:
        params = source.getparams()
        speech = np.frombuffer(source.readframes(source.getnframes()), dtype="<i2")
    assert (params.nchannels, params.sampwidth) == (1, 2), params
    lead = np.zeros(int(params.framerate * lead_seconds))
    pause = np.zeros(int(params.framerate * pause_seconds))
    samples = np.concatenate([lead, speech, pause])
    if hiss:
        # Seeded: every run plays the very same recording.
        samples += np.random.default_rng(13).normal(0.0, hiss, len(samples))
    path = folder / "microphone.wav"
    with wave.open(str(path), "wb") as target:
        target.setparams(params)
        target.writeframes(np.clip(samples, -32768, 32767).astype("<i2").tobytes())
    return path


def wav_seconds(path: Path) -> float:
    with wave.open(str(path)) as recording:
        return recording.getnframes() / recording.getframerate()


@pytest.fixture(scope="module")
def microphone(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return speech_wav(tmp_path_factory.mktemp("voice"))


@pytest.fixture
def microphone_loops() -> bool:
    """Whether the recording plays again and again; a test that nobody may
    talk over the agent in says `@pytest.mark.parametrize("microphone_loops", [False])`
    (silence then follows the recording)."""
    return True


@pytest.fixture
def microphone_allowed() -> bool:
    """Whether a page asking for the microphone gets it (parametrize it to
    False for a shopper who refuses)."""
    return True


@pytest.fixture
async def browser(chromium_path: str, microphone: Path, microphone_loops: bool,
                  microphone_allowed: bool) -> AsyncIterator[Browser]:
    """Chromium whose microphone plays `microphone`, granted without asking,
    and whose pages may play sound without a click."""
    capture = str(microphone) if microphone_loops else f"{microphone}%noloop"
    # Without the fake prompt, Playwright's pages are refused what they ask.
    allow = ["--use-fake-ui-for-media-stream"] if microphone_allowed else []
    args = [
        *CHROMIUM_ARGS,
        *allow,
        "--use-fake-device-for-media-stream",
        f"--use-file-for-fake-audio-capture={capture}",
        "--autoplay-policy=no-user-gesture-required",
    ]
    async with async_playwright() as playwright:
        launched = await playwright.chromium.launch(executable_path=chromium_path, args=args, headless=True)
        try:
            yield launched
        finally:
            await launched.close()


def audio_ack() -> str:
    """A HANDSHAKE_ACK that offers voice."""
    return ack(capabilities=["text", "audio", "tools"])


def tone_chunks(count: int) -> list[str]:
    """`count` AUDIO_STREAM frames of the agent's voice: a 440 Hz tone, 24 kHz 16-bit PCM."""
    samples = int(AGENT_RATE * AGENT_CHUNK_SECONDS)
    chunks = []
    for index in range(count):
        pcm = array.array("h", (
            int(8000 * math.sin(2 * math.pi * 440 * (index * samples + i) / AGENT_RATE))
            for i in range(samples)
        ))
        chunks.append(frame("AUDIO_STREAM", {
            "data": base64.b64encode(pcm.tobytes()).decode(),
            "mimeType": f"audio/pcm;rate={AGENT_RATE}",
        }))
    return chunks


def transcript(role: str, text: str) -> str:
    return frame("SYSTEM_EVENT", {"kind": "transcript", "data": {"role": role, "text": text}})


def voice_state(event: str, **payload) -> str:
    return frame("VOICE_STATE_EVENT", {"event": event, **payload})


class ScriptedAssistant:
    """Answers the store's socket: the ACK, then `answer` after each
    VOICE_INPUT_END and `interrupted` after each VOICE_INTERRUPT."""

    def __init__(self, ack_frame: str, answer: list[str] | None = None) -> None:
        self.ack_frame = ack_frame
        self.answer = answer or []
        self.received: list[dict] = []

    def route(self, ws: WebSocketRoute) -> None:
        ws.on_message(lambda message: self.receive(ws, message))

    def receive(self, ws: WebSocketRoute, message: str | bytes) -> None:
        body = json.loads(message)
        self.received.append(body)
        if body["type"] == "HANDSHAKE_INIT":
            ws.send(self.ack_frame)
        elif body["type"] == "VOICE_INPUT_END":
            for text in self.answer:
                ws.send(text)
        elif body["type"] == "VOICE_INTERRUPT":
            ws.send(voice_state("interrupted", reason="barge_in"))

    def sent(self, type_: str) -> list[dict]:
        return [message for message in self.received if message["type"] == type_]


# A voice turn of the scripted assistant: what it heard, and its answer.
HEARD = "please add two pro headphones to my cart"
ANSWER = "Done: two Pro Headphones are in your cart."


def answer_frames(audio_chunks: int) -> list[str]:
    """What a voice turn's answer looks like on the wire (protocol.md, voice)."""
    return [
        transcript("user", HEARD),
        frame("AGENT_RESPONSE", {"chunk": "Done: two Pro Headphones", "done": False}),
        transcript("agent", "Done: two Pro Headphones are in your cart."),
        *tone_chunks(audio_chunks),
        frame("AGENT_RESPONSE", {"chunk": ANSWER, "done": True}),
        voice_state("turn_complete"),
    ]
