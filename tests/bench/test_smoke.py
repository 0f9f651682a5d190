"""``python -m bench`` end to end, in a tiny configuration, on the backend of
the test pass (embedded in the first, PostgreSQL + Redis in the second).

These check the run's shape (a report with every line, both sides measured,
servers stopped), never its numbers: a shared machine makes any timing
assertion flaky.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import pytest

pytestmark = pytest.mark.e2e

PROJECT_ROOT = Path(__file__).resolve().parents[2]
TINY = ["--handshakes", "2", "--round-trips", "2", "--turns", "2", "--sessions", "2",
        "--updates", "2", "--repeats", "1", "--warmup", "1", "--turn-sessions", "3",
        "--turn-sessions-large", "4", "--turns-per-session", "2", "--opens", "6",
        "--open-concurrency", "3", "--idle-sessions", "10", "--stream-sessions", "2",
        "--stream-turns", "1", "--stream-deltas", "3", "--line-repeats", "1",
        "--no-stream-default", "--voice-sessions", "2", "--voice-samples", "1"]
LINES = ["idle_memory", "handshake", "context_round_trip", "tool_turn", "concurrency", "opens",
         "turns", "turns", "metrics_cost", "traces_cost", "streaming", "first_text_added", "voice"]
# Set-up (migrate, the daphne start-ups: product, baseline, the streaming,
# observability and voice lines' own) dominates; under this test's own timeout.
RUN_TIMEOUT = 200


def bench_env() -> dict[str, str]:
    """This environment without the suite's database and Redis: the run makes
    its own throwaway database and must not touch the suite's."""
    env = {name: value for name, value in os.environ.items()
           if name not in ("DATABASE_URL", "REDIS_URL")}
    env["PYTHONPATH"] = os.pathsep.join([str(PROJECT_ROOT), *filter(None, [env.get("PYTHONPATH")])])
    return env


def children_of(pid: int) -> list[int]:
    children = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # the process ended while we looked
        # The command name is in parentheses and may hold spaces; ppid follows it.
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[1]) == pid:
            children.append(int(entry.name))
    return children


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def backend_of_this_pass() -> list[str]:
    """The bench's backend options for this test pass: the second pass (its
    PostgreSQL and Redis in the environment) runs the bench on those servers,
    in a throwaway database and under a channel prefix of the run's own; the
    first on the embedded default."""
    database, redis = os.environ.get("DATABASE_URL", ""), os.environ.get("REDIS_URL", "")
    if not (database.startswith("postgres") and redis):
        return ["--backend", "embedded"]
    server = urlsplit(database)
    return ["--backend", "postgres", "--no-proxy",
            "--postgres", f"{server.scheme}://{server.netloc}", "--redis", redis]


@pytest.mark.timeout(RUN_TIMEOUT + 60)
def test_a_tiny_run_reports_every_line_with_both_sides_and_a_ratio(tmp_path):
    out = tmp_path / "report.json"
    backend = backend_of_this_pass()
    embedded = backend[1] == "embedded"

    done = subprocess.run(
        [sys.executable, "-m", "bench", *TINY, *backend, "--json", str(out)],
        cwd=PROJECT_ROOT, env=bench_env(), capture_output=True, text=True, timeout=RUN_TIMEOUT,
    )

    assert done.returncode == 0, done.stderr
    report = json.loads(out.read_text())
    assert report["version"] == 1
    assert report["config"]["handshakes"] == 2
    assert report["environment"]["llm"] == "offline"
    assert report["environment"]["backend"] == backend[1]
    assert report["environment"]["database"].startswith(
        "sqlite (throwaway" if embedded else "postgresql (throwaway")
    assert report["environment"]["open_files_limit"] > 0
    measures = {measure["name"]: measure for measure in report["measures"]}
    # The voice line runs on the embedded backend unless named.
    assert [measure["name"] for measure in report["measures"]] == (LINES if embedded else LINES[:-1])
    for name in ("handshake", "context_round_trip", "tool_turn"):
        measure = measures[name]
        assert measure["product"]["n"] == measure["baseline"]["n"] == 2
        assert measure["product"]["p50"] <= measure["product"]["p95"] <= measure["product"]["p99"]
        assert all(value > 0 for value in measure["ratios"].values())
        assert measure["verdict"] in ("ok", "over")
    turns_small, turns_large = [m for m in report["measures"] if m["name"] == "turns"]
    assert turns_small["raw"]["product"]["count"] == 3 * 2
    assert turns_large["raw"]["baseline"]["count"] == 4 * 2
    assert [row["stat"] for row in turns_small["rows"]] == ["turns/s", "p50 ms", "p99 ms"]
    assert [row["target"] for row in turns_small["rows"]] == [">= 0.25x", "<= 5x", ""]
    assert measures["opens"]["raw"]["product"]["count"] == 6
    idle = measures["idle_memory"]["raw"]
    assert idle["product"]["sessions"] == idle["baseline"]["sessions"] == 10
    # Every stamped delta of every streamed answer reached the page.
    assert measures["streaming"]["raw"]["product"]["count"] == 2 * 1 * 3
    assert measures["streaming"]["verdict"] in ("ok", "over")
    # The first text of every turn, through the product and straight from the fake model.
    first_text = measures["first_text_added"]
    assert [row["stat"] for row in first_text["rows"]] == [
        "1 at once: p50 ms", "1 at once: added p50 ms", "2 at once: p50 ms", "2 at once: added p50 ms"]
    assert [(side["count"]) for sessions in ("1", "2") for side in first_text["raw"][sessions].values()] == [
        1 * 1, 1 * 1, 2 * 1, 2 * 1]
    if embedded:
        # One session, then two, each speaking two turns; every turn heard and spoken back.
        voice = measures["voice"]["raw"]
        assert [(step["sessions"], step["count"]) for step in voice["steps"]] == [(1, 2), (2, 4)]
        assert voice["held_sessions"] in (1, 2)
    for measure in report["measures"]:
        if measure["kind"] == "line":
            assert all(row["ratio"] > 0 for row in measure["rows"]
                       if row["baseline"] is not None), measure["name"]
    assert any("drained" in note for note in report["notes"])
    throughput = measures["concurrency"]
    assert throughput["product"]["frames"] == throughput["baseline"]["frames"] == 2 * 2 * 2
    assert throughput["ratios"]["frames_per_s"] > 0
    # Every frame the product sent passed the deployed client's schema.
    assert report["wire_problems"] == []
    assert report["verdict"] in ("ok", "over")
    assert "ratio" in done.stdout and "verdict" in done.stdout
    assert done.stdout.rstrip().splitlines()[-1] == f"overall: {report['verdict']}"


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc to find children")
def test_an_interrupted_run_stops_both_servers_and_exits_130():
    # Far more handshakes than the test waits for: the signal lands mid-phase.
    command = [sys.executable, "-m", "bench", *TINY, "--handshakes", "100000", "--only",
               "samples"]
    run = subprocess.Popen(command, cwd=PROJECT_ROOT, env=bench_env(), stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    try:
        for _ in range(200):  # progress and start-up log lines precede the phase
            line = run.stderr.readline()
            if "handshake latency" in line or not line:
                break
        assert "handshake latency" in line, line
        servers = children_of(run.pid)
        assert len(servers) == 2

        run.send_signal(signal.SIGTERM)
        code = run.wait(timeout=RUN_TIMEOUT)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
        run.stdout.close()
        run.stderr.close()

    assert code == 130
    assert [pid for pid in servers if alive(pid)] == []
