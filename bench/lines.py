"""The lines that answer "how many pages can one process serve, and what
does two give me?": loads of many sessions at once, product against baseline.

Each line runs the same client code against the product and the baseline
(bench.baseline), alternating which side goes first from one repeat to the
next. Before every baseline run the product is drained (bench.drain): its
session rows closed, its tool calls final and its process quiet, so the
product's deferred work is never timed on the baseline's clock. The
baseline answers with the product's byte sizes (``label``s of
``Peer.exchange``), so both sides move comparable bytes.
"""
from __future__ import annotations

import asyncio
import base64
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bench import fake_llm, measure
from bench.drain import Drainer
from bench.measure import (
    ANSWER_TIMEOUT,
    BENCH_TOOL,
    BenchError,
    Observations,
    Peer,
    Target,
    TurnInProgress,
    _close_all,
    alternating,
    echo_or,
    is_tools_effective,
    is_turn_done,
    one_turn,
)

# How many sessions are opened at once when a line sets up its sessions.
OPEN_CONCURRENCY = 50
TOOLS_PER_PAGE = 10
STREAM_PROMPT = "Tell me about this product."
TURN_RETRY_PAUSE = 0.001
MAX_TURN_RETRIES = 200
# The first session of a freshly started server (lazy imports, first queries).
WARMUP_TIMEOUT = 120.0
# One answer under a line's load. Far above the deployed client's own waits
# (5 s for the ACK): a slow answer is a slow sample, reported as such; only
# one this late stops the run as a hang.
LOAD_TIMEOUT = 60.0
# One open while thousands of sessions are already held: slow is a finding
# (the time the line takes), only this late a hang.
IDLE_OPEN_TIMEOUT = 300.0
# When a process holding many idle sessions counts as settled (bench.drain).
IDLE_WINDOW = 0.25
IDLE_SHARE = 0.5


def page_tools() -> list[dict]:
    """Ten tools, as a shop page declares them: the bench tool and nine more."""
    tools = [BENCH_TOOL]
    for number in range(1, TOOLS_PER_PAGE):
        tools.append({
            "name": f"page_tool_{number}",
            "description": f"Page tool number {number} of the benchmark page.",
            "parameters": {
                "type": "OBJECT",
                "properties": {"sku": {"type": "STRING", "description": "A product SKU"},
                               "quantity": {"type": "NUMBER", "description": "How many"}},
                "required": ["sku"],
            },
            "risk": "low",
        })
    return tools


PAGE_TOOLS = page_tools()


def page_context(index: int) -> dict:
    return {
        "url": f"/bench/page/{index}",
        "title": "Benchmark shop page",
        "activeTools": PAGE_TOOLS,
        "context": {"page": "product", "index": index, "price": 149.99, "currency": "EUR"},
    }


@dataclass(frozen=True)
class Side:
    target: Target
    pids: list[int]


@dataclass
class Sample:
    """One side's run of one load: ``count`` operations in ``seconds``, with
    each operation's latency; ``refusals``: USER_INPUTs refused while it ran."""

    count: int
    seconds: float
    latencies: list[float]
    refusals: int = 0
    extra: dict = field(default_factory=dict)

    @property
    def rate(self) -> float:
        return self.count / self.seconds if self.seconds > 0 else 0.0


def pooled(samples: Sequence[Sample]) -> Sample:
    """Several repeats as one: counts and seconds added, latencies pooled."""
    return Sample(
        count=sum(sample.count for sample in samples),
        seconds=sum(sample.seconds for sample in samples),
        latencies=[value for sample in samples for value in sample.latencies],
        refusals=sum(sample.refusals for sample in samples),
    )


RunOne = Callable[[Side], Awaitable[Sample]]


