"""The in-page client's voice (protocol.md, voice), in real Chromium
against a scripted server: the microphone is Chromium's fake capture device
playing speech that eSpeak NG recorded at test time, and what the client
sends and plays is read from the wire and from its counters (never from
the sound itself)."""
from __future__ import annotations

import array
import base64
import math
import wave

import numpy as np
import pytest
import soxr

from tests.browser.conftest import FakeConnection, ack, eventually, frame, open_client_page
from tests.browser.voice_support import (  # noqa: F401 (browser, microphone*: fixtures)
    MIC_CHUNK_BYTES,
    MIC_MIME,
    audio_ack,
    browser,
    microphone,
    microphone_allowed,
    microphone_loops,
    tone_chunks,
    transcript,
    voice_state,
)

pytestmark = [pytest.mark.browser]

# The client's level detector (RMS, full scale 1): at or above it is speech.
BARGE_IN_LEVEL = 0.02

RECORD_VOICE = (
    "window.voiceStates = []; window.voiceEvents = []; window.transcripts = []; window.errors = [];"
    "client.on('voice', (s) => window.voiceStates.push(s));"
    "client.on('voice.event', (e) => window.voiceEvents.push(e));"
    "client.on('transcript.delta', (t) => window.transcripts.push(t));"
    "client.on('error', (e) => window.errors.push(e.message));"
)


def sent(connection: FakeConnection, type_: str, after: int = -1) -> list[dict]:
    """The frames of `type_` the page sent (after the one at index `after`)."""
    return [message for message in connection.received[after + 1:] if message["type"] == type_]


async def voice(page) -> dict:
    """The client's voice counters (window.__owl.voice)."""
    return await page.evaluate("window.__owl.voice")


async def say_something(fake_server, page, script) -> FakeConnection:
    """The page records its microphone until the first chunk is up, then
    stops: the server's end of the connection."""
    fake = await fake_server(script)
    await open_client_page(page, fake, RECORD_VOICE)
    await page.wait_for_function("window.__owl.state === 'connected'")
    assert await page.evaluate("client.startListening()") is True
    connection = fake.connections[0]
    await eventually(lambda: sent(connection, "AUDIO_STREAM"), what="the first microphone chunk")
    await page.evaluate("client.stopListening()")
    return connection


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
        await connection.send(transcript("user", "what is in my cart"))
        await connection.send(transcript("agent", "Two headphones."))
        for chunk in chunks:
            await connection.send(chunk)
        await connection.send(frame("AGENT_RESPONSE", {"chunk": "Two headphones.", "done": True}))
        await connection.send(voice_state("turn_complete"))

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
        await connection.send(voice_state("interrupted", reason="barge_in"))

    connection = await say_something(fake_server, page, script)
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


async def test_the_words_that_set_off_a_barge_in_begin_the_next_utterance_whole(fake_server, page):
    async def script(connection: FakeConnection) -> None:
        await connection.recv_type("HANDSHAKE_INIT")
        await connection.send(audio_ack())
        await connection.recv_type("VOICE_INPUT_END")
        for chunk in tone_chunks(80):
            await connection.send(chunk)

    connection = await say_something(fake_server, page, script)
    await eventually(lambda: sent(connection, "VOICE_INTERRUPT"), timeout=40, what="the barge-in")
    interrupt_at = connection.received.index(sent(connection, "VOICE_INTERRUPT")[0])
    # Three chunks of the next utterance: three quarters of a second.
    await eventually(lambda: len(sent(connection, "AUDIO_STREAM", after=interrupt_at)) >= 3,
                     what="the next utterance's first chunks")

    utterance = np.frombuffer(b"".join(
        base64.b64decode(m["payload"]["data"]) for m in sent(connection, "AUDIO_STREAM", after=interrupt_at)
    ), dtype="<i2").astype(np.float64) / 32768
    # The level of each 20 ms, as the detector measures it.
    windows = [np.sqrt(np.mean(utterance[i:i + 320] ** 2)) for i in range(0, len(utterance) - 319, 320)]
    # It starts in the quiet before the first word (the level detector heard
    # the word only after it had begun), and the word follows.
    assert windows[0] < BARGE_IN_LEVEL
    assert max(windows) >= BARGE_IN_LEVEL


async def test_an_utterance_longer_than_the_limit_ends_with_the_timeout_reason(fake_server, page):
    async def script(connection: FakeConnection) -> None:
        await connection.recv_type("HANDSHAKE_INIT")
        await connection.send(audio_ack())

    fake = await fake_server(script)
    await open_client_page(page, fake, RECORD_VOICE + "client.voiceOptions.maxUtteranceMs = 2000;")
    await page.wait_for_function("window.__owl.state === 'connected'")
    assert await page.evaluate("client.startListening()") is True
    connection = fake.connections[0]

    await eventually(lambda: sent(connection, "VOICE_INPUT_END"), what="the end of the utterance")

    assert [m["payload"] for m in sent(connection, "VOICE_INPUT_END")] == [{"reason": "timeout"}]
    assert sent(connection, "AUDIO_STREAM")
    assert await page.evaluate("client.voiceState") == "waiting"


