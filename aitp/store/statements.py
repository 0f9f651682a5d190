"""The turn's writes as statements built once, not compiled on every call.

Every turn writes the same few rows: its conversation messages, the ledger
rows of its tool calls, their progress and outcome, its usage on the session
row. Through the ORM each of those is a query compiled anew on every call,
and the Python that compiling takes costs far more than the database takes
to run the statement -- on the database threads, under the GIL the event
loop needs for everyone's frames. Here each statement's SQL text is built
once per database vendor from the models' metadata, and every value goes
through its model field's own ``get_db_prep_save``: the rows are the ones
the ORM would write (the services that call these say what they mean; the
tests of the services pin it on both backends).

Call only from a database thread (``runtime.db``), inside the service's
transaction (``together``) where it has one.
"""
from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from datetime import datetime
from functools import cache

from django.db import connection, transaction
from django.db.models import Model
from django.db.models.constants import OnConflict
from psycopg.adapt import Transformer
from psycopg.types.json import Jsonb

from aitp.models import ConversationMessage, Session, ToolCall, TurnRecord


class _Table:
    """A model's table and columns, quoted for one database vendor (also
    ``aitp.open_statements``' reads: columns qualified by the table, and the
    select list of every column in field order)."""

    def __init__(self, model: type[Model], vendor: str) -> None:
        quote = connection.ops.quote_name
        self.vendor = vendor
        self.name = quote(model._meta.db_table)
        self.concrete = list(model._meta.concrete_fields)
        self.fields = {f.name: f for f in self.concrete}
        self.column = {f.name: quote(f.column) for f in self.concrete}
        self.qualified = {f.name: f"{self.name}.{quote(f.column)}" for f in self.concrete}
        self.select = ", ".join(self.qualified[f.name] for f in self.concrete)

    def prep(self, name: str, value):
        """A value as the ORM would send it for this field (a ``JsonText``
        as the JSON it already is)."""
        if type(value) is JsonText:
            return _json_parameter(value)
        return self.fields[name].get_db_prep_save(value, connection)


class JsonText(str):
    """A JSON field's value written as JSON text already: sent as it is,
    not serialized again (``_Table.prep``)."""

    __slots__ = ()


def _json_parameter(text: JsonText):
    if connection.vendor == "postgresql":
        return Jsonb(text, dumps=str)  # what the ORM sends, with the text as written
    return str(text)


@cache
def _table(model: type[Model], vendor: str) -> _Table:
    return _Table(model, vendor)


def table_of(model: type[Model]) -> _Table:
    """The model's table for this thread's database connection."""
    return _table(model, connection.vendor)


_t = table_of


# The statements of this thread's ``together`` block, when they go as one.
_pending = threading.local()


def one_query_transactions() -> bool:
    """Whether this connection's database runs the statements of one query
    string as one transaction, so a transaction can be one round trip:
    PostgreSQL (with the client-side binding Django uses for psycopg)."""
    return connection.vendor == "postgresql"


@contextmanager
def together() -> Iterator[None]:
    """The statements of this module run inside go to the database as one
    transaction: all of them or none.

    On PostgreSQL, outside any other transaction, they are sent when the
    block ends, joined into one query: PostgreSQL runs the statements of one
    query string as one transaction, so the block costs a single round trip
    instead of BEGIN, one per statement, and COMMIT. Each of those waits for
    the database and then for the GIL, which the event loop and the other
    database threads hold most of the time. The connection binds parameters
    on the client (Django's default for psycopg), which is what lets one
    query carry several statements. What a block reads (through the ORM)
    runs at once and does not see the block's own writes; an error inside
    the block sends nothing.

    Elsewhere (SQLite, in-process; or inside a transaction already) the block
    is ``transaction.atomic()`` and each statement runs when it is called. A
    block inside another one is part of it.
    """
    if _batch() is not None:
        yield
        return
    if not one_query_transactions() or connection.in_atomic_block:
        with transaction.atomic():
            yield
        return
    batch: list[tuple[str, Sequence]] = []
    _pending.batch = batch
    try:
        yield
    finally:
        _pending.batch = None
    if batch:
        with connection.cursor() as cursor:
            bound = _bound(batch)
            if bound is not None:
                cursor.execute(bound)
            else:
                cursor.execute(";\n".join(sql for sql, _ in batch),
                               [value for _, params in batch for value in params])


