"""Traces of the agent's turns, for a host's OpenTelemetry collector.

One trace per turn: ``trace("turn", ...)`` opens it (its root span), and
``span(name, ...)`` opens a child of whatever span is current -- the model's
request, a tool call, a person's approval, a webhook, a store write. Spans
follow the turn through its awaits, the tasks it starts and the database
calls it makes (``runtime.db.db_call`` runs them in a copy of its context).
``record(name, since=...)`` adds a span that already ended (a wait the turn
learned about afterwards); ``inject(headers)`` puts the current span's W3C
``traceparent`` into an outgoing request's headers; ``current_trace_id()`` is
the id the turn's log lines carry (``runtime.logs``).

With ``OWLLAYER_TRACES`` off (the default) nothing is set up, OpenTelemetry
is not even imported, ``trace``/``span`` hand back one shared object that
does nothing, and a span outside a turn's trace is likewise nothing: work
that is not a turn's (a page's frame, a sweep) makes no trace of its own.
On, spans go in batches over OTLP/HTTP to ``OTEL_EXPORTER_OTLP_ENDPOINT``'s
``/v1/traces``, as the service ``OTEL_SERVICE_NAME``; ``flush()`` sends what
is left (the serving process calls it once its connections are drained,
and the SDK once more at exit).

Attributes are the product's own small values (ids, names, counts,
outcomes); None is left out. Never arguments, results or the user's words.
"""
from __future__ import annotations

import asyncio
import functools
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any, ParamSpec, TypeVar

from runtime.config import config, derived

P = ParamSpec("P")
T = TypeVar("T")

# True once a tracer was made: until then (and always, with traces off) no
# span can be current, and nothing here looks for one.
_started = False
# The test hook's exporter (``record_in_memory``); None sends to the collector.
_memory: Any = None
_providers: list[Any] = []
_lock = threading.Lock()


def enabled() -> bool:
    return config().tracing.enabled


class _NoSpan:
    """What a span is with traces off, or outside a turn's trace."""

    __slots__ = ()

    def __enter__(self) -> _NoSpan:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def set(self, **attributes: Any) -> None:
        """Add attributes to the span (none here)."""


NO_SPAN = _NoSpan()


class Span:
    """A live span: the current one inside its ``with``."""

    __slots__ = ("_span", "_token")

    def __init__(self, span: Any) -> None:
        self._span = span
        self._token: Any = None

    def __enter__(self) -> Span:
        from opentelemetry import context, trace

        self._token = context.attach(trace.set_span_in_context(self._span))
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 _traceback: object) -> None:
        from opentelemetry import context
        from opentelemetry.trace import Status, StatusCode

        try:
            if isinstance(error, asyncio.CancelledError):
                # A barge-in or the page gone: an ending, not a failure.
                self._span.set_attribute("cancelled", True)
            elif isinstance(error, Exception):
                self._span.record_exception(error)
                self._span.set_status(Status(StatusCode.ERROR, type(error).__name__))
        finally:
            context.detach(self._token)
            self._span.end()

    def set(self, **attributes: Any) -> None:
        """Add attributes to the span (what is learned as it runs: an outcome, tokens)."""
        self._span.set_attributes(_attributes(attributes))


def trace(name: str, **attributes: Any) -> Span | _NoSpan:
    """A new trace, its root span ``name`` (a turn). Nothing with traces off."""
    if not enabled():
        return NO_SPAN
    tracer = _tracer()
    if tracer is None:
        return NO_SPAN
    from opentelemetry.context import Context

    return Span(tracer.start_span(name, context=Context(), attributes=_attributes(attributes)))


def span(name: str, **attributes: Any) -> Span | _NoSpan:
    """A child of the current span; nothing outside a trace."""
    parent = _current()
    if parent is None:
        return NO_SPAN
    tracer = _tracer()
    if tracer is None:
        return NO_SPAN
    return Span(tracer.start_span(name, attributes=_attributes(attributes)))


def record(name: str, *, since: float, **attributes: Any) -> None:
    """A child span of the current one that began at ``since``
    (``time.monotonic()``) and ends now; nothing outside a trace."""
    if _current() is None:
        return
    tracer = _tracer()
    if tracer is None:
        return
    now = time.time_ns()
    began = now - max(0, int((time.monotonic() - since) * 1e9))
    tracer.start_span(name, start_time=began, attributes=_attributes(attributes)).end(end_time=now)


def annotate(**attributes: Any) -> None:
    """Add attributes to the current span, if there is one."""
    current = _current()
    if current is not None:
        current.set_attributes(_attributes(attributes))


def traced(name: str) -> Callable[[Callable[P, Awaitable[T]]], Callable[P, Awaitable[T]]]:
    """An async function whose every call is a span ``name`` (inside a trace)."""

    def wrap(function: Callable[P, Awaitable[T]]) -> Callable[P, Awaitable[T]]:
        @functools.wraps(function)
        async def call(*args: P.args, **kwargs: P.kwargs) -> T:
            if not _started:
                return await function(*args, **kwargs)
            with span(name):
                return await function(*args, **kwargs)

        return call

    return wrap


def current_trace_id() -> str:
    """The current trace's id (32 hex digits), "" outside one."""
    current = _current()
    if current is None:
        return ""
    return format(current.get_span_context().trace_id, "032x")


def inject(headers: dict[str, str]) -> None:
    """Put the current span's ``traceparent`` (W3C Trace Context) into
    ``headers``, for the receiver's spans to join the turn's trace."""
    if _current() is None:
        return
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    TraceContextTextMapPropagator().inject(headers)


def flush(timeout_millis: int = 5000) -> None:
    """Send the spans still waiting in their batch (blocking)."""
    for provider in list(_providers):
        provider.force_flush(timeout_millis)


def record_in_memory() -> Any:
    """For tests: the spans go, one by one as they end, to the returned
    ``InMemorySpanExporter`` instead of the collector (while traces are on)."""
    global _memory
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    with _lock:
        _memory = InMemorySpanExporter()
    _tracer.cache_clear()  # type: ignore[attr-defined]
    return _memory


def _current() -> Any:
    """The current span while it records, else None (and always None until
    a tracer was made)."""
    if not _started:
        return None
    from opentelemetry import trace as api

    current = api.get_current_span()
    return current if current.is_recording() else None


def _attributes(attributes: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in attributes.items() if value is not None}


@derived
def _tracer() -> Any:
    """The process's tracer, made on first use while traces are on (again
    after the configuration changed); None while they are off."""
    global _started
    settings = config().tracing
    if not settings.enabled:
        return None
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": settings.service_name}))
    with _lock:
        memory = _memory
    if memory is not None:
        provider.add_span_processor(SimpleSpanProcessor(memory))
    else:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter(endpoint=settings.endpoint.rstrip("/") + "/v1/traces")
        provider.add_span_processor(BatchSpanProcessor(exporter))
    _providers.append(provider)
    _started = True
    return provider.get_tracer("owllayer")
