"""The run: prepare a database, start the servers, measure, report, stop.

    python -m bench [--quick] [--backend embedded|postgres|both] [--json out.json] [--strict]

Exit codes: 0 when the run completed (whatever the verdicts, unless
--strict), 1 with --strict when a verdict is "over", 2 when the run could not
measure (a server did not start, an answer never came, PostgreSQL or nginx
missing), 130 on Ctrl-C or SIGTERM. Everything started here (servers, the
fake model, nginx, the PostgreSQL database) is stopped or removed on every
one of those paths.

``--backend both`` runs each backend in a child process of its own (Django
reads its database settings once per process) and prints both tables.
"""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import DatabaseError

from bench import environment, first_text, lines, measure, proxy, report, servers
from bench.drain import Drainer, NotDrained, run_rows
from bench.lines import Side
from bench.measure import BenchError, Observations, Target, Throughput
from bench.stats import latency_summary

logger = logging.getLogger(__name__)

# Room above the sessions the run holds at once: a closed session's row is
# released by its teardown, which may still be running when the next opens.
SESSION_CAP_HEADROOM = 64
# No phase of even the full run needs this long; a phase that does has hung.
PHASE_TIMEOUT = 1800.0
# The fake model's pace between two text deltas (the streaming line).
STREAM_EVENT_DELAY = 0.02
# The voice line's product: the offline model and the offline speech engines.
VOICE_ENV = {"OWLLAYER_VOICE": "1", "OWLLAYER_STT": "pocketsphinx", "OWLLAYER_TTS": "espeak"}


@dataclass(frozen=True)
class BenchConfig:
    handshakes: int
    round_trips: int
    turns: int
    sessions: int
    updates: int
    repeats: int
    warmup: int
    # the lines of many sessions (bench.lines)
    turn_sessions: int
    turn_sessions_large: int
    turns_per_session: int
    opens: int
    open_concurrency: int
    idle_sessions: int
    stream_sessions: int
    stream_turns: int
    stream_deltas: int
    line_repeats: int
    # the voice line: concurrency steps 1, 2, 4, ... up to voice_sessions, each
    # with at least voice_samples turns
    voice_sessions: int
    voice_samples: int


FULL = BenchConfig(handshakes=200, round_trips=500, turns=50, sessions=32, updates=50, repeats=3,
                   warmup=10, turn_sessions=50, turn_sessions_large=200, turns_per_session=5,
                   opens=1000, open_concurrency=50, idle_sessions=5000, stream_sessions=50,
                   stream_turns=4, stream_deltas=20, line_repeats=2, voice_sessions=16,
                   voice_samples=16)
QUICK = BenchConfig(handshakes=40, round_trips=100, turns=10, sessions=8, updates=20, repeats=1,
                    warmup=3, turn_sessions=50, turn_sessions_large=200, turns_per_session=2,
                    opens=150, open_concurrency=50, idle_sessions=300, stream_sessions=50,
                    stream_turns=2, stream_deltas=20, line_repeats=1, voice_sessions=8,
                    voice_samples=8)


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, BenchConfig]:
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description="Latency, throughput and memory of OwlLayer against a bare Channels "
                    "baseline, on the embedded default and on PostgreSQL + Redis.",
    )
    parser.add_argument("--quick", action="store_true", help="a smaller run (a minute or two)")
    parser.add_argument("--backend", choices=[*environment.BACKENDS, "both"],
                        default="embedded",
                        help="embedded: throwaway SQLite + in-memory layer (default); "
                             "postgres: a scratch PostgreSQL database + Redis; both")
    parser.add_argument("--postgres", default=environment.DEFAULT_POSTGRES, metavar="URL",
                        help="the PostgreSQL server where the run creates and drops its "
                             "database (default %(default)s)")
    parser.add_argument("--redis", default=environment.DEFAULT_REDIS, metavar="URL",
                        help="the Redis of the postgres backend (default %(default)s)")
    parser.add_argument("--no-proxy", action="store_true",
                        help="skip the two-processes-behind-nginx line (postgres backend)")
    parser.add_argument("--only", metavar="PHASES", type=_phases, default=None,
                        help="run only these phases, comma separated, of: "
                             + ", ".join(PHASES) + " (default: all; voice on the embedded "
                             "backend only)")
    parser.add_argument("--stream-default", action=argparse.BooleanOptionalAction, default=True,
                        help="also measure streaming at the default OWLLAYER_STREAM_INTERVAL "
                             "(a third product process; default: yes)")
    parser.add_argument("--json", metavar="PATH", type=Path, help="also write the report here")
    parser.add_argument("--strict", action="store_true",
                        help="exit 1 when any verdict is 'over'")
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress details")
    sizes = parser.add_argument_group("sizes (override the preset)")
    for field in dataclasses.fields(BenchConfig):
        sizes.add_argument(f"--{field.name.replace('_', '-')}", type=_positive, metavar="N",
                           dest=field.name, default=None)
    args = parser.parse_args(argv)
    if args.only is None:
        args.only = default_phases(args.backend)
    preset = QUICK if args.quick else FULL
    overrides = {
        field.name: getattr(args, field.name)
        for field in dataclasses.fields(BenchConfig)
        if getattr(args, field.name) is not None
    }
    return args, dataclasses.replace(preset, **overrides)


