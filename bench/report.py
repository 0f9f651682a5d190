"""The report: numbers, ratios product/baseline, targets and verdicts. Pure.

A ratio is always product / baseline. For latencies higher is worse (3.0x:
the product takes three times as long as a bare Channels echo); for
throughput lower is worse (0.25x: the product moves a quarter of the frames).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

from bench.stats import PERCENTILES, doubling_point, latency_summary, ratio

REPORT_VERSION = 1
OK = "ok"
OVER = "over"


@dataclass(frozen=True)
class LatencyTarget:
    """ok when the product's ``stat`` is at most ``max_ratio`` times the
    baseline's and under ``max_ms`` in absolute terms."""

    stat: str
    max_ratio: float
    max_ms: float
    source: str

    def describe(self) -> str:
        return f"{self.stat} <= {self.max_ratio:g}x and < {self.max_ms:g} ms"

    def verdict(self, product_ms: float, baseline_ms: float) -> str:
        measured = ratio(product_ms, baseline_ms)
        within_ratio = measured is not None and measured <= self.max_ratio
        return OK if within_ratio and product_ms < self.max_ms else OVER


@dataclass(frozen=True)
class ThroughputTarget:
    """ok when the product moves at least ``min_ratio`` times the baseline's frames."""

    min_ratio: float
    source: str

    def describe(self) -> str:
        return f">= {self.min_ratio:g}x baseline"

    def verdict(self, product_rate: float, baseline_rate: float) -> str:
        measured = ratio(product_rate, baseline_rate)
        return OK if measured is not None and measured >= self.min_ratio else OVER


# The deployed client's numbers (docs/protocol.md) and the budgets derived from them.
TARGETS = {
    "handshake": LatencyTarget(
        stat="p95", max_ratio=5.0, max_ms=100.0,
        source="protocol.md §3: answer HANDSHAKE_INIT well inside the client's 5,000 ms, "
               "a few ms after the key lookup",
    ),
    "context_round_trip": LatencyTarget(
        stat="p95", max_ratio=5.0, max_ms=100.0,
        source="protocol.md §4: the update follows the ACK and is flushed before every "
               "TOOL_RESULT, so it gets the handshake's budget",
    ),
    "tool_turn": LatencyTarget(
        stat="p95", max_ratio=10.0, max_ms=500.0,
        source="protocol.md §6-7 and §11: the tool round trip sits inside the 10 s tool wait; the "
               "server's share (no model time offline) must stay a small part of it",
    ),
    "concurrency": ThroughputTarget(
        min_ratio=0.2,
        source="the context update budget (5x) applied to throughput under load",
    ),
}


def latency_measure(name: str, title: str, product: Sequence[float],
                    baseline: Sequence[float]) -> dict:
    """One latency line from raw samples in seconds."""
    target = TARGETS[name]
    product_stats = latency_summary(product)
    baseline_stats = latency_summary(baseline)
    ratios = {
        f"p{pct}": ratio(product_stats[f"p{pct}"], baseline_stats[f"p{pct}"])
        for pct in PERCENTILES
    }
    return {
        "name": name,
        "title": title,
        "kind": "latency",
        "unit": "ms",
        "product": product_stats,
        "baseline": baseline_stats,
        "ratios": ratios,
        "target": {"text": target.describe(), **asdict(target)},
        "verdict": target.verdict(product_stats[target.stat], baseline_stats[target.stat]),
    }


def throughput_measure(name: str, title: str, product: dict, baseline: dict) -> dict:
    """One throughput line; each side is ``{"frames_per_s": ..., ...}``, with
    ``update_latency_ms`` (a latency summary) when the run measured it."""
    target = TARGETS[name]
    ratios = {"frames_per_s": ratio(product["frames_per_s"], baseline["frames_per_s"])}
    if "update_latency_ms" in product and "update_latency_ms" in baseline:
        ratios["update_p95_ms"] = ratio(product["update_latency_ms"]["p95"],
                                        baseline["update_latency_ms"]["p95"])
    return {
        "name": name,
        "title": title,
        "kind": "throughput",
        "unit": "frames/s",
        "product": product,
        "baseline": baseline,
        "ratios": ratios,
        "target": {"text": target.describe(), **asdict(target)},
        "verdict": target.verdict(product["frames_per_s"], baseline["frames_per_s"]),
    }


