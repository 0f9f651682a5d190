"""Speech engines never stall the process serving the pages: a real daphne
process with the offline engines (PocketSphinx, eSpeak NG) running in its
pool of speech worker processes, real speech made by eSpeak NG at test time,
and the fake Messages API through the real SDK.

Each test measures or counts what another page of the same process sees
while voice work runs: its round trips, its answers, its refusals."""
from __future__ import annotations

import asyncio
import base64
import os
import signal
import statistics
from pathlib import Path

import pytest

from aitp_client import AitpClient, AitpClosed, system_event
from tests.aitp.conftest import ORIGIN
from tests.aitp.test_voice_e2e import PATIENCE, kind
from tests.speech.conftest import needs_espeak, silence, speak
from tests.support.fake_anthropic import FakeAnthropicServer, text_response

pytestmark = [pytest.mark.django_db(transaction=True), needs_espeak]

API_KEY = "sk-ant-voice-isolation"
# Plain speech, no grammar: the full English model, the slowest to decode.
STORY = ("The travel speaker arrived on Tuesday and sounds wonderful in the kitchen. "
         "My sister wants the same one for her birthday, so please tell me whether it comes in blue, "
         "how long the battery lasts on a full charge, and when a second order would arrive. ")
# The one timing bound asked of these tests: another page's worst round trip
# while a long utterance is transcribed.
ROUND_TRIP_BOUND = 1.0
# Between two CONTEXT_UPDATEs of the probing page: under the frame rate limit.
PROBE_PAUSE = 0.1
# How long a voice page may wait for its next frame: the full model takes
# up to twice an utterance's length to decode on a loaded machine.
SPEECH_PATIENCE = 180


@pytest.fixture
def other_key(db):
    """A key of another tenant."""
    from aitp import tenancy

    tenant = tenancy.tenant_create(slug="globex", name="Globex")
    key, raw = tenancy.key_create(tenant=tenant, name="web", allowed_origins=[ORIGIN])
    key.raw = raw
    return key


@pytest.fixture
def fake():
    with FakeAnthropicServer(api_key=API_KEY) as server:
        yield server


def voice_server(daphne_factory, fake, **env):
    settings = {
        "OWLLAYER_LLM": "anthropic",
        "ANTHROPIC_API_KEY": API_KEY,
        "ANTHROPIC_BASE_URL": fake.base_url,
        "OWLLAYER_MODEL": "claude-test-model",
        "OWLLAYER_LLM_MAX_RETRIES": 0,
        "OWLLAYER_VOICE": "1",
        "OWLLAYER_STT": "pocketsphinx",
        "OWLLAYER_TTS": "espeak",
        "OWLLAYER_STT_GRAMMAR": None,
        "OWLLAYER_HANDSHAKE_TIMEOUT": "60",
        "OWLLAYER_VOICE_TIMEOUT": "120",
    }
    return daphne_factory(**{**settings, **env})


def spoken_message(seconds: float) -> str:
    """`seconds` of eSpeak NG speech (16 kHz PCM), as a USER_INPUT audio content."""
    pcm = b""
    while len(pcm) < seconds * 32000:
        pcm += speak(STORY).pcm + silence(0.3)
    return base64.b64encode(pcm[: int(seconds * 16000) * 2]).decode()


async def open_page(server, key, *, audio: bool = True) -> AitpClient:
    client = AitpClient(server.ws_url(), api_key=key.raw, origin=ORIGIN)
    ack = await client.connect(timeout=PATIENCE)
    assert ("audio" in ack["capabilities"]) is audio
    await client.context_update("/cart", "Cart")
    await client.recv_until(system_event("tools_effective"), timeout=PATIENCE)
    return client


async def turn_frames(client: AitpClient) -> list[dict]:
    """Every frame of the page's turn, up to its closing AGENT_RESPONSE done."""
    frames: list[dict] = []
    while not frames or not (frames[-1]["type"] == "AGENT_RESPONSE" and frames[-1]["payload"]["done"]):
        try:
            frames.append(await client.recv(SPEECH_PATIENCE))
        except TimeoutError:
            raise AssertionError(f"the turn never ended: {[kind(f) for f in frames]}") from None
    return frames


async def round_trips_until(page: AitpClient, over: asyncio.Future) -> list[float]:
    """CONTEXT_UPDATE -> tools_effective round trips of `page`, one after another, until `over` is done."""
    loop = asyncio.get_running_loop()
    times: list[float] = []
    n = 0
    while not over.done():
        n += 1
        started = loop.time()
        await page.context_update(f"/cart?probe={n}", "Cart")
        await page.recv_until(system_event("tools_effective"), timeout=PATIENCE)
        times.append(loop.time() - started)
        await asyncio.wait({over}, timeout=PROBE_PAUSE)
    return times


