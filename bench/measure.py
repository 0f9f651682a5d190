"""The measurements: each drives the product and the baseline the same way.

The client's work is identical on both sides (the same frames sent, every
frame received parsed as JSON, the same predicate), so the difference is the
server's. Latency phases alternate product and baseline sample by sample,
swapping the order each time, so a burst of noise on the machine lands on
both. Frames received from the product are checked against the deployed
client's schema after the timed part, never inside it.

Every loop has a fixed count and every wait a timeout.
"""
from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from websockets.exceptions import ConnectionClosed

from aitp_client import AitpClient, AitpError, envelope, frame_problems
from bench.baseline import REPLY_FIELD

logger = logging.getLogger(__name__)

# One answer (or one connection's handshake) longer than this is a hang,
# not a slow sample: the run stops and says so.
ANSWER_TIMEOUT = 10.0
# Frames read while waiting for one answer; the product sends a few
# (waiting, deltas), never hundreds.
MAX_FRAMES_PER_ANSWER = 200
# A spoken answer is more: an AUDIO_STREAM frame per 250 ms of the agent's
# voice, a transcript per sentence, the text deltas (protocol.md §5a).
MAX_FRAMES_PER_VOICE_TURN = 2000

# Most updates of a real page change its context; fewer change the route.
ROUTE_EVERY = 10

BENCH_TOOL = {
    "name": "bench_echo",
    "description": "Return the arguments it was given (benchmark tool).",
    "parameters": {
        "type": "OBJECT",
        "properties": {"n": {"type": "NUMBER", "description": "A counter"}},
        "required": ["n"],
    },
    "risk": "low",
}


# The product refuses USER_INPUT while a turn is still closing; how often a
# turn is retried before the run gives up, and the pause between tries. The
# sample's clock runs from the first try: time refused is time the page waits.
MAX_TURN_RETRIES = 200
TURN_RETRY_PAUSE = 0.001

# The clock of every sample (replaced by a fake in the tests).
clock = time.perf_counter


class BenchError(RuntimeError):
    """The run cannot produce a meaningful number (a hang, an error answer)."""


class TurnInProgress(BenchError):
    """The product refused a USER_INPUT because the previous turn has not ended."""


@dataclass(frozen=True)
class Target:
    name: str
    url: str
    # Check received frames against the deployed client's schema. Off for
    # the baseline: its echoes are client frames by design. The baseline is
    # the target that does not check: it is asked to answer with the
    # product's byte shape (bench.baseline.REPLY_FIELD).
    check_frames: bool

    @property
    def is_baseline(self) -> bool:
        return not self.check_frames


@dataclass
class Observations:
    """What the run saw besides its numbers: the product's frames (checked
    against the schema after timing), turns refused as still in progress, and
    the byte sizes of the product's answers (the shape the baseline copies)."""

    frames: list[tuple[str, object]] = field(default_factory=list)
    turns: int = 0
    turns_refused: int = 0
    refusals: int = 0
    # label of an exchange -> sizes in bytes of the frames the product answered with
    shape: dict[str, list[int]] = field(default_factory=dict)
    keep_frames: bool = True
    extra_notes: list[str] = field(default_factory=list)

    def notes(self) -> list[str]:
        if not self.turns_refused:
            return list(self.extra_notes)
        return [*self.extra_notes,
            f"{self.turns_refused} of {self.turns} product turns: USER_INPUT sent right after "
            f"the previous done:true was refused with turn_in_progress ({self.refusals} "
            "refusals in all; retried, and the time refused is part of the turn's sample)"
        ]

    def record_shape(self, label: str, sizes: list[int]) -> None:
        """The product's answer sizes for ``label``: the first one seen stays."""
        self.shape.setdefault(label, list(sizes))

    def reply_sizes(self, label: str) -> list[int]:
        """What the baseline must answer for ``label``: the product's sizes."""
        try:
            return self.shape[label]
        except KeyError:
            raise BenchError(f"the baseline was asked for {label!r} before the product "
                             "answered one: no byte shape to copy") from None

    def problems(self) -> list[str]:
        found = []
        for phase, frame in self.frames:
            problems = frame_problems(frame, sender="server")
            if problems:
                kind = frame.get("type") if isinstance(frame, dict) else type(frame).__name__
                found.append(f"{phase}: {kind}: {'; '.join(problems)}")
        return found