# --- the lines of many sessions (bench.lines) ---------------------------------------


@dataclass(frozen=True)
class Check:
    """ok when product/baseline of ``stat`` is ``op`` ``limit``."""

    stat: str
    op: str  # ">=" (higher is better) or "<=" (lower is better)
    limit: float

    def describe(self) -> str:
        return f"{self.op} {self.limit:g}x"

    def verdict(self, measured: float | None) -> str:
        if measured is None:
            return OVER
        return OK if (measured >= self.limit if self.op == ">=" else measured <= self.limit) \
            else OVER


# The targets for the buyer's question (docs/performance.md).
LINE_CHECKS = {
    "turns": (Check("turns/s", ">=", 0.25), Check("p50 ms", "<=", 5.0)),
    "opens": (Check("opens/s", ">=", 0.5),),
    "idle_memory": (Check("KiB/session", "<=", 2.0),),
    "streaming": (Check("p50 ms", "<=", 2.0), Check("p99 ms", "<=", 3.0)),
    # Keeping the figures (OWLLAYER_METRICS, on by default) against not keeping them.
    "metrics_cost": (Check("turns/s", ">=", 0.95), Check("p50 ms", "<=", 1.05)),
}
INFO = "-"


def line_measure(name: str, title: str, stats: list[tuple[str, float, float | None]], *,
                 checks_of: str | None = None, raw: dict | None = None) -> dict:
    """A line of (stat, product, baseline) rows, each with its ratio and,
    where the targets name the stat, its verdict. ``checks_of``: the
    targets to apply (default: the line's name; none for informative lines).
    A row whose baseline is None is a finding of its own, without a ratio."""
    checks = {check.stat: check for check in LINE_CHECKS.get(checks_of or name, ())}
    rows = []
    for stat, product, baseline in stats:
        measured = None if baseline is None else ratio(product, baseline)
        check = checks.get(stat)
        rows.append({
            "stat": stat, "product": product, "baseline": baseline, "ratio": measured,
            "target": check.describe() if check else "",
            "verdict": check.verdict(measured) if check else "",
        })
    verdicts = [row["verdict"] for row in rows if row["verdict"]]
    return {
        "name": name,
        "title": title,
        "kind": "line",
        "rows": rows,
        "raw": raw or {},
        "verdict": (OK if all(v == OK for v in verdicts) else OVER) if verdicts else INFO,
    }


VOICE_DOUBLING = 2.0


def voice_measure(name: str, title: str, steps: Sequence[tuple[int, dict]], *,
                  raw: dict | None = None) -> dict:
    """The voice line: (sessions, figures) per concurrency step, fewest
    sessions first, the first step being one session; each step's figures
    hold ``latency_ms`` (a latency summary) and whatever else the raw
    report should keep. The rows compare each step with that one session of
    the same run (the "baseline" column: the same stat at one session; ratio
    = step / one session), then say how many concurrent sessions were held
    before the p50 doubled."""
    if not steps or steps[0][0] != 1:
        raise ValueError("the voice line's first step is one session")
    single = steps[0][1]["latency_ms"]
    rows: list[tuple[str, float, float | None]] = []
    for sessions, figures in steps:
        unit = "session" if sessions == 1 else "sessions"
        rows.append((f"p50 ms, {sessions} {unit}", figures["latency_ms"]["p50"], single["p50"]))
        rows.append((f"p99 ms, {sessions} {unit}", figures["latency_ms"]["p99"], single["p99"]))
    held, doubled_at = doubling_point(
        [(sessions, figures["latency_ms"]["p50"]) for sessions, figures in steps], VOICE_DOUBLING)
    if doubled_at is None:
        rows.append((f"sessions, p50 under {VOICE_DOUBLING:g}x up to", float(held), None))
    else:
        rows.append((f"sessions held before p50 {VOICE_DOUBLING:g}x", float(held), None))
    return line_measure(name, title, rows, raw={
        **(raw or {}), "held_sessions": held, "p50_doubled_at": doubled_at,
        "steps": [{"sessions": sessions, **figures,
                   "p50_ratio": ratio(figures["latency_ms"]["p50"], single["p50"])}
                  for sessions, figures in steps],
    })


