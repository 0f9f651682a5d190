"""What a host's monitoring reads: the process's figures, in Prometheus' text format.

The product records what happens (a session opened or refused, a turn and
its time to first token, a tool call and its outcome, an approval's wait,
the model's tokens and errors, voice seconds, rate-limit refusals, the
database's and the channel layer's latency, the writes grouped into one call, a
drain) through the functions below; with ``OWLLAYER_METRICS`` off each is
a no-op.

The figures are kept with ``prometheus_client``'s multi-process mode, in
files under one directory: ``OWLLAYER_METRICS_DIR`` when the processes of a
host share one (then any of them answers a scrape with the sum of all), or
a directory of the process's own, removed at its exit. Each process serves
them on ``OWLLAYER_METRICS_ADDRESS`` (``runtime.metrics_server``), never on
the public port. Labels are bounded sets (outcomes, codes, kinds): never a
session, key or tenant id.
"""
from __future__ import annotations

import atexit
import contextlib
import functools
import logging
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ParamSpec

from runtime.config import config

logger = logging.getLogger(__name__)
P = ParamSpec("P")

# Seconds, for the histograms.
FAST = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
FIRST_TOKEN = (0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0)
TURN = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0)
TOOL = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
APPROVAL = (1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0)


@dataclass(frozen=True)
class _Figures:
    sessions_live: Any
    sessions_opened: Any
    session_refusals: Any
    turns: Any
    turn_seconds: Any
    first_token_seconds: Any
    tool_call_seconds: Any
    approval_wait_seconds: Any
    llm_tokens: Any
    llm_errors: Any
    voice_seconds: Any
    rate_limited: Any
    database_seconds: Any
    channel_layer_seconds: Any
    writes_grouped: Any
    draining: Any


_figures: _Figures | None = None
_directory = ""
_lock = threading.Lock()


def enabled() -> bool:
    return config().metrics.enabled


def directory() -> str:
    """Where this process's figures are kept (made on first use)."""
    _made()
    return _directory


def _made() -> _Figures:
    global _figures
    if _figures is None:
        with _lock:
            if _figures is None:
                _figures = _make()
    return _figures


def _make() -> _Figures:
    global _directory
    shared = config().metrics.directory
    if shared:
        os.makedirs(shared, exist_ok=True)
        _directory = shared
        _forget_gone_processes(shared)
    else:
        _directory = tempfile.mkdtemp(prefix="owllayer-metrics-")
        atexit.register(shutil.rmtree, _directory, ignore_errors=True)
    # Where the values' files go; the mode is set here whatever imported
    # prometheus_client first (it reads the variable once, at its import).
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = _directory
    from prometheus_client import Counter, Gauge, Histogram, multiprocess, values

    values.ValueClass = values.MultiProcessValue()

    if shared:
        # The live figures (sessions, waiting writes, draining) of this
        # process leave the sum when it exits; its counts stay.
        pid = os.getpid()
        atexit.register(lambda: multiprocess.mark_process_dead(pid, shared))

    def counter(name: str, text: str, labels: tuple[str, ...] = ()) -> Any:
        return Counter(name, text, labels, registry=None)

    def histogram(name: str, text: str, buckets: tuple[float, ...], labels: tuple[str, ...] = ()) -> Any:
        return Histogram(name, text, labels, buckets=buckets, registry=None)

    def gauge(name: str, text: str, mode: str, labels: tuple[str, ...] = ()) -> Any:
        return Gauge(name, text, labels, multiprocess_mode=mode, registry=None)

    return _Figures(
        sessions_live=gauge("owllayer_sessions_live", "Sessions open now.", "livesum"),
        sessions_opened=counter("owllayer_sessions_opened", "Sessions opened (handshake accepted)."),
        session_refusals=counter("owllayer_session_refusals", "Connections closed before their "
                                 "session opened, by the error code they were given.", ("code",)),
        turns=counter("owllayer_turns", "Turns, by how they ended: answered, failed, cut "
                      "(barge-in, the page gone) or refused (limits, quota).", ("outcome",)),
        turn_seconds=histogram("owllayer_turn_seconds", "Seconds from a turn's start to its end.", TURN),
        first_token_seconds=histogram("owllayer_time_to_first_token_seconds", "Seconds from a "
                                      "turn's start to the model's first text.", FIRST_TOKEN),
        tool_call_seconds=histogram("owllayer_tool_call_seconds", "Seconds a tool call took, approval "
                                    "wait included, by where it ran and its outcome.", TOOL,
                                    ("origin", "outcome")),
        approval_wait_seconds=histogram("owllayer_approval_wait_seconds", "Seconds a call waited for "
                                        "its approval, by the decision.", APPROVAL, ("outcome",)),
        llm_tokens=counter("owllayer_llm_tokens", "Tokens the model read and wrote.", ("kind",)),
        llm_errors=counter("owllayer_llm_errors", "Turns the model failed, by error code.", ("code",)),
        voice_seconds=counter("owllayer_voice_seconds", "Seconds of voice heard and spoken.",
                              ("direction",)),
        rate_limited=counter("owllayer_rate_limited", "Frames, inputs, approval requests, opens and "
                             "audio refused by a rate limit.", ("limit",)),
        database_seconds=histogram("owllayer_database_call_seconds", "Seconds a database call took, "
                                   "its wait for a thread included.", FAST),
        channel_layer_seconds=histogram("owllayer_channel_layer_seconds", "Seconds a channel layer "
                                        "call took.", FAST, ("operation",)),
        writes_grouped=gauge("owllayer_writes_grouped", "Writes in the latest group sent to the "
                             "database in one call: those that waited behind the group before it.",
                             "livesum", ("writes",)),
        draining=gauge("owllayer_process_draining", "1 while the process drains before it stops.",
                       "liveall"),
    )