PHASES = ("idle", "samples", "opens", "turns", "observability", "streaming", "voice", "proxy")
# The voice line's time is mostly the speech engines' (the transcript alone is
# most of it: its raw heard_ms), not the database's: by default it runs on the
# embedded backend only, and on PostgreSQL when --only names it.
EMBEDDED_ONLY_PHASES = ("voice",)


def default_phases(backend: str) -> tuple[str, ...]:
    if backend == "postgres":
        return tuple(phase for phase in PHASES if phase not in EMBEDDED_ONLY_PHASES)
    return PHASES


def _phases(raw: str) -> tuple[str, ...]:
    names = tuple(name.strip() for name in raw.split(",") if name.strip())
    unknown = [name for name in names if name not in PHASES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown phase(s) {unknown}; choose from {PHASES}")
    return names


def _positive(raw: str) -> int:
    value = int(raw)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _progress(message: str) -> None:
    print(f"bench: {message}", file=sys.stderr, flush=True)


class Run:
    """One backend's run: its servers, key, drainer and observations."""

    def __init__(self, config: BenchConfig, server_set: servers.ServerSet, api_key: str,
                 drainer: Drainer, product: Side, baseline: Side, backend: str,
                 scratch: Path, proxy_line: bool, utterance: bytes = b"") -> None:
        self.config = config
        self.server_set = server_set
        self.api_key = api_key
        self.drainer = drainer
        self.product = product
        self.baseline = baseline
        self.backend = backend
        self.scratch = scratch
        self.proxy_line = proxy_line
        self.utterance = utterance
        self.log = Observations()
        self.measures: list[dict] = []

    async def drain_product(self, open_sessions: int = 0) -> None:
        await self.drainer.drain(self.product.pids, open_sessions=open_sessions)

    # --- the per-sample lines (bench.measure) ------------------------------------

    async def sample_lines(self) -> None:
        config, log, key = self.config, self.log, self.api_key
        product, baseline = self.product.target, self.baseline.target
        targets = [product, baseline]

        _progress(f"handshake latency: {config.handshakes} connections each")
        async with asyncio.timeout(PHASE_TIMEOUT):
            samples = await measure.handshakes(
                targets, key, count=config.handshakes, warmup=config.warmup,
                before_baseline=lambda: self.drain_product(0))
        self.measures.append(report.latency_measure(
            "handshake", "handshake", samples[product.name], samples[baseline.name]))

        _progress(f"context round trip: {config.round_trips} updates each")
        async with asyncio.timeout(PHASE_TIMEOUT):
            samples = await measure.context_round_trips(
                targets, key, log, count=config.round_trips, warmup=config.warmup,
                before_baseline=lambda: self.drain_product(1))
        self.measures.append(report.latency_measure(
            "context_round_trip", "context round trip", samples[product.name],
            samples[baseline.name]))

        _progress(f"turn with one tool call: {config.turns} turns each")
        async with asyncio.timeout(PHASE_TIMEOUT):
            samples = await measure.tool_turns(
                targets, key, log, count=config.turns, warmup=config.warmup,
                before_baseline=lambda: self.drain_product(1))
        self.measures.append(report.latency_measure(
            "tool_turn", "turn with one tool", samples[product.name], samples[baseline.name]))

        _progress(f"concurrency: {config.sessions} sessions x {config.updates} updates, "
                  f"best of {config.repeats}")
        best: dict[str, Throughput] = {}
        for repeat in range(config.repeats):
            for target in measure.alternating(targets, repeat + 1):
                if target.is_baseline:
                    await self.drain_product(0)
                async with asyncio.timeout(PHASE_TIMEOUT):
                    result = await measure.concurrent_sessions(
                        target, key, log, sessions=config.sessions, updates=config.updates)
                if target.name not in best or (
                    result.frames_per_second > best[target.name].frames_per_second
                ):
                    best[target.name] = result
        title = f"{config.sessions} sessions x {config.updates} updates"
        self.measures.append(report.throughput_measure(
            "concurrency", title, _throughput(best[product.name]),
            _throughput(best[baseline.name])))

    # --- the lines of many sessions (bench.lines) --------------------------------------

    async def idle_memory(self) -> None:
        config = self.config
        _progress(f"idle sessions: {config.idle_sessions} held open on each side")
        found = {}
        for side in (self.product, self.baseline):
            async with asyncio.timeout(PHASE_TIMEOUT):
                found[side.target.name] = await lines.idle_memory(
                    side, self.api_key, self.log, sessions=config.idle_sessions,
                    warmup=min(config.open_concurrency, config.idle_sessions),
                    drainer=self.drainer)
        product, baseline = found[self.product.target.name], found[self.baseline.target.name]
        for name, side in found.items():
            if side["refused"]:
                self.log.extra_notes.append(
                    f"idle sessions: {name} refused {side['refused']} of {side['asked']} opens "
                    f"and held {side['sessions']} (first: {side['first_refusal']}); memory is "
                    "per session held")
        self.measures.append(report.line_measure(
            "idle_memory", f"{config.idle_sessions:,} idle sessions",
            [("KiB/session", product["bytes_per_session"] / 1024,
              baseline["bytes_per_session"] / 1024),
             ("RSS MiB", product["rss_after"] / 2**20, baseline["rss_after"] / 2**20)],
            raw={"product": product, "baseline": baseline}))

    async def opens(self) -> None:
        config = self.config
        _progress(f"session opens: {config.opens} at a concurrency of {config.open_concurrency}")

        async def run_one(side: Side) -> lines.Sample:
            return await lines.opens(side, self.api_key, self.log, count=config.opens,
                                     concurrency=config.open_concurrency)

        async with asyncio.timeout(PHASE_TIMEOUT):
            pooled = await lines.paired(self.product, self.baseline,
                                        repeats=config.line_repeats, run_one=run_one,
                                        drainer=self.drainer)
        self.measures.append(rate_line(
            "opens", f"opens, concurrency {config.open_concurrency}", "opens/s",
            pooled[self.product.target.name], pooled[self.baseline.target.name]))

    async def turns(self, sessions: int, *, name: str = "turns", title: str | None = None,
                    product: Side | None = None, baseline: Side | None = None,
                    checks_of: str | None = None) -> dict:
        config = self.config
        product = product or self.product
        baseline = baseline or self.baseline
        title = title or f"turns, {sessions} sessions"
        _progress(f"{title}: {config.turns_per_session} turns each, {config.line_repeats} "
                  "repeat(s)")

        async def run_one(side: Side) -> lines.Sample:
            return await lines.turns(side, self.api_key, self.log, sessions=sessions,
                                     per_session=config.turns_per_session)

        async with asyncio.timeout(PHASE_TIMEOUT):
            pooled = await lines.paired(product, baseline, repeats=config.line_repeats,
                                        run_one=run_one, drainer=self.drainer)
        line = rate_line(name, title, "turns/s", pooled[product.target.name],
                         pooled[baseline.target.name], checks_of=checks_of)
        self.measures.append(line)
        return line

    async def observability(self) -> None:
        """The turns line at ``turn_sessions`` on the product (metrics on, the
        default) and on a product with traces exported, each against a
        product with metrics off: what keeping the figures and the spans costs."""
        started = {server.name: server for server in self.server_set.started}
        path = settings.OWLLAYER_WS_PATH

        def side(name: str) -> Side:
            return Side(Target(name, started[name].ws_url(path), check_frames=True),
                        [started[name].process.pid])

        plain, traced = side("metrics-off"), side("traced")
        try:
            for target in (plain, traced):
                await lines.warm_up(target.target, self.api_key, self.log)
            await self.turns(self.config.turn_sessions, name="metrics_cost",
                             title=f"metrics on / off, turns, {self.config.turn_sessions} sessions",
                             product=self.product, baseline=plain, checks_of="metrics_cost")
            await self.turns(self.config.turn_sessions, name="traces_cost",
                             title=f"traces on / off, turns, {self.config.turn_sessions} sessions",
                             product=traced, baseline=plain, checks_of="-")
        finally:
            self.server_set.stop(["metrics-off", "traced", "otlp-sink"])

    async def streaming(self) -> None:
        config = self.config
        started = {server.name: server for server in self.server_set.started}
        path = settings.OWLLAYER_WS_PATH
        variants = (("stream-0", "streaming, OWLLAYER_STREAM_INTERVAL=0", "streaming"),
                    ("stream-default", "streaming, default interval", None))
        variants = tuple(variant for variant in variants if variant[0] in started)
        sides = {name: Side(Target(name, started[name].ws_url(path), check_frames=True),
                            [started[name].process.pid]) for name, _title, _checks in variants}
        try:
            # One untimed streamed turn on each (their first turn loads the model
            # client); the size of a text delta frame, which the baseline echoes.
            sizes = await asyncio.gather(*(
                lines.delta_frame_size(side, self.api_key, self.log) for side in sides.values()))
            for (name, title, checks), size in zip(variants, sizes, strict=True):
                side = sides[name]
                _progress(f"{title}: {config.stream_sessions} sessions x "
                          f"{config.stream_turns} turns x {config.stream_deltas} deltas")
                await self.drainer.drain([pid for other in sides.values() for pid in other.pids])
                self.log.shape["stream.delta"] = [size]
                per_session = config.stream_turns * config.stream_deltas

                async def run_one(target_side: Side, stream_side: Side = side,
                                  per_session: int = per_session) -> lines.Sample:
                    if target_side is stream_side:
                        return await lines.streamed_deltas(
                            target_side, self.api_key, self.log,
                            sessions=config.stream_sessions, per_session=config.stream_turns)
                    return await lines.paced_echoes(
                        target_side, self.api_key, self.log, sessions=config.stream_sessions,
                        per_session=per_session, pause=STREAM_EVENT_DELAY)

                async with asyncio.timeout(PHASE_TIMEOUT):
                    pooled = await lines.paired(side, self.baseline,
                                                repeats=config.line_repeats, run_one=run_one,
                                                drainer=self.drainer)
                self.measures.append(latency_line(
                    "streaming" if checks else "streaming_default", title,
                    pooled[name], pooled[self.baseline.target.name], checks_of=checks))
            await self.first_text_added(sides["stream-0"], started["fake-llm"])
        finally:
            self.server_set.stop(["stream-0", "stream-default", "fake-llm"])

    async def first_text_added(self, side: Side, fake: servers.Server) -> None:
        """USER_INPUT -> the page's first text delta, against the same request
        sent straight to the fake Messages API: what the server adds, for one
        caller and for ``stream_sessions`` at once."""
        config = self.config
        rows: list[tuple[str, float, float | None]] = []
        raw = {}
        for sessions in (1, config.stream_sessions):
            _progress(f"time to first text: {sessions} at once x {config.stream_turns} turns")
            await self.drainer.drain(side.pids)
            async with asyncio.timeout(PHASE_TIMEOUT):
                product = await first_text.product_first_text(
                    side, self.api_key, self.log, sessions=sessions, per_session=config.stream_turns)
                direct = await first_text.direct_first_text(
                    f"http://{servers.HOST}:{fake.port}", sessions=sessions,
                    per_session=config.stream_turns, model=settings.OWLLAYER_MODEL)
            p, b = latency_summary(product.latencies), latency_summary(direct.latencies)
            rows += [(f"{sessions} at once: p50 ms", p["p50"], b["p50"]),
                     (f"{sessions} at once: added p50 ms", p["p50"] - b["p50"], None)]
            raw[str(sessions)] = {"product": _raw(product, p), "direct": _raw(direct, b)}
        self.measures.append(report.line_measure(
            "first_text_added", "time to first text, added by the server", rows, checks_of="-",
            raw=raw))

    async def voice(self) -> None:
        """Voice turns on the offline engines, one concurrency step after the
        other: VOICE_INPUT_END -> first AUDIO_STREAM frame, against the same
        time at one session, and where its p50 doubles."""
        config = self.config
        server = next(server for server in self.server_set.started if server.name == "voice")
        side = Side(Target("voice", server.ws_url(settings.OWLLAYER_WS_PATH), check_frames=True),
                    [server.process.pid])
        chunks = lines.microphone_chunks(self.utterance)
        jobs = settings.OWLLAYER_VOICE_JOBS
        try:
            # Untimed: the first handshake checks the engines, and each thread of
            # the speech pool loads its decoder on its first transcription.
            async with asyncio.timeout(PHASE_TIMEOUT):
                await lines.voice_turns(side, self.api_key, self.log, sessions=jobs,
                                        per_session=1, chunks=chunks, phase="voice warm-up",
                                        timeout=lines.WARMUP_TIMEOUT)
            steps = []
            for sessions in lines.concurrency_steps(config.voice_sessions):
                per_session = lines.voice_turns_per_session(config.voice_samples, sessions)
                _progress(f"voice turns: {sessions} sessions x {per_session} turns")
                await self.drainer.drain(side.pids)
                async with asyncio.timeout(PHASE_TIMEOUT):
                    sample = await lines.voice_turns(
                        side, self.api_key, self.log, sessions=sessions,
                        per_session=per_session, chunks=chunks, phase=f"voice x{sessions}")
                unheard = sample.extra["unheard"]
                if unheard:
                    self.log.extra_notes.append(
                        f"voice, {sessions} sessions: {unheard} of {unheard + sample.count} "
                        "turns were answered no_speech (the utterance was not heard) and "
                        "are not in the samples")
                steps.append((sessions, {
                    "turns_per_session": per_session, "count": sample.count,
                    "unheard": unheard, "seconds": sample.seconds,
                    "latency_ms": latency_summary(sample.latencies),
                    "heard_ms": latency_summary(sample.extra["heard"])}))
        finally:
            self.server_set.stop(["voice"])
        self.measures.append(report.voice_measure(
            "voice", "voice, end of speech -> first audio (vs 1 session)", steps,
            raw={"speech_jobs": jobs, "stt": "pocketsphinx", "tts": "espeak",
                 "utterance": lines.VOICE_UTTERANCE,
                 "utterance_seconds": len(self.utterance) / (2 * lines.MIC_RATE),
                 "chunks_per_turn": len(chunks)}))

    async def behind_proxy(self) -> None:
        """Turns at the large session count through nginx: one upstream, two
        upstreams, and the baseline behind the same nginx."""
        second = self.server_set.start({"product-2": servers.product_command})["product-2"]
        await lines.warm_up(Target("product-2", second.ws_url(settings.OWLLAYER_WS_PATH),
                                   check_frames=True), self.api_key, self.log)
        first_port = self.server_set_port("product")
        baseline_port = self.server_set_port("baseline")
        nginx, listen = proxy.start_nginx(
            self.scratch / "nginx",
            {"one": [first_port], "two": [first_port, second.port], "echo": [baseline_port]},
            products=["one", "two"])
        self.server_set.started.append(nginx)
        path = settings.OWLLAYER_WS_PATH
        url = f"ws://{servers.HOST}:{{port}}{path}"
        pids = [*self.product.pids, second.process.pid]
        sessions = self.config.turn_sessions_large
        try:
            via_echo = Side(Target("baseline via nginx", url.format(port=listen["echo"]),
                                   check_frames=False), self.baseline.pids)
            one = await self.turns(
                sessions, name="proxy_one", title=f"nginx, 1 process, {sessions} sessions",
                product=Side(Target("1 process via nginx", url.format(port=listen["one"]),
                                    check_frames=True), pids),
                baseline=via_echo, checks_of="-")
            two = await self.turns(
                sessions, name="proxy_two", title=f"nginx, 2 processes, {sessions} sessions",
                product=Side(Target("2 processes via nginx", url.format(port=listen["two"]),
                                    check_frames=True), pids),
                baseline=via_echo, checks_of="-")
            one_rate, two_rate = one["rows"][0]["product"], two["rows"][0]["product"]
            self.measures.append(report.line_measure(
                "proxy_scaling", "2 processes / 1 process (nginx)",
                [("turns/s", two_rate, one_rate)],
                raw={"one_process": one["raw"], "two_processes": two["raw"]}))
        finally:
            self.server_set.stop(["nginx", "product-2"])

    def server_set_port(self, name: str) -> int:
        return next(server.port for server in self.server_set.started if server.name == name)

    async def measure_all(self, phases: tuple[str, ...] = PHASES) -> None:
        """The phases in a fixed order: idle memory first, on servers that
        have not yet been loaded (a warm heap hides what sessions cost)."""
        config = self.config
        for side in (self.product, self.baseline):
            await lines.warm_up(side.target, self.api_key, self.log)
        if "idle" in phases:
            await self.idle_memory()
        if "samples" in phases:
            await self.sample_lines()
        if "opens" in phases:
            await self.opens()
        if "turns" in phases:
            await self.turns(config.turn_sessions)
            await self.turns(config.turn_sessions_large)
        if "observability" in phases:
            await self.observability()
        if "streaming" in phases:
            await self.streaming()
        if "voice" in phases:
            await self.voice()
        if self.proxy_line and "proxy" in phases:
            await self.behind_proxy()


def rate_line(name: str, title: str, unit: str, product: lines.Sample,
              baseline: lines.Sample, *, checks_of: str | None = None) -> dict:
    """Rate, p50 and p99 of one load on both sides, with the raw figures."""
    p, b = latency_summary(product.latencies), latency_summary(baseline.latencies)
    return report.line_measure(
        name, title,
        [(unit, product.rate, baseline.rate), ("p50 ms", p["p50"], b["p50"]),
         ("p99 ms", p["p99"], b["p99"])],
        checks_of=checks_of,
        raw={"product": _raw(product, p), "baseline": _raw(baseline, b)})


def latency_line(name: str, title: str, product: lines.Sample, baseline: lines.Sample, *,
                 checks_of: str | None) -> dict:
    p, b = latency_summary(product.latencies), latency_summary(baseline.latencies)
    return report.line_measure(
        name, title, [("p50 ms", p["p50"], b["p50"]), ("p99 ms", p["p99"], b["p99"])],
        checks_of=checks_of or "-",
        raw={"product": _raw(product, p), "baseline": _raw(baseline, b)})


def _raw(sample: lines.Sample, summary: dict) -> dict:
    return {"count": sample.count, "seconds": sample.seconds, "per_second": sample.rate,
            "refused_user_inputs": sample.refusals, "latency_ms": summary}


def otlp_sink_command(port: int) -> list[str]:
    return [sys.executable, "-m", "bench.otlp_sink", "--port", str(port)]


def fake_llm_command(config: BenchConfig) -> servers.CommandForPort:
    def command(port: int) -> list[str]:
        return [sys.executable, "-m", "bench.fake_llm", "--port", str(port),
                "--deltas", str(config.stream_deltas),
                "--event-delay", str(STREAM_EVENT_DELAY)]

    return command


def _throughput(result: Throughput) -> dict:
    return {
        "frames_per_s": result.frames_per_second,
        "frames": result.frames,
        "seconds": result.seconds,
        "update_latency_ms": latency_summary(result.latencies),
    }


def scratch_parent() -> str | None:
    """Where the throwaway database and the logs go: a memory filesystem when
    there is one. On a disk each SQLite commit waits for an fsync (tens of ms
    on a shared VM), and the run would measure the disk, not the server."""
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK):
        return str(shm)
    return None


