"""The measurement code cannot flatter the product (pure: fakes, no servers,
no timing assertions).

- a refused turn is counted and its time stays in the turn's sample;
- the product is drained (rows written and closed, process quiet) before
  every baseline run;
- both sides move comparable bytes: the baseline is asked for, and answers
  with, frames of the sizes the product sent.
"""
from __future__ import annotations

import asyncio
import gc
import json
from pathlib import Path

import pytest

from bench import lines, measure
from bench.baseline import REPLY_FIELD, padded_frame, reply_frames
from bench.drain import Drainer, NotDrained, RunRows
from bench.lines import Sample, Side
from bench.measure import Observations, Target

PRODUCT = Target("product", "ws://product", check_frames=True)
BASELINE = Target("baseline", "ws://baseline", check_frames=False)


class FakeClock:
    """Time moves only when the fake server says it does."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class FakeSocket:
    """A scripted server: each sent frame gets the answers ``respond`` returns;
    each answer may advance the fake clock first."""

    def __init__(self, respond, clock: FakeClock) -> None:
        self.respond = respond
        self.clock = clock
        self.sent: list[dict] = []
        self.received: list[str] = []
        self.pending: list[tuple[float, str]] = []

    async def send(self, text: str) -> None:
        frame = json.loads(text)
        self.sent.append(frame)
        self.pending.extend(self.respond(frame))

    async def recv(self) -> str:
        advance, text = self.pending.pop(0)
        self.clock.now += advance
        self.received.append(text)
        return text


class FakeClient:
    def __init__(self, ws: FakeSocket) -> None:
        self.ws = ws

    async def close(self) -> None:
        return None


def peer(target: Target, ws: FakeSocket, log: Observations) -> measure.Peer:
    return measure.Peer(target, FakeClient(ws), log, "test")


def refusal(frame: dict) -> str:
    return json.dumps({"id": "e", "type": "SYSTEM_EVENT", "payload": {
        "kind": "error", "message": "a turn is in progress",
        "data": {"code": "turn_in_progress"}}})


def product_turn_server(refusals: int):
    """Refuses the first ``refusals`` USER_INPUTs (each 1 s later), then runs
    the turn: TOOL_CALL after 2 s, the final answer 3 s after the result."""
    left = {"refusals": refusals}

    def respond(frame: dict) -> list[tuple[float, str]]:
        if frame["type"] == "USER_INPUT":
            if left["refusals"]:
                left["refusals"] -= 1
                return [(1.0, refusal(frame))]
            return [(2.0, json.dumps({"id": "c", "type": "TOOL_CALL", "payload": {
                "callId": "call_1", "name": "bench_echo", "args": {"n": 0}}}))]
        return [(3.0, json.dumps({"id": "d", "type": "AGENT_RESPONSE", "payload": {
            "chunk": "bench_echo succeeded: {}", "done": True}}))]

    return respond


@pytest.fixture
def clock(monkeypatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr(measure, "clock", fake)
    monkeypatch.setattr(measure, "TURN_RETRY_PAUSE", 0)
    return fake


async def test_a_refused_turn_is_counted_and_its_time_stays_in_the_sample(clock):
    log = Observations(keep_frames=False)
    page = peer(PRODUCT, FakeSocket(product_turn_server(refusals=2), clock), log)

    elapsed = await measure.one_turn(page, 0, log)

    # Two refusals of 1 s each, then 2 s to the TOOL_CALL and 3 s to done:
    # the clock started at the first try and never restarted.
    assert elapsed == pytest.approx(2 * 1.0 + 2.0 + 3.0)
    assert log.turns == 1 and log.turns_refused == 1 and log.refusals == 2
    assert "2 refusals" in log.notes()[0]


async def test_a_turn_that_is_never_refused_is_timed_from_its_only_try(clock):
    log = Observations(keep_frames=False)
    page = peer(PRODUCT, FakeSocket(product_turn_server(refusals=0), clock), log)

    elapsed = await measure.one_turn(page, 0, log)

    assert elapsed == pytest.approx(5.0)
    assert log.refusals == 0 and log.notes() == []


async def test_the_turns_line_reports_the_refusals_of_its_own_run(clock):
    log = Observations(keep_frames=False)
    sockets = [FakeSocket(product_turn_server(refusals=1), clock) for _ in range(3)]
    pages = iter([peer(PRODUCT, ws, log) for ws in sockets])

    async def open_pages(*_args, **_kwargs):
        return [next(pages) for _ in range(3)]

    original = lines.open_pages
    lines.open_pages = open_pages
    try:
        sample = await lines.turns(Side(PRODUCT, [1]), "pk", log, sessions=3, per_session=1)
    finally:
        lines.open_pages = original

    assert sample.count == 3 and sample.refusals == 3
    assert all(latency >= 1.0 for latency in sample.latencies)


# --- comparable bytes ------------------------------------------------------------


def echo_server(frame: dict) -> list[tuple[float, str]]:
    return [(0.0, reply) for reply in reply_frames(json.dumps(frame))]


async def test_the_baseline_is_asked_for_the_byte_sizes_the_product_answered_with(clock):
    log = Observations(keep_frames=False)
    product_frames = [
        json.dumps({"id": "msg_" + "a" * 36, "type": "SYSTEM_EVENT", "timestamp": 1,
                    "payload": {"kind": "state", "message": "thinking…"}}),
        json.dumps({"id": "msg_" + "b" * 36, "type": "TOOL_CALL", "timestamp": 1,
                    "payload": {"callId": "c" * 40, "name": "bench_echo", "args": {"n": 1}}}),
    ]
    product = peer(PRODUCT, FakeSocket(lambda frame: [(0.0, text) for text in product_frames],
                                       clock), log)
    baseline_ws = FakeSocket(echo_server, clock)
    baseline = peer(BASELINE, baseline_ws, log)
    answered = measure.echo_or(measure.is_tool_call)

    await product.exchange("USER_INPUT", {"content": "hi"}, answered, label="turn.input")
    received = []
    await baseline.exchange("USER_INPUT", {"content": "hi"}, answered, label="turn.input",
                            on_frame=lambda frame, _at: received.append(frame))
    sent_id = json.loads(json.dumps(baseline_ws.sent[0]))["id"]

    sizes = [len(text.encode()) for text in product_frames]
    assert log.shape["turn.input"] == sizes
    assert baseline_ws.sent[0]["payload"][REPLY_FIELD] == sizes
    assert [len(text.encode()) for text in baseline_ws.received] == sizes
    assert received[-1]["id"] == sent_id


async def test_the_baseline_cannot_run_before_the_product_gave_it_a_shape(clock):
    log = Observations(keep_frames=False)
    baseline = peer(BASELINE, FakeSocket(echo_server, clock), log)

    with pytest.raises(measure.BenchError, match="before the product"):
        await baseline.exchange("USER_INPUT", {"content": "hi"},
                                measure.echo_or(measure.is_tool_call), label="turn.input")


def test_the_baseline_answers_each_requested_size_exactly_and_ends_with_the_sent_id():
    sent = json.dumps({"id": "msg_1", "type": "TOOL_RESULT",
                       "payload": {"callId": "c", REPLY_FIELD: [80, 300, 1200]}})

    replies = reply_frames(sent)

    assert [len(reply.encode()) for reply in replies] == [80, 300, 1200]
    assert [json.loads(reply)["id"] for reply in replies] == ["msg_1.0", "msg_1.1", "msg_1"]


def test_without_a_requested_shape_the_baseline_echoes_the_frame_unchanged():
    sent = json.dumps({"id": "msg_1", "type": "CONTEXT_UPDATE", "payload": {"url": "/"}})

    assert reply_frames(sent) == [sent]
    assert reply_frames("not json") == ["not json"]


def test_a_padded_frame_too_small_for_its_envelope_is_the_smallest_frame():
    frame = padded_frame("msg_1", 5)

    assert json.loads(frame)["payload"]["pad"] == ""


# --- draining ---------------------------------------------------------------------


class Recorder:
    def __init__(self) -> None:
        self.events: list[str] = []


class RecordingDrainer:
    def __init__(self, recorder: Recorder) -> None:
        self.recorder = recorder

    async def drain(self, pids: list[int], *, open_sessions: int = 0) -> None:
        self.recorder.events.append(f"drain {pids}")


@pytest.mark.parametrize("repeats", [1, 2, 3])
async def test_the_product_is_drained_before_every_baseline_run(repeats):
    recorder = Recorder()
    product, baseline = Side(PRODUCT, [11]), Side(BASELINE, [22])

    async def run_one(side: Side) -> Sample:
        recorder.events.append(f"run {side.target.name}")
        return Sample(count=1, seconds=1.0, latencies=[1.0])

    await lines.paired(product, baseline, repeats=repeats, run_one=run_one,
                       drainer=RecordingDrainer(recorder))

    events = recorder.events
    baseline_runs = [number for number, event in enumerate(events) if event == "run baseline"]
    assert len(baseline_runs) == repeats
    for number in baseline_runs:
        assert events[number - 1] == "drain [11]"
    # The product goes first: the baseline copies its byte shape.
    assert events[:2] == ["drain [22]", "run product"]
    # Its last run is drained too, before whatever the run measures next.
    assert events[-1] == "drain [11]"


class FakeProbes:
    """Rows that close after a few polls, a process busy for a few windows."""

    def __init__(self, open_polls: int, busy_windows: int) -> None:
        self.open_polls = open_polls
        self.busy_windows = busy_windows
        self.cpu = 0.0
        self.now = 0.0
        self.polls = 0

    async def rows(self) -> RunRows:
        self.polls += 1
        still_open = self.polls <= self.open_polls
        return RunRows(open_sessions=3 if still_open else 0,
                       unfinished_calls=1 if still_open else 0)

    def cpu_seconds(self, pid: int) -> float:
        if self.busy_windows > 0:
            self.busy_windows -= 1
            self.cpu += 0.05
        return self.cpu

    async def sleep(self, seconds: float) -> None:
        self.now += seconds

    def clock(self) -> float:
        return self.now


async def test_the_drain_waits_for_closed_rows_and_a_quiet_process():
    probes = FakeProbes(open_polls=4, busy_windows=3)
    drainer = Drainer(rows=probes.rows, cpu_seconds=probes.cpu_seconds, sleep=probes.sleep,
                      clock=probes.clock)

    await drainer.drain([7])

    assert probes.polls == 5  # four polls saw open rows, the fifth none
    assert probes.busy_windows == 0  # every busy window was waited out
    assert drainer.drains == 1


async def test_after_a_drain_what_the_client_holds_is_frozen_out_of_its_collections():
    probes = FakeProbes(open_polls=0, busy_windows=0)
    drainer = Drainer(rows=probes.rows, cpu_seconds=probes.cpu_seconds, sleep=probes.sleep,
                      clock=probes.clock)
    kept_frames = [{"frame": number} for number in range(1000)]
    gc.unfreeze()
    try:
        await drainer.drain([7])
        assert gc.get_freeze_count() >= len(kept_frames)
    finally:
        gc.unfreeze()


async def test_the_drain_allows_the_sessions_a_phase_keeps_open_but_not_unfinished_calls():
    class Rows:
        calls = [2, 1, 0]

        async def __call__(self) -> RunRows:
            return RunRows(open_sessions=5, unfinished_calls=self.calls.pop(0))

    rows = Rows()
    probes = FakeProbes(open_polls=0, busy_windows=0)
    drainer = Drainer(rows=rows, cpu_seconds=probes.cpu_seconds, sleep=probes.sleep,
                      clock=probes.clock)

    await drainer.drain([7], open_sessions=5)

    assert rows.calls == []


async def test_a_product_that_never_drains_fails_the_run_instead_of_being_timed():
    probes = FakeProbes(open_polls=10**9, busy_windows=0)
    drainer = Drainer(rows=probes.rows, cpu_seconds=probes.cpu_seconds, sleep=probes.sleep,
                      clock=probes.clock, timeout=1.0)

    with pytest.raises(NotDrained, match="still open"):
        await drainer.drain([7])


def test_pooled_repeats_add_counts_and_seconds_and_keep_every_latency():
    pooled = lines.pooled([Sample(10, 2.0, [0.1] * 10, refusals=1),
                           Sample(30, 2.0, [0.2] * 30, refusals=2)])

    assert pooled.rate == pytest.approx(10.0)
    assert len(pooled.latencies) == 40 and pooled.refusals == 3


def test_the_lines_read_the_one_sample_clock_the_fakes_replace():
    # Guard: the lines read the sample clock through bench.measure, so the
    # fakes above replace it everywhere.
    source = Path(lines.__file__).read_text()
    assert "time.perf_counter" not in source
    assert asyncio.iscoroutinefunction(lines.paired)


async def test_memory_per_idle_session_is_the_rss_growth_once_settled_over_the_sessions(
        monkeypatch, clock):
    events: list[str] = []
    readings = iter([100 * 2**20, 160 * 2**20])

    class Page:
        async def close(self) -> None:
            events.append("close")

    async def open_pages(_target, _key, _log, count, phase, **_kwargs):
        events.append(f"open {count} {phase}")
        return [Page() for _ in range(count)]

    class Drain:
        async def drain(self, pids, *, open_sessions=0, **_kwargs):
            events.append(f"drain {open_sessions}")

    def rss(pid: int) -> int:
        events.append("rss")
        return next(readings)

    monkeypatch.setattr(lines, "open_pages", open_pages)

    found = await lines.idle_memory(Side(PRODUCT, [5]), "pk", Observations(), sessions=1000,
                                    warmup=50, drainer=Drain(), rss=rss)

    assert found["bytes_per_session"] == pytest.approx(60 * 2**20 / 1000)
    # Warm-up sessions come and go before the first reading; the second is
    # read with every session open and the process settled.
    assert events[0] == "open 50 idle warmup" and events[1:51] == ["close"] * 50
    assert events.index("rss") > events.index("drain 0")
    second = len(events) - 1 - events[::-1].index("rss")
    assert events[second - 1] == "drain 1000"
    assert events[second - 2] == "open 1000 idle sessions"