async def test_a_long_spoken_message_leaves_another_page_on_the_process_answering_within_a_second(
        daphne_factory, fake, api_key):
    content = spoken_message(20)
    fake.enqueue(text_response("Blue it is.", chunks=1))
    server = voice_server(daphne_factory, fake)
    speaker, other = await open_page(server, api_key), await open_page(server, api_key)
    try:
        await speaker.send("USER_INPUT", {"modality": "audio", "mimeType": "audio/pcm;rate=16000",
                                          "content": content})
        heard = asyncio.ensure_future(turn_frames(speaker))
        times = await round_trips_until(other, heard)
        frames = await heard
    finally:
        await speaker.close()
        await other.close()
    kinds = [kind(f) for f in frames]
    # The utterance was transcribed while the other page was measured.
    assert kinds[0] == "transcript:user", kinds
    assert times, "the other page was measured while the speech was heard"
    worst, median = max(times), statistics.median(times)
    assert worst < ROUND_TRIP_BOUND, f"worst {worst:.3f} s, median {median:.3f} s over {len(times)}"


# --- the pool's bounds, seen from the pages ---------------------------------------------


def outcome(frames: list[dict]) -> str:
    """What became of a spoken turn's utterance: heard, or the code that refused it."""
    for frame in frames:
        if kind(frame) == "transcript:user":
            return "heard"
        if frame["type"] == "SYSTEM_EVENT" and frame["payload"]["kind"] == "error":
            return frame["payload"]["data"]["code"]
    return "nothing"


def refused_turn_ends(frames: list[dict], code: str) -> dict:
    """The refusal's error event, after checking that the turn ended for the
    page: the error, then turn_complete, then an empty done."""
    kinds = [kind(f) for f in frames]
    assert kinds[-3:] == [f"error:{code}", "voice:turn_complete", "AGENT_RESPONSE"], kinds
    assert frames[-1]["payload"] == {"chunk": "", "done": True}
    assert "transcript:user" not in kinds
    return frames[-3]["payload"]


async def say(client: AitpClient, content: str) -> None:
    await client.send("USER_INPUT", {"modality": "audio", "mimeType": "audio/pcm;rate=16000",
                                     "content": content})


async def test_voice_pages_past_the_workers_and_the_queue_get_speech_busy_while_a_text_page_answers(
        daphne_factory, fake, api_key):
    # Two workers and the queue's default size; one key for every page, its
    # own share unbounded here, so that only the pool's bounds refuse.
    server = voice_server(daphne_factory, fake, OWLLAYER_VOICE_JOBS="2", OWLLAYER_VOICE_QUEUE=None,
                          OWLLAYER_VOICE_JOBS_PER_KEY="0")
    capacity = 2 + 4
    content = spoken_message(6)
    pages = [await open_page(server, api_key) for _ in range(capacity + 1)]
    text_page = await open_page(server, api_key)
    try:
        await asyncio.gather(*(say(page, content) for page in pages))
        turns = asyncio.ensure_future(asyncio.gather(*(turn_frames(page) for page in pages)))
        times = await round_trips_until(text_page, turns)
        await text_page.send("USER_INPUT", {"modality": "text", "content": "is it in stock"})
        typed = await turn_frames(text_page)
        frames = await turns
    finally:
        for page in [*pages, text_page]:
            await page.close()
    outcomes = sorted(outcome(f) for f in frames)
    assert outcomes == ["heard"] * capacity + ["speech_busy"], outcomes
    busy = next(f for f in frames if outcome(f) == "speech_busy")
    refused_turn_ends(busy, "speech_busy")
    assert typed[-1]["payload"]["done"] and typed[-1]["payload"]["chunk"]
    assert times and max(times) < ROUND_TRIP_BOUND, f"worst {max(times):.3f} s over {len(times)}"


async def test_a_key_past_its_speech_jobs_at_once_gets_speech_rate_limited_and_its_turn_still_ends(
        daphne_factory, fake, api_key, other_key):
    server = voice_server(daphne_factory, fake, OWLLAYER_VOICE_JOBS="2", OWLLAYER_VOICE_JOBS_PER_KEY="1")
    content = spoken_message(6)
    pages = [await open_page(server, api_key), await open_page(server, api_key)]
    other = await open_page(server, other_key)
    try:
        await asyncio.gather(*(say(page, content) for page in [*pages, other]))
        frames = await asyncio.gather(*(turn_frames(page) for page in [*pages, other]))
    finally:
        for page in [*pages, other]:
            await page.close()
    # One of the key's two utterances waits or runs: the other is its second at once.
    assert sorted(outcome(f) for f in frames[:2]) == ["heard", "speech_rate_limited"]
    limited = next(f for f in frames[:2] if outcome(f) == "speech_rate_limited")
    assert refused_turn_ends(limited, "speech_rate_limited")["data"]["limit"] == "speech_jobs_per_key"
    assert outcome(frames[2]) == "heard", "another key has its own share"