def _forget_gone_processes(path: str) -> None:
    """The live figures of processes that are gone without saying so
    (killed) leave the sum; their counts stay."""
    from prometheus_client import multiprocess

    for name in os.listdir(path):
        if not (name.startswith("gauge_live") and name.endswith(".db")):
            continue
        pid_text = name.rsplit("_", 1)[-1][: -len(".db")]
        if pid_text.isdigit() and not _running(int(pid_text)):
            with contextlib.suppress(OSError):
                multiprocess.mark_process_dead(int(pid_text), path)


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def exposition() -> tuple[bytes, str]:
    """The figures of every process sharing the directory, in the text
    format, and its content type."""
    from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
    from prometheus_client.multiprocess import MultiProcessCollector

    path = directory()
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=path)
    return generate_latest(registry), CONTENT_TYPE_LATEST


# --- what the product records -----------------------------------------------------------
#
# Each is a no-op with OWLLAYER_METRICS off, and never raises into the turn,
# the connection or the write that records: a failure is logged (at most
# once a minute) and the figure is lost.

_failed_at = 0.0


def _recorder(function: Callable[P, None]) -> Callable[P, None]:
    @functools.wraps(function)
    def record(*args: P.args, **kwargs: P.kwargs) -> None:
        if not enabled():
            return
        try:
            function(*args, **kwargs)
        except Exception as exc:
            _record_failed(function.__name__, exc)

    return record


def _record_failed(name: str, error: Exception) -> None:
    global _failed_at
    now = time.monotonic()
    if now - _failed_at >= 60 or _failed_at == 0.0:
        _failed_at = now
        logger.error("a figure (%s) could not be recorded; the server goes on without it",
                     name, exc_info=error)


@_recorder
def session_opened() -> None:
    figures = _made()
    figures.sessions_opened.inc()
    figures.sessions_live.inc()


@_recorder
def session_closed() -> None:
    """An opened session ended (after ``session_opened``)."""
    _made().sessions_live.dec()


@_recorder
def session_refused(code: str) -> None:
    _made().session_refusals.labels(code).inc()


@_recorder
def turn_ended(outcome: str, seconds: float | None = None, first_token: float | None = None) -> None:
    figures = _made()
    figures.turns.labels(outcome).inc()
    if seconds is not None:
        figures.turn_seconds.observe(seconds)
    if first_token is not None:
        figures.first_token_seconds.observe(first_token)


@_recorder
def tool_call(origin: str, outcome: str, seconds: float) -> None:
    _made().tool_call_seconds.labels(origin, outcome).observe(seconds)


@_recorder
def approval_waited(outcome: str, seconds: float) -> None:
    _made().approval_wait_seconds.labels(outcome).observe(seconds)


@_recorder
def llm_used(*, input_tokens: int, output_tokens: int, cache_read_tokens: int,
             cache_write_tokens: int) -> None:
    tokens = _made().llm_tokens
    for kind, count in (("input", input_tokens), ("output", output_tokens),
                        ("cache_read", cache_read_tokens), ("cache_write", cache_write_tokens)):
        if count:
            tokens.labels(kind).inc(count)


@_recorder
def llm_error(code: str) -> None:
    _made().llm_errors.labels(code).inc()


@_recorder
def voice(direction: str, seconds: float) -> None:
    if seconds > 0:
        _made().voice_seconds.labels(direction).inc(seconds)


@_recorder
def rate_limited(limit: str, times: int = 1) -> None:
    _made().rate_limited.labels(limit).inc(times)


@_recorder
def database_call(seconds: float) -> None:
    _made().database_seconds.observe(seconds)


@_recorder
def channel_layer_call(operation: str, seconds: float) -> None:
    _made().channel_layer_seconds.labels(operation).observe(seconds)


@_recorder
def writes_grouped(writes: str, count: int) -> None:
    _made().writes_grouped.labels(writes).set(count)


@_recorder
def draining(now: bool) -> None:
    _made().draining.set(1 if now else 0)