def alternating(targets: Sequence[Target], index: int) -> Sequence[Target]:
    """Product first on even samples, baseline first on odd ones."""
    return targets if index % 2 == 0 else list(reversed(targets))


# --- answers -------------------------------------------------------------------


def is_tools_effective(frame: dict) -> bool:
    return frame.get("type") == "SYSTEM_EVENT" and frame["payload"].get("kind") == "tools_effective"


def is_tool_call(frame: dict) -> bool:
    return frame.get("type") == "TOOL_CALL"


def is_turn_done(frame: dict) -> bool:
    return frame.get("type") == "AGENT_RESPONSE" and frame["payload"].get("done") is True


def is_agent_audio(frame: dict) -> bool:
    return frame.get("type") == "AUDIO_STREAM"


def is_voice_state(frame: dict, event: str) -> bool:
    return frame.get("type") == "VOICE_STATE_EVENT" and frame["payload"].get("event") == event


def is_transcript(frame: dict, role: str) -> bool:
    if frame.get("type") != "SYSTEM_EVENT" or frame["payload"].get("kind") != "transcript":
        return False
    return (frame["payload"].get("data") or {}).get("role") == role


def echo_or(predicate: Callable[[dict], bool]) -> Callable[[dict, dict], bool]:
    """The answer to ``sent``: the product's frame, or the baseline's echo of it."""

    def answered(frame: dict, sent: dict) -> bool:
        return frame.get("id") == sent["id"] or predicate(frame)

    return answered


# --- one connection ----------------------------------------------------------------


class Peer:
    """One open AITP session; tight loops use its raw socket."""

    def __init__(self, target: Target, client: AitpClient, log: Observations, phase: str) -> None:
        self.target = target
        self.client = client
        self.log = log
        self.phase = phase

    @classmethod
    async def open(cls, target: Target, api_key: str, log: Observations, phase: str, *,
                   timeout: float = ANSWER_TIMEOUT) -> Peer:
        client = AitpClient(target.url, api_key=api_key)
        try:
            await client.connect(timeout=timeout)
        except (AitpError, TimeoutError, OSError) as exc:
            await client.close()
            raise BenchError(f"{target.name}: handshake failed: {exc}") from None
        return cls(target, client, log, phase)

    async def close(self) -> None:
        await self.client.close()

    def require_capability(self, name: str) -> None:
        """The run measures what the handshake offered, or stops and says so."""
        offered = list((self.client.ack or {}).get("capabilities") or [])
        if name not in offered:
            raise BenchError(f"{self.target.name}: HANDSHAKE_ACK offered {offered}, not "
                             f"{name!r}")

    async def send(self, frame_type: str, payload: dict) -> None:
        """Send one frame that has no answer of its own (a microphone chunk)."""
        try:
            await self.client.ws.send(json.dumps(envelope(frame_type, payload)))
        except ConnectionClosed as exc:
            raise BenchError(f"{self.target.name}: connection closed during {frame_type}: "
                             f"{exc}") from None

    async def exchange(self, frame_type: str, payload: dict,
                       answered: Callable[[dict, dict], bool], *, label: str | None = None,
                       on_frame: Callable[[dict, float], None] | None = None,
                       timeout: float = ANSWER_TIMEOUT,
                       max_frames: int = MAX_FRAMES_PER_ANSWER,
                       tolerated: frozenset[str] = frozenset()) -> list[dict]:
        """Send one frame and read up to its answer; the frames read, answer last.

        ``label`` names the exchange for comparable bytes: the product's
        answer sizes are recorded under it, and the baseline is asked to
        answer with those sizes. ``on_frame(frame, received_at)`` sees each
        frame as it arrives (the clock read right after the socket gave it).
        An error event stops the run, unless its code is ``tolerated``: then
        it is one more frame read on the way to the answer.
        """
        if label is not None and self.target.is_baseline:
            payload = {**payload, REPLY_FIELD: self.log.reply_sizes(label)}
        frames = await self._send_and_read(envelope(frame_type, payload), frame_type, answered,
                                           label, on_frame, timeout, max_frames, tolerated)
        if self.target.check_frames and self.log.keep_frames:
            self.log.frames.extend((self.phase, frame) for frame in frames)
        return frames

    async def _send_and_read(self, sent: dict, frame_type: str,
                             answered: Callable[[dict, dict], bool], label: str | None,
                             on_frame: Callable[[dict, float], None] | None,
                             timeout: float, max_frames: int,
                             tolerated: frozenset[str]) -> list[dict]:
        ws = self.client.ws
        frames: list[dict] = []
        sizes: list[int] = []
        try:
            async with asyncio.timeout(timeout):
                await ws.send(json.dumps(sent))
                for _ in range(max_frames):
                    raw = await ws.recv()
                    if on_frame is not None:
                        received_at = clock()
                    frame = _envelope_or_raise(self.target, raw)
                    sizes.append(len(raw.encode()) if isinstance(raw, str) else len(raw))
                    frames.append(frame)
                    if on_frame is not None:
                        on_frame(frame, received_at)
                    if answered(frame, sent):
                        break
                    _raise_on_error(self.target, frame, tolerated)
                else:
                    raise BenchError(f"{self.target.name}: no answer to {frame_type} within "
                                     f"{max_frames} frames")
        except TimeoutError:
            seen = ", ".join(str(f.get("type")) for f in frames) or "nothing"
            raise BenchError(f"{self.target.name}: no answer to {frame_type} within "
                             f"{timeout}s (saw {seen})") from None
        except ConnectionClosed as exc:
            raise BenchError(f"{self.target.name}: connection closed during {frame_type}: "
                             f"{exc}") from None
        if label is not None and not self.target.is_baseline:
            self.log.record_shape(label, sizes)
        return frames