async def test_a_key_past_its_seconds_of_speech_per_minute_gets_speech_rate_limited_and_its_turn_still_ends(
        daphne_factory, fake, api_key, other_key):
    server = voice_server(daphne_factory, fake, OWLLAYER_VOICE_SECONDS_PER_KEY_PER_MINUTE="5")
    content = spoken_message(3)
    page, other = await open_page(server, api_key), await open_page(server, other_key)
    try:
        await say(page, content)
        first = await turn_frames(page)
        await say(page, content)
        second = await turn_frames(page)
        await say(other, content)
        elsewhere = await turn_frames(other)
    finally:
        await page.close()
        await other.close()
    assert outcome(first) == "heard"
    data = refused_turn_ends(second, "speech_rate_limited")["data"]
    assert data["limit"] == "speech_seconds_per_key"
    assert 0 < data["retryAfterMs"] <= 60_000
    assert outcome(elsewhere) == "heard", "another key has its own minute"


# --- workers that crash, hang, or outlive their server ---------------------------------------


def children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def descendants(pid: int) -> set[int]:
    found: set[int] = set()
    todo = [pid]
    while todo:
        for child in children(todo.pop()):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def speech_workers(server) -> list[int]:
    """The server's speech worker processes: the children of its forkserver."""
    for child in children(server.process.pid):
        if b"forkserver" in Path(f"/proc/{child}/cmdline").read_bytes():
            return children(child)
    return []


def cpu_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


def running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


async def at_work(pid: int, before: int) -> None:
    """Until the worker has spent a fifth of a second of CPU since `before`: it is on the job."""
    for _ in range(int(SPEECH_PATIENCE / 0.05)):
        if cpu_ticks(pid) - before >= os.sysconf("SC_CLK_TCK") // 5:
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the speech worker never started the job")


async def until_gone(pids, what: str) -> None:
    for _ in range(int(SPEECH_PATIENCE / 0.05)):
        if not any(running(pid) for pid in pids):
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"still running: {what}")


async def test_a_speech_worker_killed_mid_utterance_fails_the_turn_with_speech_failed_and_the_next_is_heard(
        daphne_factory, fake, api_key):
    server = voice_server(daphne_factory, fake, OWLLAYER_VOICE_JOBS="1")
    page = await open_page(server, api_key)
    try:
        [worker] = speech_workers(server)
        before = cpu_ticks(worker)
        await say(page, spoken_message(10))
        await at_work(worker, before)
        os.kill(worker, signal.SIGKILL)
        failed = await turn_frames(page)
        await say(page, spoken_message(3))
        after = await turn_frames(page)
    finally:
        await page.close()
    refused_turn_ends(failed, "speech_failed")
    assert outcome(after) == "heard"
    assert worker not in speech_workers(server), "a new worker took its place"


async def test_a_speech_worker_that_hangs_fails_the_turn_with_speech_timeout_and_the_next_is_heard(
        daphne_factory, fake, api_key):
    server = voice_server(daphne_factory, fake, OWLLAYER_VOICE_JOBS="1", OWLLAYER_VOICE_TIMEOUT="10")
    page = await open_page(server, api_key)
    try:
        [worker] = speech_workers(server)
        os.kill(worker, signal.SIGSTOP)  # it hangs: alive, answering nothing
        await say(page, spoken_message(2))
        hung = await turn_frames(page)
        await until_gone([worker], "the hung worker is killed")
        await say(page, spoken_message(3))
        after = await turn_frames(page)
    finally:
        await page.close()
    refused_turn_ends(hung, "speech_timeout")
    assert outcome(after) == "heard"


async def test_stopping_the_server_mid_transcription_leaves_no_speech_process_behind(
        daphne_factory, fake, api_key):
    server = voice_server(daphne_factory, fake, OWLLAYER_VOICE_JOBS="2")
    page = await open_page(server, api_key)
    workers = speech_workers(server)
    assert len(workers) == 2
    before = {worker: cpu_ticks(worker) for worker in workers}
    await say(page, spoken_message(20))
    watching = [asyncio.ensure_future(at_work(worker, ticks)) for worker, ticks in before.items()]
    _, others = await asyncio.wait(watching, return_when=asyncio.FIRST_COMPLETED)
    for watch in others:
        watch.cancel()
    helpers = descendants(server.process.pid)
    assert set(workers) <= helpers
    exit_code = await asyncio.to_thread(server.stop)
    with pytest.raises(AitpClosed):
        while True:
            await page.recv(SPEECH_PATIENCE)
    assert exit_code == 0
    # The workers were stopped (the busy one cut short) before the server exited...
    assert not any(running(worker) for worker in workers)
    # ...and the forkserver that started them and its resource tracker follow it.
    await until_gone(helpers, "a process the server started")