async def paired(product: Side, baseline: Side, *, repeats: int, run_one: RunOne,
                 drainer: Drainer) -> dict[str, Sample]:
    """Run ``run_one`` on both sides ``repeats`` times, alternating who goes
    first (the product first on the first repeat: the baseline copies its
    byte shape). The product is drained before every baseline run and the
    baseline before every product run. Pooled samples by side name."""
    runs: dict[str, list[Sample]] = {product.target.name: [], baseline.target.name: []}
    for repeat in range(repeats):
        for side in alternating([product, baseline], repeat):
            other = baseline if side is product else product
            await drainer.drain(other.pids)
            runs[side.target.name].append(await run_one(side))
    await drainer.drain(product.pids)
    return {name: pooled(samples) for name, samples in runs.items()}


# --- sessions ----------------------------------------------------------------------


async def open_pages(target: Target, api_key: str, log: Observations, count: int,
                     phase: str, *, timeout: float | None = None,
                     refused: list[str] | None = None,
                     context: Callable[[int], dict] | None = page_context,
                     capability: str | None = None) -> list[Peer]:
    """``count`` sessions, each with the page's ten-tool CONTEXT_UPDATE
    answered (tools_effective; the baseline: the product's bytes), opened
    OPEN_CONCURRENCY at a time. ``context=None``: the handshake only;
    ``capability``: HANDSHAKE_ACK must offer it. A failed open fails the
    whole, unless ``refused`` is given: then each failure is appended to it
    and the sessions that did open are returned."""
    gate = asyncio.Semaphore(OPEN_CONCURRENCY)
    answered = echo_or(is_tools_effective)

    async def one(index: int) -> Peer:
        async with gate:
            peer = await Peer.open(target, api_key, log, phase, timeout=timeout or LOAD_TIMEOUT)
            try:
                if capability is not None:
                    peer.require_capability(capability)
                if context is not None:
                    await peer.exchange("CONTEXT_UPDATE", context(index), answered,
                                        label="context10", timeout=timeout or LOAD_TIMEOUT)
            except BaseException:
                await peer.close()
                raise
            return peer

    results = await asyncio.gather(*(one(index) for index in range(count)),
                                   return_exceptions=True)
    peers = [result for result in results if isinstance(result, Peer)]
    failures = [result for result in results if isinstance(result, BaseException)]
    if failures and refused is not None and all(isinstance(f, Exception) for f in failures):
        refused.extend(f"{type(failure).__name__}: {failure}" for failure in failures)
    elif failures:
        await _close_all(peers)
        raise failures[0]
    return peers


async def each_peer(peers: Sequence[Peer], work: Callable[[Peer, int], Awaitable[None]]) -> float:
    """Run ``work(peer, number)`` for every peer at once; the wall seconds."""
    started = measure.clock()
    try:
        async with asyncio.TaskGroup() as group:
            for number, peer in enumerate(peers):
                group.create_task(work(peer, number))
    except* BenchError as errors:
        raise errors.exceptions[0] from None
    return measure.clock() - started


async def warm_up(target: Target, api_key: str, log: Observations) -> None:
    """Open and close one page on a freshly started server, untimed and with
    a long timeout: its lazy imports and first queries are not a sample."""
    peer = await Peer.open(target, api_key, log, "warm-up", timeout=WARMUP_TIMEOUT)
    try:
        await peer.exchange("CONTEXT_UPDATE", page_context(0), echo_or(is_tools_effective),
                            label="context10", timeout=WARMUP_TIMEOUT)
    finally:
        await peer.close()


# --- turns -------------------------------------------------------------------------


async def turns(side: Side, api_key: str, log: Observations, *, sessions: int,
                per_session: int) -> Sample:
    """``sessions`` pages at once, each running ``per_session`` whole turns
    back to back (USER_INPUT -> TOOL_CALL -> TOOL_RESULT -> streamed answer
    -> done). A refused USER_INPUT is retried on the turn's own clock."""
    peers = await open_pages(side.target, api_key, log, sessions, f"turns x{sessions}")
    latencies: list[float] = []
    refused_before = log.refusals

    async def work(peer: Peer, number: int) -> None:
        for turn in range(per_session):
            latencies.append(await one_turn(peer, number * per_session + turn, log,
                                            timeout=LOAD_TIMEOUT))

    try:
        seconds = await each_peer(peers, work)
    finally:
        await _close_all(peers)
    return Sample(count=sessions * per_session, seconds=seconds, latencies=latencies,
                  refusals=log.refusals - refused_before)


