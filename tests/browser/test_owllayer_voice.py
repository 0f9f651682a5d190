"""The in-page client's voice (wire-compat.md section 7), in real Chromium
against a scripted server: the microphone is Chromium's fake capture device
playing speech that eSpeak NG recorded at test time, and what the client
sends and plays is read from the wire and from its counters (never from
the sound itself)."""
from __future__ import annotations

import array
import base64
import math
import subprocess
import wave
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from playwright.async_api import Browser, async_playwright

from tests.browser.conftest import (
    CHROMIUM_ARGS,
    FakeConnection,
    ack,
    eventually,
    frame,
    open_client_page,
)

pytestmark = [pytest.mark.browser]

SPOKEN = "Please add two pro headphones to my cart."
# wire-compat 7: 16-bit mono PCM at 16 kHz up, about 256 ms a chunk.
MIC_MIME = "audio/pcm;rate=16000"
MIC_CHUNK_BYTES = 4096 * 2
AGENT_RATE = 24000
AGENT_CHUNK_SECONDS = 0.25
# Between two recordings of the utterance: long enough for the level
# detector to hear the user stop, so that the next one is heard starting.
PAUSE_SECONDS = 1.5
RECORD_VOICE = (
    "window.voiceStates = []; window.voiceEvents = []; window.transcripts = []; window.errors = [];"
    "client.on('voice', (s) => window.voiceStates.push(s));"
    "client.on('voice.event', (e) => window.voiceEvents.push(e));"
    "client.on('transcript.delta', (t) => window.transcripts.push(t));"
    "client.on('error', (e) => window.errors.push(e.message));"
)


def speech_wav(folder: Path, text: str = SPOKEN) -> Path:
    """eSpeak NG saying `text`, then a pause (Chromium loops the file)."""
    spoken = folder / "spoken.wav"
    subprocess.run(["espeak-ng", "-w", str(spoken), text], check=True, timeout=60)
    with wave.open(str(spoken)) as source:
        params = source.getparams()
        frames = source.readframes(source.getnframes())
    path = folder / "microphone.wav"
    with wave.open(str(path), "wb") as target:
        target.setparams(params)
        target.writeframes(frames + b"\0" * (int(params.framerate * PAUSE_SECONDS) * params.sampwidth))
    return path