# --- binding a block's statements here --------------------------------------------
#
# psycopg binds on the client by parsing the query for its placeholders, and
# caches that parse only for queries up to 4 KiB: a block of many sessions'
# statements is parsed anew every time, in Python, placeholder by
# placeholder (at 200 busy sessions most of the database threads' time).
# Every statement here is one of a few texts built once: each is split at
# its placeholders once, and a block is the parts joined with each value as
# the literal psycopg makes of it (the same ``as_literal`` its client-side
# binding uses), sent as a query without parameters (it holds no other
# ``%``, so nothing in it is taken for a placeholder).


@cache
def _parts(sql: str) -> tuple[bytes, ...] | None:
    """The statement's text around its ``%s`` placeholders; None when it holds
    any other ``%`` (left to psycopg)."""
    parts = sql.split("%s")
    if any("%" in part for part in parts):
        return None
    return tuple(part.encode() for part in parts)


def _bound(batch: list[tuple[str, Sequence]]) -> str | None:
    """The block as one query with its values in it, or None (psycopg binds)."""
    transformer = Transformer(connection.connection)
    literal = transformer.as_literal
    out: list[bytes] = []
    for number, (sql, params) in enumerate(batch):
        parts = _parts(sql)
        if parts is None or len(parts) != len(params) + 1:
            return None
        if number:
            out.append(b";\n")
        out.append(parts[0])
        for value, part in zip(params, parts[1:], strict=True):
            out.append(b"NULL" if value is None else literal(value))
            out.append(part)
    # Text, as Django's cursor (and whatever wraps it) expects a query to be.
    return b"".join(out).decode()


def _batch() -> list | None:
    return getattr(_pending, "batch", None)


def execute(sql: str, params: Sequence) -> int | None:
    """Run one statement and return its row count; inside a ``together``
    block that sends its statements at the end, queue it and return None."""
    batch = _batch()
    if batch is not None:
        batch.append((sql, params))
        return None
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.rowcount


# --- inserts that skip rows already there (idempotent checkpoints) -------------


@cache
def _insert_ignoring_sql(model: type[Model], vendor: str, names: tuple[str, ...], rows: int) -> str:
    table = _table(model, vendor)
    ops = connection.ops
    columns = ", ".join(table.column[name] for name in names)
    row = "(" + ", ".join(["%s"] * len(names)) + ")"
    suffix = ops.on_conflict_suffix_sql(
        [table.fields[name] for name in names], OnConflict.IGNORE, None, None
    )
    return " ".join(filter(None, (
        ops.insert_statement(on_conflict=OnConflict.IGNORE), table.name, f"({columns})",
        "VALUES", ", ".join([row] * rows), suffix,
    )))


def _insert_ignoring(model: type[Model], names: tuple[str, ...], rows: list[tuple]) -> None:
    if not rows:
        return
    table = _t(model)
    sql = _insert_ignoring_sql(model, connection.vendor, names, len(rows))
    execute(sql, [table.prep(name, value) for row in rows for name, value in zip(names, row, strict=True)])


MESSAGE_COLUMNS = ("session", "seq", "turn", "role", "content", "created_at")


def messages_insert(*, session_id: str, turn: int, messages: Iterable[dict], now: datetime) -> None:
    """Conversation messages ({seq, role, content}); a seq already stored is left alone."""
    _insert_ignoring(ConversationMessage, MESSAGE_COLUMNS, [
        (session_id, m["seq"], turn, m["role"], m["content"], now) for m in messages
    ])


TURN_COLUMNS = (
    "session", "number", "started_at", "ended_at", "outcome", "error_code", "first_text_ms",
    "model_ms", "tools_ms", "approval_ms", "input_tokens", "output_tokens", "cache_read_tokens",
    "cache_write_tokens", "cost_micros", "model", "trace_id",
)


def turn_insert(*, session_id: str, fields: dict, now: datetime) -> None:
    """A turn's record (``TurnRecord``); a turn already recorded is left alone."""
    row = {"error_code": "", "trace_id": "", "model": "", **fields, "session": session_id, "ended_at": now}
    _insert_ignoring(TurnRecord, TURN_COLUMNS, [tuple(row.get(name) for name in TURN_COLUMNS)])