def _envelope_or_raise(target: Target, raw: str | bytes) -> dict:
    try:
        frame = json.loads(raw)
    except ValueError:
        raise BenchError(f"{target.name} sent a frame that is not json: {raw[:200]!r}") from None
    if not isinstance(frame, dict) or not isinstance(frame.get("payload"), dict):
        raise BenchError(f"{target.name} sent a frame without a payload object: {raw[:200]!r}")
    return frame


def error_code(frame: dict) -> str | None:
    """The code of an error event (None for any other frame)."""
    if frame.get("type") == "SYSTEM_EVENT" and frame["payload"].get("kind") == "error":
        return str((frame["payload"].get("data") or {}).get("code", "no code"))
    return None


def _raise_on_error(target: Target, frame: dict,
                    tolerated: frozenset[str] = frozenset()) -> None:
    code = error_code(frame)
    if code is not None and code not in tolerated:
        payload = frame["payload"]
        if code == "turn_in_progress":
            raise TurnInProgress(f"{target.name}: {payload.get('message')}")
        raise BenchError(f"{target.name} answered an error: {payload.get('message')} ({code})")


def context_payload(index: int) -> dict:
    """A full snapshot whose context differs each time and whose route
    changes every ROUTE_EVERY updates, as a page a user works in."""
    return {
        "url": f"/bench/{index // ROUTE_EVERY}",
        "title": "Benchmark page",
        "activeTools": [BENCH_TOOL],
        "context": {"page": "bench", "index": index, "price": 149.99},
    }


# --- the phases ------------------------------------------------------------------

BeforeSample = Callable[[], Awaitable[None]]


async def _nothing() -> None:
    return None



async def handshakes(targets: Sequence[Target], api_key: str, *, count: int,
                     warmup: int, before_baseline: BeforeSample = _nothing) -> dict[str, list[float]]:
    """Seconds from opening the socket to a valid HANDSHAKE_ACK, one new
    connection per sample (closed before the next one opens)."""
    samples: dict[str, list[float]] = {target.name: [] for target in targets}
    for index in range(warmup + count):
        for target in alternating(targets, index):
            if target.is_baseline:
                await before_baseline()
            client = AitpClient(target.url, api_key=api_key)
            try:
                started = clock()
                await client.connect(timeout=ANSWER_TIMEOUT)
                elapsed = clock() - started
            except (AitpError, TimeoutError, OSError) as exc:
                raise BenchError(f"{target.name}: handshake failed: {exc}") from None
            finally:
                await client.close()
            if index >= warmup:
                samples[target.name].append(elapsed)
    return samples


async def context_round_trips(targets: Sequence[Target], api_key: str, log: Observations, *,
                              count: int, warmup: int,
                              before_baseline: BeforeSample = _nothing) -> dict[str, list[float]]:
    """Seconds from sending CONTEXT_UPDATE to tools_effective (baseline: the echo)
    on a session that stays open."""
    answered = echo_or(is_tools_effective)
    samples: dict[str, list[float]] = {target.name: [] for target in targets}
    peers = await _open_all(targets, api_key, log, "context round trip")
    try:
        for index in range(warmup + count):
            for peer in alternating(peers, index):
                if peer.target.is_baseline:
                    await before_baseline()
                started = clock()
                await peer.exchange("CONTEXT_UPDATE", context_payload(index), answered,
                                    label="context")
                elapsed = clock() - started
                if index >= warmup:
                    samples[peer.target.name].append(elapsed)
    finally:
        await _close_all(peers)
    return samples


