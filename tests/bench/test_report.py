"""The report's arithmetic and verdicts, on made-up samples (no servers)."""
from __future__ import annotations

import pytest

from bench import report
from bench.run import FULL, QUICK, parse_args
from bench.stats import latency_summary, percentile, ratio

FAST = [0.001] * 20  # 1 ms each
SLOW = [0.004] * 20  # 4 ms each


def test_percentile_interpolates_between_the_two_nearest_ranks():
    samples = [1.0, 2.0, 3.0, 4.0]

    assert percentile(samples, 50) == pytest.approx(2.5)
    assert percentile(samples, 0) == 1.0
    assert percentile(samples, 100) == 4.0


def test_percentile_refuses_an_empty_sample():
    with pytest.raises(ValueError, match="no samples"):
        percentile([], 50)


def test_a_latency_summary_is_in_milliseconds_and_ordered():
    summary = latency_summary([0.001, 0.002, 0.010])

    assert summary["n"] == 3
    assert summary["min"] == pytest.approx(1.0)
    assert summary["max"] == pytest.approx(10.0)
    assert summary["p50"] <= summary["p95"] <= summary["p99"] <= summary["max"]


def test_a_ratio_against_a_zero_baseline_is_not_a_number_we_invent():
    assert ratio(5.0, 0.0) is None


def test_a_handshake_four_times_the_baseline_and_fast_is_ok():
    line = report.latency_measure("handshake", "handshake", SLOW, FAST)

    assert line["ratios"]["p95"] == pytest.approx(4.0)
    assert line["verdict"] == report.OK


def test_a_handshake_six_times_the_baseline_is_over():
    line = report.latency_measure("handshake", "handshake", [0.006] * 20, FAST)

    assert line["verdict"] == report.OVER


def test_a_good_ratio_does_not_excuse_an_absolute_budget_overrun():
    # 150 ms against a 100 ms baseline: 1.5x, but over the 100 ms ceiling.
    line = report.latency_measure("handshake", "handshake", [0.150] * 20, [0.100] * 20)

    assert line["ratios"]["p95"] == pytest.approx(1.5)
    assert line["verdict"] == report.OVER


def test_throughput_below_a_fifth_of_the_baseline_is_over():
    line = report.throughput_measure(
        "concurrency", "8 x 20", {"frames_per_s": 100.0}, {"frames_per_s": 1000.0})

    assert line["ratios"]["frames_per_s"] == pytest.approx(0.1)
    assert line["verdict"] == report.OVER


def test_one_line_over_makes_the_whole_report_over():
    lines = [
        report.latency_measure("handshake", "handshake", SLOW, FAST),
        report.throughput_measure("concurrency", "8 x 20", {"frames_per_s": 10.0},
                                  {"frames_per_s": 1000.0}),
    ]
    built = report.build_report(config={}, environment={}, measures=lines, wire_problems=[],
                                notes=[], seconds=1.0)

    assert built["verdict"] == report.OVER


def test_a_frame_the_browser_would_drop_makes_the_report_over():
    lines = [report.latency_measure("handshake", "handshake", SLOW, FAST)]
    built = report.build_report(config={}, environment={}, measures=lines,
                                wire_problems=["tool turn: TOOL_CALL: args must be an object"],
                                notes=[], seconds=1.0)

    assert built["verdict"] == report.OVER


def test_the_table_shows_both_numbers_the_ratio_the_target_and_the_verdict():
    built = report.build_report(
        config={},
        environment={"database": "sqlite", "channel_layer": "InMemoryChannelLayer",
                     "llm": "offline", "cpus": 2},
        measures=[report.latency_measure("handshake", "handshake", SLOW, FAST)],
        wire_problems=[], notes=["a note"], seconds=1.0,
    )

    table = report.render_table(built)
    p95_line = next(line for line in table.splitlines() if "p95" in line)

    assert "4.00" in p95_line and "1.00" in p95_line
    assert "4.00x" in p95_line
    assert "p95 <= 5x and < 100 ms" in p95_line
    assert p95_line.rstrip().endswith("ok")
    assert "note: a note" in table
    assert table.splitlines()[-1] == "overall: ok"


def test_quick_is_a_smaller_preset_and_a_size_flag_overrides_it():
    _args, config = parse_args(["--quick", "--turns", "3"])

    assert config.turns == 3
    assert config.handshakes == QUICK.handshakes < FULL.handshakes


def test_a_size_of_zero_is_refused():
    with pytest.raises(SystemExit):
        parse_args(["--sessions", "0"])


def test_the_table_shows_the_update_latency_under_load_without_a_verdict():
    side = {"frames_per_s": 100.0, "update_latency_ms": latency_summary([0.010] * 5)}
    fast = {"frames_per_s": 1000.0, "update_latency_ms": latency_summary([0.001] * 5)}
    line = report.throughput_measure("concurrency", "8 x 20", side, fast)
    built = report.build_report(
        config={},
        environment={"database": "sqlite", "channel_layer": "InMemoryChannelLayer",
                     "llm": "offline", "cpus": 2},
        measures=[line], wire_problems=[], notes=[], seconds=1.0,
    )

    rows = report.table_rows(built)

    assert rows[0][1] == "frames/s" and rows[0][-1] == "over"
    assert rows[1][1] == "update p95 ms"
    assert rows[1][4] == "10.00x"
    assert rows[1][-1] == ""