CALL_COLUMNS = (
    "session", "call_id", "tool_use_id", "turn", "name", "arguments", "risk", "origin",
    "status", "result", "error", "created_at",
)


def calls_insert(*, session_id: str, turn: int, calls: Iterable[dict], now: datetime) -> None:
    """Ledger rows of calls about to run, 'pending'; a call_id already recorded is left alone."""
    _insert_ignoring(ToolCall, CALL_COLUMNS, [
        (
            session_id, call["call_id"], call["tool_use_id"], turn, call["name"][:64],
            call["arguments"], call.get("risk", "none"), call.get("origin", ToolCall.Origin.CLIENT),
            ToolCall.Status.PENDING.value, None, "", call.get("created_at") or now,
        )
        for call in calls
    ])


# --- updates --------------------------------------------------------------------


@cache
def _usage_add_sql(vendor: str, names: tuple[str, ...]) -> str:
    table = _table(Session, vendor)
    adds = ", ".join(f"{table.column[n]} = {table.column[n]} + %s" for n in names)
    return (f"UPDATE {table.name} SET {adds}, {table.column['last_activity_at']} = %s "
            f"WHERE {table.column['id']} = %s")


def session_usage_add(*, session_id: str, now: datetime, amounts: dict[str, int]) -> None:
    """Add to the session row's counters (tokens, turns, audio) and touch its last activity."""
    names = tuple(sorted(amounts))
    table = _t(Session)
    execute(_usage_add_sql(connection.vendor, names),
             [*(int(amounts[n]) for n in names), table.prep("last_activity_at", now), session_id])


@cache
def _call_mark_sql(vendor: str, sources: tuple[str, ...], sent: bool, risk: bool,
                   origin: bool) -> str:
    table = _table(ToolCall, vendor)
    status = table.column["status"]
    sets = [f"{status} = CASE WHEN {status} IN ({', '.join(['%s'] * len(sources))}) "
            f"THEN %s ELSE {status} END"]
    sets += [f"{table.column[name]} = %s"
             for name, wanted in (("sent_at", sent), ("risk", risk), ("origin", origin)) if wanted]
    return f"UPDATE {table.name} SET {', '.join(sets)} WHERE {table.column['call_id']} = %s"


def call_mark(*, call_id: str, status: str, sources: Iterable[str], sent_at: datetime | None,
              risk: str | None, origin: str | None) -> None:
    """Move a call to ``status`` if it is in one of ``sources``; set sent_at/risk/origin given."""
    sources = tuple(sources)
    table = _t(ToolCall)
    sql = _call_mark_sql(connection.vendor, sources, sent_at is not None, risk is not None,
                         origin is not None)
    params: list = [*sources, status]
    if sent_at is not None:
        params.append(table.prep("sent_at", sent_at))
    params += [value for value in (risk, origin) if value is not None]
    execute(sql, [*params, call_id])


@cache
def _call_finish_sql(vendor: str, finals: tuple[str, ...], risk: bool, origin: bool,
                     sent: bool) -> str:
    table = _table(ToolCall, vendor)
    names = ["status", "result", "error", "finished_at", "duration_ms"]
    names += [name for name, wanted in (("risk", risk), ("origin", origin)) if wanted]
    sets = [f"{table.column[name]} = %s" for name in names]
    if sent:
        sent_at = table.column["sent_at"]
        sets.append(f"{sent_at} = COALESCE({sent_at}, %s)")
    return (f"UPDATE {table.name} SET {', '.join(sets)} WHERE {table.column['call_id']} = %s "
            f"AND NOT ({table.column['status']} IN ({', '.join(['%s'] * len(finals))}))")


def call_finish(*, call_id: str, status: str, result, error: str, finished_at: datetime,
                duration_ms: int, risk: str | None, origin: str | None,
                finals: Iterable[str], sent_at: datetime | None = None) -> int | None:
    """Write a call's final outcome unless its status is already one of
    ``finals``; ``sent_at`` fills the time it was sent if none is recorded.
    Returns the rows changed (None inside a ``together`` block)."""
    finals = tuple(finals)
    table = _t(ToolCall)
    params = [status, table.prep("result", result), error, table.prep("finished_at", finished_at),
              duration_ms]
    params += [value for value in (risk, origin) if value is not None]
    if sent_at is not None:
        params.append(table.prep("sent_at", sent_at))
    sql = _call_finish_sql(connection.vendor, finals, risk is not None, origin is not None,
                           sent_at is not None)
    return execute(sql, [*params, call_id, *finals])