@pytest.fixture(scope="module")
def microphone(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return speech_wav(tmp_path_factory.mktemp("voice"))


@pytest.fixture
async def browser(chromium_path: str, microphone: Path) -> AsyncIterator[Browser]:
    """Chromium whose microphone plays `microphone`, granted without asking,
    and whose pages may play sound without a click."""
    args = CHROMIUM_ARGS + [
        "--use-fake-ui-for-media-stream",
        "--use-fake-device-for-media-stream",
        f"--use-file-for-fake-audio-capture={microphone}",
        "--autoplay-policy=no-user-gesture-required",
    ]
    async with async_playwright() as playwright:
        launched = await playwright.chromium.launch(executable_path=chromium_path, args=args, headless=True)
        try:
            yield launched
        finally:
            await launched.close()


def audio_ack() -> str:
    return ack(capabilities=["text", "audio", "tools"])


def tone_chunks(count: int) -> list[str]:
    """`count` chunks of the agent's voice: a 440 Hz tone, 24 kHz 16-bit PCM."""
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


def sent(connection: FakeConnection, type_: str) -> list[dict]:
    return [message for message in connection.received if message["type"] == type_]


def voice(page) -> object:
    return page.evaluate("window.__owl.voice")


async def test_without_the_audio_capability_the_client_offers_no_voice(fake_server, page):
    async def script(connection: FakeConnection) -> None:
        await connection.recv_type("HANDSHAKE_INIT")
        await connection.send(ack())

    fake = await fake_server(script)
    await open_client_page(page, fake, RECORD_VOICE)
    await page.wait_for_function("window.__owl.state === 'connected'")

    assert await page.evaluate("client.voiceAvailable") is False
    assert await page.evaluate("client.startListening()") is False
    assert await page.evaluate("client.voiceState") == "off"
    assert await page.evaluate("window.errors") == [
        "The assistant does not take voice on this connection."
    ]
    assert sent(fake.connections[0], "AUDIO_STREAM") == []


async def test_the_microphone_goes_up_as_16_khz_pcm_chunks_and_ends_with_the_users_stop(fake_server, page):
    async def script(connection: FakeConnection) -> None:
        await connection.recv_type("HANDSHAKE_INIT")
        await connection.send(audio_ack())

    fake = await fake_server(script)
    await open_client_page(page, fake, RECORD_VOICE)
    await page.wait_for_function("window.__owl.state === 'connected'")
    assert await page.evaluate("client.voiceAvailable") is True

    assert await page.evaluate("client.startListening()") is True
    assert await page.evaluate("client.voiceState") == "listening"
    connection = fake.connections[0]
    # Two seconds of microphone: the whole utterance at least once.
    await eventually(lambda: len(sent(connection, "AUDIO_STREAM")) >= 8, what="eight microphone chunks")
    assert await page.evaluate("client.stopListening()") is True
    await eventually(lambda: sent(connection, "VOICE_INPUT_END"), what="the end of the utterance")
    end = sent(connection, "VOICE_INPUT_END")[0]

    assert end["payload"] == {"reason": "user_stop"}
    chunks = sent(connection, "AUDIO_STREAM")
    assert chunks and connection.received.index(end) > connection.received.index(chunks[-1])
    pcm = b""
    for chunk in chunks:
        assert set(chunk["payload"]) == {"data", "mimeType"}
        assert chunk["payload"]["mimeType"] == MIC_MIME
        data = base64.b64decode(chunk["payload"]["data"], validate=True)
        assert data and len(data) % 2 == 0
        pcm += data
    # Full chunks of 256 ms; only the last one, sent at the stop, is shorter.
    assert all(len(base64.b64decode(c["payload"]["data"])) == MIC_CHUNK_BYTES for c in chunks[:-1])
    assert len(base64.b64decode(chunks[-1]["payload"]["data"])) <= MIC_CHUNK_BYTES
    # What went up is the recording, not silence.
    samples = array.array("h", pcm)
    assert max(abs(s) for s in samples) > 1000
    state = await voice(page)
    assert state["sentChunks"] == len(chunks)
    assert state["utterances"] == 1
    assert await page.evaluate("client.voiceState") == "waiting"
    assert await page.evaluate("window.errors") == []


async def test_the_agents_voice_plays_every_chunk_in_order_and_the_turn_completes(fake_server, page):
    chunks = tone_chunks(6)

    async def script(connection: FakeConnection) -> None:
        await connection.recv_type("HANDSHAKE_INIT")
        await connection.send(audio_ack())
        await connection.send(frame("SYSTEM_EVENT", {"kind": "transcript",
                                                     "data": {"role": "user", "text": "what is in my cart"}}))
        await connection.send(frame("SYSTEM_EVENT", {"kind": "transcript",
                                                     "data": {"role": "agent", "text": "Two headphones."}}))
        for chunk in chunks:
            await connection.send(chunk)
        await connection.send(frame("AGENT_RESPONSE", {"chunk": "Two headphones.", "done": True}))
        await connection.send(frame("VOICE_STATE_EVENT", {"event": "turn_complete"}))

    fake = await fake_server(script)
    await open_client_page(page, fake, RECORD_VOICE)
    await page.wait_for_function("window.__owl.voice.playedChunks === 6")
    await page.wait_for_function("client.voiceState === 'ready'")

    state = await voice(page)
    assert state["played"] == [1, 2, 3, 4, 5, 6]
    assert state["stoppedChunks"] == 0 and state["ignoredChunks"] == 0
    assert await page.evaluate("window.voiceStates") == ["ready", "speaking", "ready"]
    assert await page.evaluate("window.voiceEvents") == [{"event": "turn_complete"}]
    assert await page.evaluate("window.transcripts") == [
        {"role": "user", "text": "what is in my cart"},
        {"role": "agent", "text": "Two headphones."},
    ]
    # Playing sent nothing: no interrupt, no microphone.
    assert sent(fake.connections[0], "VOICE_INTERRUPT") == []
    assert sent(fake.connections[0], "AUDIO_STREAM") == []
    assert await page.evaluate("window.__owl.dropped") == 0


async def test_speaking_over_the_agent_stops_its_voice_sends_voice_interrupt_and_listens(fake_server, page):
    # Twenty seconds of the agent's voice: the looping recording speaks up in it.
    chunks = tone_chunks(80)

    async def script(connection: FakeConnection) -> None:
        await connection.recv_type("HANDSHAKE_INIT")
        await connection.send(audio_ack())
        await connection.recv_type("VOICE_INPUT_END")
        for chunk in chunks:
            await connection.send(chunk)
        await connection.recv_type("VOICE_INTERRUPT")
        # Audio already on its way when the interrupt arrived is not played.
        for chunk in tone_chunks(2):
            await connection.send(chunk)
        await connection.send(frame("VOICE_STATE_EVENT", {"event": "interrupted", "reason": "barge_in"}))

    fake = await fake_server(script)
    await open_client_page(page, fake, RECORD_VOICE)
    await page.wait_for_function("window.__owl.state === 'connected'")
    assert await page.evaluate("client.startListening()") is True
    connection = fake.connections[0]
    await eventually(lambda: sent(connection, "AUDIO_STREAM"), what="the first microphone chunk")
    await page.evaluate("client.stopListening()")
    before_answer = len(sent(connection, "AUDIO_STREAM"))

    await eventually(lambda: sent(connection, "VOICE_INTERRUPT"), timeout=40, what="the barge-in")
    await page.wait_for_function("window.voiceEvents.some((e) => e.event === 'interrupted')")

    interrupt = sent(connection, "VOICE_INTERRUPT")
    assert [message["payload"] for message in interrupt] == [{"reason": "barge_in"}]
    state = await voice(page)
    assert state["bargeIns"] == 1 and state["interrupts"] == 1
    assert "speaking" in await page.evaluate("window.voiceStates")
    # Stopped at once: what was still scheduled never played.
    assert state["stoppedChunks"] > 0
    assert state["playedChunks"] + state["stoppedChunks"] == state["scheduledChunks"]
    assert state["scheduledChunks"] <= len(chunks)
    assert state["ignoredChunks"] == 2 + len(chunks) - state["scheduledChunks"]
    # The user's words over the agent are the next utterance.
    assert await page.evaluate("client.voiceState") == "listening"
    await eventually(lambda: len(sent(connection, "AUDIO_STREAM")) > before_answer,
                     what="the next utterance's chunks")
    assert state["utterances"] == 2