async def test_audio_the_server_refuses_stops_the_utterance_with_the_error_shown(fake_server, page):
    async def script(connection: FakeConnection) -> None:
        await connection.recv_type("HANDSHAKE_INIT")
        await connection.send(audio_ack())
        await connection.recv_type("AUDIO_STREAM")
        await connection.send(frame("SYSTEM_EVENT", {
            "kind": "error", "message": "Live audio must be 16 kHz.", "data": {"code": "unsupported_audio_rate"},
        }))
        await connection.send(frame("AGENT_RESPONSE", {"chunk": "", "done": True}))

    fake = await fake_server(script)
    await open_client_page(page, fake, RECORD_VOICE)
    await page.wait_for_function("window.__owl.state === 'connected'")
    assert await page.evaluate("client.startListening()") is True

    await page.wait_for_function("window.errors.length === 1")
    await page.wait_for_function("client.voiceState === 'ready'")
    assert await page.evaluate("window.errors") == ["Live audio must be 16 kHz."]
    chunks = await page.evaluate("window.__owl.voice.sentChunks")
    captured = await page.evaluate("window.__owl.voice.micChunks")
    # The microphone goes on (for barge-in), but nothing more goes up, and
    # no end for an utterance the server refused.
    await page.wait_for_function(f"window.__owl.voice.micChunks >= {captured + 2}")
    assert await page.evaluate("client.stopListening()") is False
    assert await page.evaluate("window.__owl.voice.sentChunks") == chunks
    assert sent(fake.connections[0], "VOICE_INPUT_END") == []
    assert await page.evaluate("window.__owl.state") == "connected"


def best_match(captured: np.ndarray, reference: np.ndarray) -> float:
    """The highest normalised correlation (Pearson's r) of `reference` with
    any stretch of `captured` of its length, every offset tried (FFT)."""
    n = len(reference)
    reference = (reference - reference.mean()) / reference.std()
    size = 1 << (len(captured) + n).bit_length()
    products = np.fft.irfft(np.fft.rfft(captured, size) * np.conj(np.fft.rfft(reference, size)), size)
    sliding = products[: len(captured) - n + 1]
    sums = np.concatenate(([0.0], np.cumsum(captured)))
    squares = np.concatenate(([0.0], np.cumsum(captured * captured)))
    window_sum = sums[n:] - sums[:-n]
    window_var = (squares[n:] - squares[:-n]) - window_sum * window_sum / n
    spread = np.sqrt(np.maximum(window_var, 1e-9) * n)
    return float(np.max(sliding / spread))


@pytest.mark.parametrize("context_rate", [16000, 48000, 44100])
async def test_what_goes_up_is_the_recording_at_16_khz_whatever_rate_the_context_runs_at(
    fake_server, page, microphone, context_rate
):
    async def script(connection: FakeConnection) -> None:
        await connection.recv_type("HANDSHAKE_INIT")
        await connection.send(audio_ack())

    fake = await fake_server(script)
    await open_client_page(page, fake, RECORD_VOICE + f"client.voiceOptions.captureRate = {context_rate};")
    await page.wait_for_function("window.__owl.state === 'connected'")
    assert await page.evaluate("client.startListening()") is True
    assert await page.evaluate("window.__owl.voice.micRate") == context_rate
    connection = fake.connections[0]
    # Twice the recording's length: one whole playing of it is inside.
    with wave.open(str(microphone)) as recording:
        seconds = recording.getnframes() / recording.getframerate()
        reference = np.frombuffer(recording.readframes(recording.getnframes()), dtype="<i2")
        rate = recording.getframerate()
    needed = math.ceil(2 * seconds * 16000 * 2 / MIC_CHUNK_BYTES)
    await eventually(lambda: len(sent(connection, "AUDIO_STREAM")) >= needed, what="two recordings' worth")
    await page.evaluate("client.stopListening()")

    captured = np.frombuffer(b"".join(
        base64.b64decode(m["payload"]["data"]) for m in sent(connection, "AUDIO_STREAM")
    ), dtype="<i2").astype(np.float64)
    # The spoken part of the recording, at 16 kHz: found in what went up
    # only when the chunks really are 16 kHz (at another rate it is
    # stretched or squeezed and matches nothing).
    spoken = soxr.resample(reference.astype(np.float64), rate, 16000)[: int(16000 * 1.5)]
    assert best_match(captured, spoken) > 0.5
    # The check itself tells rates apart: 10% off already matches nothing.
    assert best_match(captured, soxr.resample(spoken, 16000, 17600)) < 0.3