def session_cap(config: BenchConfig) -> int:
    return max(config.idle_sessions, config.turn_sessions_large, config.turn_sessions,
               config.stream_sessions, config.sessions, config.open_concurrency,
               config.voice_sessions) \
        + SESSION_CAP_HEADROOM


def run(config: BenchConfig, *, backend: str = "embedded",
        postgres: str = environment.DEFAULT_POSTGRES, redis: str = environment.DEFAULT_REDIS,
        proxy_line: bool = True, phases: tuple[str, ...] = PHASES,
        stream_default: bool = True) -> dict:
    """Set up, measure and tear down one backend; its report."""
    started = time.perf_counter()
    servers.raise_open_files_limit()
    scratch = Path(tempfile.mkdtemp(prefix="owllayer-bench-", dir=scratch_parent()))
    server_set: servers.ServerSet | None = None
    run_env: environment.RunEnvironment | None = None
    try:
        # The voice line's microphone, made before anything starts: without
        # eSpeak NG the run stops here, not after the other lines.
        utterance = lines.spoken_utterance() if "voice" in phases else b""
        run_env = environment.prepare(scratch, backend, postgres=postgres, redis=redis)
        _progress(f"[{backend}] preparing the database ({run_env.describe_short()})")
        environment.setup_database()
        tenant, api_key = environment.create_key(max_sessions=session_cap(config))
        described = run_env.describe()
        described["open_files_limit"] = servers.open_files_limit()
        environment.close_connections()

        _progress(f"[{backend}] starting the product and the baseline (daphne on 127.0.0.1)")
        server_set = servers.ServerSet(os.environ, scratch)
        specs = {"product": servers.product_command, "baseline": servers.baseline_command}
        extra_env: dict[str, dict[str, str]] = {}
        if "streaming" in phases:
            # The streaming line's products talk to the stamping fake model;
            # all start side by side with the others (start-up is the slow part).
            fake = server_set.start({"fake-llm": fake_llm_command(config)})["fake-llm"]
            llm_env = {"OWLLAYER_LLM": "anthropic", "ANTHROPIC_API_KEY": "dummy",
                       "ANTHROPIC_BASE_URL": f"http://{servers.HOST}:{fake.port}"}
            specs["stream-0"] = servers.product_command
            if stream_default:
                specs["stream-default"] = servers.product_command
            extra_env = {"stream-0": {**llm_env, "OWLLAYER_STREAM_INTERVAL": "0"},
                         "stream-default": llm_env}
        if "observability" in phases:
            sink = server_set.start({"otlp-sink": otlp_sink_command})["otlp-sink"]
            specs["metrics-off"] = specs["traced"] = servers.product_command
            extra_env["metrics-off"] = {"OWLLAYER_METRICS": "false"}
            extra_env["traced"] = {"OWLLAYER_TRACES": "true", "OTEL_EXPORTER_OTLP_ENDPOINT":
                                   f"http://{servers.HOST}:{sink.port}"}
        if "voice" in phases:
            specs["voice"] = servers.product_command
            extra_env["voice"] = VOICE_ENV
        started_servers = server_set.start(specs, env=extra_env)
        path = settings.OWLLAYER_WS_PATH
        product_server, baseline_server = started_servers["product"], started_servers["baseline"]
        tenant_id = tenant.id

        async def rows():
            return await asyncio.to_thread(_rows_closing, tenant_id)

        the_run = Run(
            config, server_set, api_key, Drainer(rows=rows),
            Side(Target("product", product_server.ws_url(path), check_frames=True),
                 [product_server.process.pid]),
            Side(Target("baseline", baseline_server.ws_url(path), check_frames=False),
                 [baseline_server.process.pid]),
            backend, scratch, proxy_line=proxy_line and backend == "postgres",
            utterance=utterance)
        try:
            asyncio.run(the_run.measure_all(phases))
        except (BenchError, NotDrained, proxy.ProxyError):
            for server in server_set.started:
                if server.died:
                    _progress(f"the {server.name} server died; its log:\n{server.log_tail()}")
            raise
    finally:
        if server_set is not None:
            server_set.stop_all()
        environment.close_connections()
        if run_env is not None:
            environment.remove_backend(run_env)
        if os.environ.get("OWLLAYER_BENCH_KEEP_SCRATCH"):
            _progress(f"scratch kept: {scratch}")
        else:
            shutil.rmtree(scratch, ignore_errors=True)
    notes = the_run.log.notes()
    before = "a baseline sample" + (" or a voice step" if "voice" in phases else "")
    notes.append(f"the product was drained (rows closed, process quiet) "
                 f"{the_run.drainer.drains} times before {before}")
    return report.build_report(
        config=dataclasses.asdict(config),
        environment=described,
        measures=the_run.measures,
        wire_problems=the_run.log.problems(),
        notes=notes,
        seconds=time.perf_counter() - started,
    )


