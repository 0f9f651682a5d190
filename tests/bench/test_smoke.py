"""``python -m bench`` end to end, in a tiny configuration.

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

import pytest

pytestmark = pytest.mark.e2e

PROJECT_ROOT = Path(__file__).resolve().parents[2]
TINY = ["--handshakes", "2", "--round-trips", "2", "--turns", "2", "--sessions", "2",
        "--updates", "2", "--repeats", "1", "--warmup", "1"]
# Set-up (migrate, two daphne start-ups) dominates; well under pytest's own timeout.
RUN_TIMEOUT = 100


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


def test_a_tiny_run_reports_every_line_with_both_sides_and_a_ratio(tmp_path):
    out = tmp_path / "report.json"

    done = subprocess.run(
        [sys.executable, "-m", "bench", *TINY, "--json", str(out)],
        cwd=PROJECT_ROOT, env=bench_env(), capture_output=True, text=True, timeout=RUN_TIMEOUT,
    )

    assert done.returncode == 0, done.stderr
    report = json.loads(out.read_text())
    assert report["version"] == 1
    assert report["config"]["handshakes"] == 2
    assert report["environment"]["llm"] == "offline"
    assert report["environment"]["database"].startswith("sqlite (throwaway")
    names = [measure["name"] for measure in report["measures"]]
    assert names == ["handshake", "context_round_trip", "tool_turn", "concurrency"]
    for measure in report["measures"][:3]:
        assert measure["product"]["n"] == measure["baseline"]["n"] == 2
        assert measure["product"]["p50"] <= measure["product"]["p95"] <= measure["product"]["p99"]
        assert all(value > 0 for value in measure["ratios"].values())
        assert measure["verdict"] in ("ok", "over")
    throughput = report["measures"][3]
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
    command = [sys.executable, "-m", "bench", *TINY, "--handshakes", "100000"]
    run = subprocess.Popen(command, cwd=PROJECT_ROOT, env=bench_env(), stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    try:
        for _ in range(20):  # a handful of progress lines precede the phase
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
