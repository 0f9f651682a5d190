"""The run: prepare a database, start both servers, measure, report, stop.

    python -m bench [--quick] [--json out.json] [--strict]

Exit codes: 0 when the run completed (whatever the verdicts, unless
--strict), 1 with --strict when a verdict is "over", 2 when the run could not
measure (a server did not start, an answer never came), 130 on Ctrl-C.
Everything started here is stopped on every one of those paths.
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
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import DatabaseError

from bench import environment, measure, report, servers
from bench.measure import BenchError, Observations, Target, Throughput
from bench.stats import latency_summary

logger = logging.getLogger(__name__)

# Room above the sessions the run holds at once: a closed session's row is
# released by its teardown, which may still be running when the next opens.
SESSION_CAP_HEADROOM = 64
# No phase of even the full run needs this long; a phase that does has hung.
PHASE_TIMEOUT = 300.0


@dataclass(frozen=True)
class BenchConfig:
    handshakes: int
    round_trips: int
    turns: int
    sessions: int
    updates: int
    repeats: int
    warmup: int


FULL = BenchConfig(handshakes=200, round_trips=500, turns=50, sessions=32, updates=50, repeats=3,
                   warmup=10)
QUICK = BenchConfig(handshakes=40, round_trips=100, turns=10, sessions=8, updates=20, repeats=1,
                    warmup=3)


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, BenchConfig]:
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description="Latency and throughput of OwlLayer against a bare Channels baseline.",
    )
    parser.add_argument("--quick", action="store_true", help="a smaller run (under a minute)")
    parser.add_argument("--json", metavar="PATH", type=Path, help="also write the report here")
    parser.add_argument("--strict", action="store_true",
                        help="exit 1 when any verdict is 'over'")
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress details")
    sizes = parser.add_argument_group("sizes (override the preset)")
    for field in dataclasses.fields(BenchConfig):
        sizes.add_argument(f"--{field.name.replace('_', '-')}", type=_positive, metavar="N",
                           dest=field.name, default=None)
    args = parser.parse_args(argv)
    preset = QUICK if args.quick else FULL
    overrides = {
        field.name: getattr(args, field.name)
        for field in dataclasses.fields(BenchConfig)
        if getattr(args, field.name) is not None
    }
    return args, dataclasses.replace(preset, **overrides)


def _positive(raw: str) -> int:
    value = int(raw)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _progress(message: str) -> None:
    print(f"bench: {message}", file=sys.stderr, flush=True)


async def measure_all(config: BenchConfig, product: Target, baseline: Target,
                      api_key: str) -> tuple[list[dict], list[str], list[str]]:
    targets = [product, baseline]
    log = Observations()
    measures = []

    _progress(f"handshake latency: {config.handshakes} connections each")
    async with asyncio.timeout(PHASE_TIMEOUT):
        samples = await measure.handshakes(targets, api_key, count=config.handshakes,
                                           warmup=config.warmup)
    measures.append(report.latency_measure(
        "handshake", "handshake", samples[product.name], samples[baseline.name]))

    _progress(f"context round trip: {config.round_trips} updates each")
    async with asyncio.timeout(PHASE_TIMEOUT):
        samples = await measure.context_round_trips(targets, api_key, log,
                                                    count=config.round_trips,
                                                    warmup=config.warmup)
    measures.append(report.latency_measure(
        "context_round_trip", "context round trip", samples[product.name],
        samples[baseline.name]))

    _progress(f"turn with one tool call: {config.turns} turns each")
    async with asyncio.timeout(PHASE_TIMEOUT):
        samples = await measure.tool_turns(targets, api_key, log, count=config.turns,
                                           warmup=config.warmup)
    measures.append(report.latency_measure(
        "tool_turn", "turn with one tool", samples[product.name], samples[baseline.name]))

    _progress(f"concurrency: {config.sessions} sessions x {config.updates} updates, "
              f"best of {config.repeats}")
    best: dict[str, Throughput] = {}
    for repeat in range(config.repeats):
        for target in measure.alternating(targets, repeat + 1):
            async with asyncio.timeout(PHASE_TIMEOUT):
                result = await measure.concurrent_sessions(
                    target, api_key, log, sessions=config.sessions, updates=config.updates)
            if target.name not in best or (
                result.frames_per_second > best[target.name].frames_per_second
            ):
                best[target.name] = result
    title = f"{config.sessions} sessions x {config.updates} updates"
    measures.append(report.throughput_measure(
        "concurrency", title, _throughput(best[product.name]), _throughput(best[baseline.name])))
    return measures, log.problems(), log.notes()


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


def run(config: BenchConfig) -> dict:
    """Set up, measure and tear down; the report."""
    started = time.perf_counter()
    scratch = Path(tempfile.mkdtemp(prefix="owllayer-bench-", dir=scratch_parent()))
    server_set: servers.ServerSet | None = None
    tenant = None
    throwaway_database = True
    try:
        run_env = environment.prepare(scratch)
        throwaway_database = run_env.throwaway_database
        _progress("preparing the database"
                  + (" (throwaway sqlite)" if run_env.throwaway_database else " (DATABASE_URL)"))
        environment.setup_database()
        tenant, api_key = environment.create_key(
            max_sessions=config.sessions + SESSION_CAP_HEADROOM)
        described = run_env.describe()
        # The run itself does not touch the database again until the end.
        environment.close_connections()

        _progress("starting the product and the baseline (daphne on 127.0.0.1)")
        server_set = servers.ServerSet(os.environ, scratch)
        started_servers = server_set.start(
            {"product": servers.product_command, "baseline": servers.baseline_command})
        path = settings.OWLLAYER_WS_PATH
        product = Target("product", started_servers["product"].ws_url(path), check_frames=True)
        baseline = Target("baseline", started_servers["baseline"].ws_url(path),
                          check_frames=False)
        try:
            measures, problems, notes = asyncio.run(measure_all(config, product, baseline, api_key))
        except BenchError:
            for server in server_set.started:
                if not server.running:
                    _progress(f"the {server.name} server died; its log:\n{server.log_tail()}")
            raise
    finally:
        if server_set is not None:
            server_set.stop_all()
        if tenant is not None and not throwaway_database:
            environment.remove_tenant(tenant)
        if tenant is not None:
            environment.close_connections()
        shutil.rmtree(scratch, ignore_errors=True)
    return report.build_report(
        config=dataclasses.asdict(config),
        environment=described,
        measures=measures,
        wire_problems=problems,
        notes=notes,
        seconds=time.perf_counter() - started,
    )


def _terminate(signum: int, frame) -> None:
    # SIGTERM takes the Ctrl-C path, so every `finally` stops what it started.
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    args, config = parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    signal.signal(signal.SIGTERM, _terminate)
    try:
        result = run(config)
    except KeyboardInterrupt:
        _progress("interrupted; servers stopped")
        return 130
    except (BenchError, servers.ServerStartError, DatabaseError, ImproperlyConfigured) as exc:
        _progress(f"failed: {exc}")
        return 2
    print(report.render_table(result))
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
        _progress(f"report written to {args.json}")
    if args.strict and result["verdict"] != report.OK:
        return 1
    return 0