def _rows_closing(tenant_id: int):
    try:
        return run_rows(tenant_id)
    finally:
        environment.close_connections()


def _terminate(signum: int, frame) -> None:
    # SIGTERM takes the Ctrl-C path, so every `finally` stops what it started.
    raise KeyboardInterrupt


def run_each_backend(argv: list[str], args: argparse.Namespace) -> tuple[list[dict], int]:
    """``--backend both``: one child process per backend, in turn."""
    reports = []
    passthrough = _without_options(argv, {"--backend", "--json"}, {"--strict"})
    for backend in environment.BACKENDS:
        out = Path(tempfile.mkstemp(prefix=f"bench-{backend}-", suffix=".json")[1])
        child = subprocess.Popen(
            [sys.executable, "-m", "bench", *passthrough, "--backend", backend,
             "--json", str(out)],
            stdout=subprocess.PIPE, text=True)
        try:
            child.communicate()
        except KeyboardInterrupt:
            child.send_signal(signal.SIGTERM)
            child.wait()
            out.unlink(missing_ok=True)
            raise
        code = child.returncode
        if code != 0:
            out.unlink(missing_ok=True)
            return reports, code
        reports.append(json.loads(out.read_text()))
        out.unlink(missing_ok=True)
    return reports, 0


def _without_options(argv: list[str], with_value: set[str], flags: set[str]) -> list[str]:
    kept, skip = [], False
    for item in argv:
        if skip:
            skip = False
            continue
        name = item.split("=", 1)[0]
        if name in with_value:
            skip = "=" not in item
            continue
        if name in flags:
            continue
        kept.append(item)
    return kept


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args, config = parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    signal.signal(signal.SIGTERM, _terminate)
    try:
        if args.backend == "both":
            reports, code = run_each_backend(argv, args)
            if code != 0:
                return code
        else:
            reports = [run(config, backend=args.backend, postgres=args.postgres,
                           redis=args.redis, proxy_line=not args.no_proxy,
                           phases=args.only, stream_default=args.stream_default)]
    except KeyboardInterrupt:
        _progress("interrupted; servers stopped")
        return 130
    except (BenchError, NotDrained, proxy.ProxyError, servers.ServerStartError, DatabaseError,
            ImproperlyConfigured, environment.BackendUnavailable, OSError) as exc:
        _progress(f"failed: {exc}")
        return 2
    if len(reports) == 1:
        print(report.render_table(reports[0]))
        result = reports[0]
    else:
        print(report.render_reports(reports))
        result = {"version": report.REPORT_VERSION, "runs": reports,
                  "verdict": report.OK if all(r["verdict"] == report.OK for r in reports)
                  else report.OVER}
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
        _progress(f"report written to {args.json}")
    if args.strict and result["verdict"] != report.OK:
        return 1
    return 0