# --- session opens -------------------------------------------------------------------


async def opens(side: Side, api_key: str, log: Observations, *, count: int,
                concurrency: int) -> Sample:
    """``count`` session opens, ``concurrency`` at a time: connect, key check,
    HANDSHAKE_ACK, the ten-tool CONTEXT_UPDATE, tools_effective, close."""
    answered = echo_or(is_tools_effective)
    indexes = iter(range(count))
    latencies: list[float] = []

    async def worker() -> None:
        for index in indexes:
            started = measure.clock()
            peer = await Peer.open(side.target, api_key, log, "opens", timeout=LOAD_TIMEOUT)
            try:
                await peer.exchange("CONTEXT_UPDATE", page_context(index), answered,
                                    label="context10", timeout=LOAD_TIMEOUT)
                latencies.append(measure.clock() - started)
            finally:
                await peer.close()

    started = measure.clock()
    try:
        async with asyncio.TaskGroup() as group:
            for _ in range(min(concurrency, count)):
                group.create_task(worker())
    except* BenchError as errors:
        raise errors.exceptions[0] from None
    return Sample(count=count, seconds=measure.clock() - started, latencies=latencies)


# --- idle sessions and memory ----------------------------------------------------------


def rss_bytes(pid: int) -> int:
    """Resident memory of ``pid`` (VmRSS)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise BenchError(f"no VmRSS for process {pid}")


async def idle_memory(side: Side, api_key: str, log: Observations, *, sessions: int,
                      warmup: int, drainer: Drainer,
                      rss: Callable[[int], int] = rss_bytes) -> dict:
    """Memory per idle session: the server's RSS with ``sessions`` pages open
    (handshake + ten-tool context, drained and quiet) minus its RSS before,
    divided by the sessions held. ``warmup`` sessions are opened and closed
    first, so lazy imports and first-use caches are not counted as sessions.
    Opens the server refuses (it may time out handshakes when overloaded) are
    counted and reported, not hidden: memory is then per session it held."""
    pid = side.pids[0]
    if warmup:
        await _close_all(await open_pages(side.target, api_key, log, warmup, "idle warmup"))
    await drainer.drain(side.pids)
    before = rss(pid)
    opening = measure.clock()
    refused: list[str] = []
    peers = await open_pages(side.target, api_key, log, sessions, "idle sessions",
                             timeout=IDLE_OPEN_TIMEOUT, refused=refused)
    open_seconds = measure.clock() - opening
    held = len(peers)
    try:
        if not held:
            raise BenchError(f"{side.target.name}: no idle session opened: {refused[0]}")
        # Settled: every row written, and the process back to the background
        # work of that many idle sessions (heartbeats), measured over 0.25 s.
        await drainer.drain(side.pids, open_sessions=held, window=IDLE_WINDOW,
                            share=IDLE_SHARE)
        after = rss(pid)
    finally:
        await _close_all(peers)
    return {"sessions": held, "asked": sessions, "refused": len(refused),
            "first_refusal": refused[0] if refused else "", "rss_before": before,
            "rss_after": after, "bytes_per_session": (after - before) / held,
            "open_seconds": open_seconds}


# --- streaming -------------------------------------------------------------------------


def is_text_delta(frame: dict) -> bool:
    return frame.get("type") == "AGENT_RESPONSE" and frame["payload"].get("done") is False


async def send_until_accepted(peer: Peer, payload: dict, answered, log: Observations,
                               on_frame, timeout: float = ANSWER_TIMEOUT) -> list[dict]:
    for _ in range(MAX_TURN_RETRIES + 1):
        try:
            return await peer.exchange("USER_INPUT", payload, answered, on_frame=on_frame,
                                       timeout=timeout)
        except TurnInProgress:
            log.refusals += 1
            await asyncio.sleep(TURN_RETRY_PAUSE)
    raise BenchError(f"{peer.target.name}: the previous turn did not end")


async def streamed_deltas(side: Side, api_key: str, log: Observations, *, sessions: int,
                          per_session: int) -> Sample:
    """The product with the stamping fake model: ``sessions`` pages at once,
    each running ``per_session`` turns whose answer streams in deltas. One
    latency per delta: from the fake writing it to the page reading it."""
    peers = await open_pages(side.target, api_key, log, sessions, "streaming")
    latencies: list[float] = []

    def on_frame(frame: dict, _received_at: float) -> None:
        now = time.monotonic_ns()
        if is_text_delta(frame):
            chunk = frame["payload"].get("chunk", "")
            latencies.extend((now - emitted) / 1e9 for emitted in fake_llm.stamps(chunk))

    async def work(peer: Peer, number: int) -> None:
        for _ in range(per_session):
            await send_until_accepted(peer, {"modality": "text", "content": STREAM_PROMPT},
                                       is_turn_done_frame, log, on_frame, LOAD_TIMEOUT)

    try:
        seconds = await each_peer(peers, work)
    finally:
        await _close_all(peers)
    if not latencies:
        raise BenchError(f"{side.target.name}: no stamped text delta reached the page")
    return Sample(count=len(latencies), seconds=seconds, latencies=latencies)


def is_turn_done_frame(frame: dict, _sent: dict) -> bool:
    return is_turn_done(frame)


async def paced_echoes(side: Side, api_key: str, log: Observations, *, sessions: int,
                       per_session: int, pause: float) -> Sample:
    """The streaming line's baseline: ``sessions`` pages at once, each doing
    ``per_session`` echo round trips ``pause`` apart (the fake model's pace),
    answered with a frame of a product text delta's size."""
    peers = await open_pages(side.target, api_key, log, sessions, "streaming baseline")
    latencies: list[float] = []

    async def work(peer: Peer, number: int) -> None:
        for _ in range(per_session):
            started = measure.clock()
            await peer.exchange("USER_INPUT", {"modality": "text", "content": STREAM_PROMPT},
                                echo_or(lambda frame: False), label="stream.delta",
                                timeout=LOAD_TIMEOUT)
            latencies.append(measure.clock() - started)
            await asyncio.sleep(pause)

    try:
        seconds = await each_peer(peers, work)
    finally:
        await _close_all(peers)
    return Sample(count=len(latencies), seconds=seconds, latencies=latencies)


async def delta_frame_size(side: Side, api_key: str, log: Observations) -> int:
    """The size in bytes of one text delta frame of the product (one turn of
    one session, not timed): what the streaming baseline echoes."""
    # The first session of a fresh process imports the model client: not timed,
    # and given far longer than a sample.
    peer = await Peer.open(side.target, api_key, log, "streaming shape", timeout=WARMUP_TIMEOUT)
    peers = [peer]
    sizes: list[int] = []
    try:
        frames = await send_until_accepted(
            peer, {"modality": "text", "content": STREAM_PROMPT}, is_turn_done_frame, log,
            None, timeout=WARMUP_TIMEOUT)
        sizes = [len(_dumps(frame).encode()) for frame in frames if is_text_delta(frame)]
    finally:
        await _close_all(peers)
    if not sizes:
        raise BenchError(f"{side.target.name}: no text delta in a streamed answer")
    return sorted(sizes)[len(sizes) // 2]


# --- voice turns -----------------------------------------------------------------------

# What the page's user says: a short request, spoken by eSpeak NG a little
# slower than its default (as the voice tests' microphone), with silence
# around it as a microphone picks up.
VOICE_UTTERANCE = "what is in my cart"
MIC_WPM = 130
MIC_SILENCE_SECONDS = 0.3
MIC_RATE = 16000
# 256 ms of 16 kHz 16-bit mono a chunk, as the deployed client sends.
MIC_CHUNK_BYTES = 8192
# Turns each session runs at a concurrency step, at least: with one each, the
# sessions would only ever speak in lock step.
MIN_VOICE_TURNS = 2


def spoken_utterance(text: str = VOICE_UTTERANCE) -> bytes:
    """``text`` spoken by the espeak-ng binary, as 16 kHz 16-bit mono PCM with
    silence before and after: the voice line's microphone, made once per run."""
    from aitp.voice.audio import resample
    from aitp.voice.base import SpeechError
    from runtime.config import EspeakConfig
    from speech.offline import EspeakTts

    try:
        spoken = EspeakTts(EspeakConfig(voice="en-us", words_per_minute=MIC_WPM, timeout=30.0,
                                          program="espeak-ng")).synthesize_now(text)
    except SpeechError as exc:
        raise BenchError(f"the voice line speaks its utterance with eSpeak NG: "
                         f"{exc.detail or exc.message} (make espeak installs it; --only "
                         "without voice skips the line)") from None
    silence = b"\0\0" * int(MIC_SILENCE_SECONDS * MIC_RATE)
    return silence + resample(spoken, MIC_RATE).pcm + silence


def microphone_chunks(pcm: bytes, size: int = MIC_CHUNK_BYTES) -> list[str]:
    """PCM cut into AUDIO_STREAM chunks (whole 16-bit samples), each base64."""
    if size < 2 or size % 2:
        raise ValueError(f"a chunk holds whole 16-bit samples, got {size} bytes")
    return [base64.b64encode(pcm[start:start + size]).decode("ascii")
            for start in range(0, len(pcm), size)]


def concurrency_steps(cap: int) -> list[int]:
    """1, 2, 4, 8, ... up to ``cap``, and ``cap`` itself."""
    if cap < 1:
        raise ValueError(f"the largest concurrency must be >= 1, got {cap}")
    steps = [1]
    while steps[-1] * 2 <= cap:
        steps.append(steps[-1] * 2)
    if steps[-1] != cap:
        steps.append(cap)
    return steps


def voice_turns_per_session(samples: int, sessions: int) -> int:
    """Turns each of ``sessions`` runs so a step has at least ``samples``
    (and every session at least MIN_VOICE_TURNS)."""
    return max(MIN_VOICE_TURNS, math.ceil(samples / sessions))


async def voice_turns(side: Side, api_key: str, log: Observations, *, sessions: int,
                      per_session: int, chunks: Sequence[str], phase: str = "voice",
                      timeout: float = LOAD_TIMEOUT) -> Sample:
    """``sessions`` pages at once, each offered ``audio`` at its handshake and
    speaking ``per_session`` turns back to back (the utterance's chunks,
    VOICE_INPUT_END, the answer to done:true). One latency per turn: from
    VOICE_INPUT_END to the first AUDIO_STREAM frame of the agent's voice
    (``extra["heard"]``: to the transcript of the utterance). A turn the
    product answered ``no_speech`` is no sample: ``extra["unheard"]`` counts
    them."""
    peers = await open_pages(side.target, api_key, log, sessions, phase, timeout=timeout,
                             context=None, capability="audio")
    latencies: list[float] = []
    heard: list[float] = []
    unheard = 0

    async def work(peer: Peer, number: int) -> None:
        nonlocal unheard
        for _ in range(per_session):
            turn = await measure.one_voice_turn(peer, chunks, timeout=timeout)
            if turn.first_audio is None or turn.heard is None:
                unheard += 1
                continue
            latencies.append(turn.first_audio)
            heard.append(turn.heard)

    try:
        seconds = await each_peer(peers, work)
    finally:
        await _close_all(peers)
    if not latencies:
        raise BenchError(f"{side.target.name}: none of {unheard} voice turns was heard "
                         "(no_speech)")
    return Sample(count=len(latencies), seconds=seconds, latencies=latencies,
                  extra={"heard": heard, "unheard": unheard})


def _dumps(frame: dict) -> str:
    import json

    return json.dumps(frame)


__all__ = [
    "ANSWER_TIMEOUT",
    "Sample",
    "Side",
    "concurrency_steps",
    "delta_frame_size",
    "idle_memory",
    "opens",
    "paced_echoes",
    "paired",
    "rss_bytes",
    "streamed_deltas",
    "turns",
    "voice_turns",
]