async def tool_turns(targets: Sequence[Target], api_key: str, log: Observations, *,
                     count: int, warmup: int,
                     before_baseline: BeforeSample = _nothing) -> dict[str, list[float]]:
    """Seconds from USER_INPUT "/tool bench_echo {...}" to the final
    AGENT_RESPONSE, answering the TOOL_CALL on the way. The baseline does the
    same two exchanges as plain echoes."""
    samples: dict[str, list[float]] = {target.name: [] for target in targets}
    peers = await _open_all(targets, api_key, log, "tool turn")
    try:
        for peer in peers:
            await peer.exchange("CONTEXT_UPDATE", context_payload(0), echo_or(is_tools_effective),
                                label="context")
        for index in range(warmup + count):
            for peer in alternating(peers, index):
                if peer.target.is_baseline:
                    await before_baseline()
                elapsed = await one_turn(peer, index, log)
                if index >= warmup:
                    samples[peer.target.name].append(elapsed)
    finally:
        await _close_all(peers)
    return samples


async def one_turn(peer: Peer, index: int, log: Observations, *,
                   timeout: float = ANSWER_TIMEOUT) -> float:
    """One whole turn: USER_INPUT (retried while refused, on the same clock)
    to the TOOL_CALL, then TOOL_RESULT to the final AGENT_RESPONSE; the
    baseline: the same two exchanges, answered with the product's bytes.
    Seconds from the first USER_INPUT try to the last frame."""
    started, frames = await _start_turn(peer, index, log, timeout=timeout)
    call_id = frames[-1]["payload"].get("callId", "echo")
    frames = await peer.exchange(
        "TOOL_RESULT",
        {"callId": call_id, "status": "success", "result": {"n": index}},
        echo_or(is_turn_done), label="turn.result", timeout=timeout,
    )
    elapsed = clock() - started
    if peer.target.check_frames:
        _require_tool_ran(peer.target, frames[-1])
    return elapsed


async def _start_turn(peer: Peer, index: int, log: Observations, *,
                      timeout: float = ANSWER_TIMEOUT) -> tuple[float, list[dict]]:
    """Send the turn's USER_INPUT until accepted; the time of the FIRST try
    and the frames up to the TOOL_CALL (the baseline: the echo).

    done:true ends the turn for the page (protocol.md §5), which may send its
    next message at once, as this loop does. A server that still refuses it
    with turn_in_progress has a race: the refusal is counted (the report
    notes it) and the message retried; the sample's clock keeps running from
    the first try, because the page waits all that time for its answer.
    """
    command = f'/tool {BENCH_TOOL["name"]} {{"n": {index}}}'
    if peer.target.check_frames:
        log.turns += 1
    started = clock()
    for attempt in range(MAX_TURN_RETRIES + 1):
        try:
            frames = await peer.exchange(
                "USER_INPUT", {"modality": "text", "content": command}, echo_or(is_tool_call),
                label="turn.input", timeout=timeout)
        except TurnInProgress:
            log.refusals += 1
            if attempt == 0:
                log.turns_refused += 1
            await asyncio.sleep(TURN_RETRY_PAUSE)
            continue
        return started, frames
    raise BenchError(f"{peer.target.name}: the previous turn did not end after "
                     f"{MAX_TURN_RETRIES} tries")


# The microphone of the voice line (protocol.md §5a): 16 kHz 16-bit mono PCM.
MIC_MIME = "audio/pcm;rate=16000"


# What the product answers an utterance in which its engine heard no words:
# the turn ends (turn_complete, done:true) and the session goes on.
NO_SPEECH = "no_speech"


@dataclass(frozen=True)
class VoiceTurn:
    """Seconds from sending VOICE_INPUT_END to reading the transcript of what
    was heard, and to reading the first AUDIO_STREAM frame of the answer;
    both None when the product answered that it heard no words."""

    heard: float | None
    first_audio: float | None