@cache
def _session_live_sql(vendor: str, names: tuple[str, ...]) -> str:
    table = _table(Session, vendor)
    sets = ", ".join(f"{table.column[name]} = %s" for name in names)
    return (f"UPDATE {table.name} SET {sets} WHERE {table.column['id']} = %s "
            f"AND {table.column['ended_at']} IS NULL")


def session_live_update(*, session_id: str, fields: dict) -> int | None:
    """Set these fields of a session row that is still open (rows changed;
    None inside a ``together`` block)."""
    names = tuple(sorted(fields))
    table = _t(Session)
    return execute(_session_live_sql(connection.vendor, names),
                    [*(table.prep(name, fields[name]) for name in names), session_id])


@cache
def _session_live_visits_sql(vendor: str, names: tuple[str, ...], visits: int) -> str:
    """The UPDATE of ``session_live_visits``: ``names`` set, ``visits`` visits
    appended to the page history and the history trimmed to its last
    entries, in the database. Its parameters: the names' values; on
    PostgreSQL the visits (one array) and the number kept, on SQLite the
    number kept (twice) and each visit; the session id."""
    table = _table(Session, vendor)
    history = table.column["page_history"]
    sets = [f"{table.column[name]} = %s" for name in names]
    if vendor == "postgresql":
        # The visits as one array; the kept entries in order of their position.
        sets.append(
            f"{history} = (SELECT COALESCE(jsonb_agg(kept.visit ORDER BY kept.n), '[]'::jsonb) FROM "
            f"(SELECT visit, n FROM jsonb_array_elements(COALESCE({history}, '[]'::jsonb) || %s::jsonb) "
            f"WITH ORDINALITY AS listed(visit, n) ORDER BY n DESC LIMIT %s) AS kept)"
        )
    else:
        # SQLite's JSON functions: each visit appended at the end ('$[#]'),
        # and only past the limit the entries from the first one kept on.
        appended = ", ".join(["'$[#]', json(%s)"] * visits)
        sets.append(
            f"{history} = (SELECT CASE WHEN json_array_length(new.v) <= %s THEN new.v ELSE "
            f"(SELECT json_group_array(json(entry.value)) FROM json_each(new.v) AS entry "
            f"WHERE entry.key >= json_array_length(new.v) - %s) END "
            f"FROM (SELECT json_insert(COALESCE({history}, '[]'), {appended}) AS v) AS new)"
        )
    return (f"UPDATE {table.name} SET {', '.join(sets)} WHERE {table.column['id']} = %s "
            f"AND {table.column['ended_at']} IS NULL")


# The visits one SQLite statement appends at most (one statement text per
# count): more go in several statements.
_VISITS_PER_STATEMENT = 8


def session_live_visits(*, session_id: str, fields: dict, visits: list[dict], keep: int) -> None:
    """``session_live_update`` that also appends these visits to the row's
    page history, keeping its last ``keep`` entries: appended and trimmed
    by the database, in one statement (on SQLite, one per
    ``_VISITS_PER_STATEMENT`` visits, in one transaction)."""
    table = _t(Session)
    vendor = connection.vendor
    if vendor == "postgresql":
        names = tuple(sorted(fields))
        execute(_session_live_visits_sql(vendor, names, 1), [
            *(table.prep(name, fields[name]) for name in names),
            table.prep("page_history", list(visits)), keep, session_id,
        ])
        return
    chunks = [visits[start:start + _VISITS_PER_STATEMENT]
              for start in range(0, len(visits), _VISITS_PER_STATEMENT)]
    with transaction.atomic() if len(chunks) > 1 else nullcontext():
        for number, chunk in enumerate(chunks):
            names = tuple(sorted(fields)) if number == 0 else ()
            execute(_session_live_visits_sql(vendor, names, len(chunk)), [
                *(table.prep(name, fields[name]) for name in names),
                keep, keep, *(table.prep("page_history", visit) for visit in chunk), session_id,
            ])