def build_report(*, config: dict, environment: dict, measures: list[dict],
                 wire_problems: list[str], notes: list[str], seconds: float) -> dict:
    verdicts = [measure["verdict"] for measure in measures if measure["verdict"] != INFO]
    return {
        "version": REPORT_VERSION,
        "config": config,
        "environment": environment,
        "measures": measures,
        "wire_problems": wire_problems,
        "notes": notes,
        "verdict": OK if all(v == OK for v in verdicts) and not wire_problems else OVER,
        "seconds": seconds,
    }


# --- the table -------------------------------------------------------------------

COLUMNS = ("measure", "stat", "product", "baseline", "ratio", "target", "verdict")


def table_rows(report: dict) -> list[tuple[str, ...]]:
    rows = []
    for measure in report["measures"]:
        if measure["kind"] == "line":
            for number, row in enumerate(measure["rows"]):
                alone = row["baseline"] is None
                rows.append((
                    measure["title"] if number == 0 else "", row["stat"],
                    _count(row["product"]) if alone else _number(row["product"]),
                    "" if alone else _number(row["baseline"]),
                    "" if alone else _ratio(row["ratio"]), row["target"], row["verdict"],
                ))
            continue
        verdict = (measure["target"]["text"], measure["verdict"])
        if measure["kind"] == "latency":
            for number, pct in enumerate(PERCENTILES):
                stat = f"p{pct}"
                rows.append((
                    measure["title"] if number == 0 else "",
                    f"{stat} ms",
                    _number(measure["product"][stat]),
                    _number(measure["baseline"][stat]),
                    _ratio(measure["ratios"][stat]),
                    *(verdict if stat == measure["target"]["stat"] else ("", "")),
                ))
            continue
        rows.append((
            measure["title"], "frames/s",
            _number(measure["product"]["frames_per_s"]),
            _number(measure["baseline"]["frames_per_s"]),
            _ratio(measure["ratios"]["frames_per_s"]),
            *verdict,
        ))
        if "update_p95_ms" in measure["ratios"]:
            # Context for the verdict: what one page waits under that load.
            rows.append((
                "", "update p95 ms",
                _number(measure["product"]["update_latency_ms"]["p95"]),
                _number(measure["baseline"]["update_latency_ms"]["p95"]),
                _ratio(measure["ratios"]["update_p95_ms"]),
                "", "",
            ))
    return rows


def render_table(report: dict) -> str:
    rows = [COLUMNS, *table_rows(report)]
    widths = [max(len(row[column]) for row in rows) for column in range(len(COLUMNS))]
    # Text columns left, numbers right.
    right = {2, 3, 4}
    lines = []
    for number, row in enumerate(rows):
        cells = [
            cell.rjust(width) if column in right else cell.ljust(width)
            for column, (cell, width) in enumerate(zip(row, widths, strict=True))
        ]
        lines.append("  ".join(cells).rstrip())
        if number == 0:
            lines.append("  ".join("-" * width for width in widths))
    env = report["environment"]
    lines.append("")
    lines.append(
        f"backend {env.get('backend', 'embedded')}: "
        f"database {env['database']}, channel layer {env['channel_layer']}, "
        f"llm {env['llm']}, {env['cpus']} cpus; {report['seconds']:.1f} s"
    )
    for problem in report["wire_problems"]:
        lines.append(f"wire problem: {problem}")
    for note in report["notes"]:
        lines.append(f"note: {note}")
    lines.append(f"overall: {report['verdict']}")
    return "\n".join(lines)


def render_reports(reports: list[dict]) -> str:
    """Several backends' tables one after the other, then the overall verdict."""
    overall = OK if all(report["verdict"] == OK for report in reports) else OVER
    parts = [render_table(report) for report in reports]
    return "\n\n".join(parts) + f"\n\nall backends: {overall}"


def _number(value: float) -> str:
    if value >= 100:
        return f"{value:,.0f}"
    if value >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def _count(value: float) -> str:
    """A finding of its own (a row without a baseline): whole numbers as such."""
    return f"{value:,.0f}" if float(value).is_integer() else _number(value)


def _ratio(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}x"