async def one_voice_turn(peer: Peer, chunks: Sequence[str], *,
                         timeout: float = ANSWER_TIMEOUT) -> VoiceTurn:
    """One spoken turn: the utterance as AUDIO_STREAM chunks (base64 PCM),
    VOICE_INPUT_END, then every frame up to the turn's done:true. Its
    ``first_audio`` is how long the user waits, once they stop speaking, to
    hear the answer (transcription, the turn, the first sentence's
    synthesis); ``heard`` the transcription's share of it. A turn answered
    ``no_speech`` is read to its end and returned without times."""
    for chunk in chunks:
        await peer.send("AUDIO_STREAM", {"data": chunk, "mimeType": MIC_MIME})
    seen: dict[str, float] = {}

    def on_frame(frame: dict, received_at: float) -> None:
        if is_agent_audio(frame):
            seen.setdefault("audio", received_at)
        elif is_transcript(frame, "user"):
            seen.setdefault("heard", received_at)

    started = clock()
    frames = await peer.exchange("VOICE_INPUT_END", {"reason": "user_stop"},
                                 lambda frame, _sent: is_turn_done(frame), on_frame=on_frame,
                                 timeout=timeout, max_frames=MAX_FRAMES_PER_VOICE_TURN,
                                 tolerated=frozenset({NO_SPEECH}))
    if any(error_code(frame) == NO_SPEECH for frame in frames):
        return VoiceTurn(heard=None, first_audio=None)
    _require_spoken(peer.target, frames)
    return VoiceTurn(heard=seen["heard"] - started, first_audio=seen["audio"] - started)


def _require_spoken(target: Target, frames: Sequence[dict]) -> None:
    """A voice turn that was not heard, or not spoken back, measured something else."""
    if not any(is_transcript(frame, "user") for frame in frames):
        raise BenchError(f"{target.name}: the voice turn ended without a transcript of the "
                         "utterance")
    spoken = [number for number, frame in enumerate(frames) if is_agent_audio(frame)]
    if not spoken:
        raise BenchError(f"{target.name}: the voice turn ended without the agent's voice")
    if not any(is_voice_state(frame, "turn_complete") for frame in frames[spoken[-1]:]):
        raise BenchError(f"{target.name}: the agent's voice did not end with turn_complete")


def _require_tool_ran(target: Target, final: dict) -> None:
    """A turn that did not run the tool measured something else."""
    text = final["payload"].get("chunk", "")
    if not text.startswith(f"{BENCH_TOOL['name']} succeeded"):
        raise BenchError(f"{target.name}: the turn did not run the tool: {text[:200]!r}")


@dataclass(frozen=True)
class Throughput:
    frames: int
    seconds: float
    latencies: list[float]

    @property
    def frames_per_second(self) -> float:
        return self.frames / self.seconds if self.seconds > 0 else 0.0


async def concurrent_sessions(target: Target, api_key: str, log: Observations, *, sessions: int,
                              updates: int) -> Throughput:
    """``sessions`` sessions at once, each sending ``updates`` CONTEXT_UPDATEs
    one after the other. Counts frames both ways (an update and its answer)
    from the moment every session is open to the last answer."""
    answered = echo_or(is_tools_effective)
    peers = await _open_all([target] * sessions, api_key, log, "concurrency")
    latencies: list[float] = []

    async def one_session(peer: Peer, offset: int) -> None:
        for index in range(updates):
            started = clock()
            await peer.exchange("CONTEXT_UPDATE", context_payload(offset + index), answered,
                                label="context")
            latencies.append(clock() - started)

    try:
        started = clock()
        async with asyncio.TaskGroup() as group:
            for number, peer in enumerate(peers):
                group.create_task(one_session(peer, number * updates))
        seconds = clock() - started
    except* BenchError as errors:
        raise errors.exceptions[0] from None
    finally:
        await _close_all(peers)
    return Throughput(frames=2 * sessions * updates, seconds=seconds, latencies=latencies)


async def _open_all(targets: Sequence[Target], api_key: str, log: Observations,
                    phase: str) -> list[Peer]:
    results = await asyncio.gather(
        *(Peer.open(target, api_key, log, phase) for target in targets), return_exceptions=True
    )
    peers = [result for result in results if isinstance(result, Peer)]
    failures = [result for result in results if isinstance(result, BaseException)]
    if failures:
        await _close_all(peers)
        raise failures[0]
    return peers


async def _close_all(peers: Sequence[Peer]) -> None:
    await asyncio.gather(*(peer.close() for peer in peers))
