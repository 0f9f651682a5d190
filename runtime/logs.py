"""The log lines' fields: which session a line belongs to, and one JSON
object per line when the host's log collector wants them so.

A connection binds its session (``bind_session``) once the session is
open; every line logged from then on in that connection's work -- its
turns, their tools, its voice, the database calls it awaits (``db_call``
runs them in a copy of the caller's context) -- carries ``session_id`` and
``tenant_id`` as record attributes, added by the ``SessionFields`` filter
on the site's log handler. The lines keep their own words (``session
ses_...: ...``); nothing that logs needs to pass the fields itself.

``JsonFormatter`` writes a record as one JSON object on one line: ``time``
(UTC, ISO 8601), ``level``, ``logger``, ``message``, the session's fields
when it has them, and ``exception`` (the traceback, as one string) when
there is one. The site's settings choose it (``OWLLAYER_LOG_FORMAT=json``);
the default stays ``time LEVEL logger message``.

A line logged inside a turn's trace (``OWLLAYER_TRACES``, ``runtime.tracing``)
also carries its ``trace_id``, the id the collector shows the turn under; the
text lines stay as they are.
"""
from __future__ import annotations

import contextvars
import json
import logging
from datetime import UTC, datetime

from runtime import tracing

_session_id: contextvars.ContextVar[str | None] = contextvars.ContextVar("log_session_id", default=None)
_tenant_id: contextvars.ContextVar[int | None] = contextvars.ContextVar("log_tenant_id", default=None)

# The fields a session's lines carry, in the order a JSON line shows them
# (a turn's trace id last, inside a trace).
SESSION_FIELDS = ("session_id", "tenant_id", "trace_id")


def bind_session(session_id: str, tenant_id: int | None) -> None:
    """The lines logged from now on, in this task and the tasks and calls it
    starts, belong to this session."""
    _session_id.set(session_id)
    _tenant_id.set(tenant_id)


class SessionFields(logging.Filter):
    """Adds the bound session's fields to every record (None outside a
    session), and the trace's id inside a turn's trace (None outside one);
    a record that has its own (``extra=``) keeps them."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "session_id"):
            record.session_id = _session_id.get()
            record.tenant_id = _tenant_id.get()
        if not hasattr(record, "trace_id"):
            record.trace_id = tracing.current_trace_id() or None
        return True


class JsonFormatter(logging.Formatter):
    """One record, one line of JSON."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, object] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name in SESSION_FIELDS:
            value = getattr(record, name, None)
            if value is not None:
                line[name] = value
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            line["exception"] = record.exc_text
        if record.stack_info:
            line["stack"] = self.formatStack(record.stack_info)
        return json.dumps(line, ensure_ascii=False, default=str)
