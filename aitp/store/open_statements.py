"""A session open's and close's statements, built once, not compiled per call.

Every open runs the same few statements: the key's row with its tenant (once
without a lock, once under both rows' locks), the session's insert, the
counts of the key's and the tenant's live sessions; every close one update. Through the ORM each is a query
compiled anew on every call, and that Python costs far more than the
database takes to run the statement -- on the database threads, under the
GIL the event loop needs for everyone's frames. Here each statement's text
is built once per database vendor from the models' metadata; values go in
through their model field's ``get_db_prep_save`` and rows come out through
the converters the ORM would apply, so the rows and instances are the ones
the ORM would write and build (the services calling these say what they
mean; the tests of the services pin it on both backends).

Call only from a database thread (``runtime.db``), inside the service's
transaction where it has one.
"""
from __future__ import annotations

import threading
import weakref
from datetime import datetime
from functools import cache
from typing import cast

from django.db import DEFAULT_DB_ALIAS, connection, connections
from django.db.models import DateTimeField, Model

from aitp.models import ApiKey, Session
from aitp.store import statements
from aitp.store.statements import table_of
from tenants.models import Tenant

_t = table_of  # the tables, shared with aitp.statements


# --- reading rows as the ORM would build them ------------------------------------

# The converters of each connection (each database thread has its own), per
# model: [(position, converters, column expression)] for the fields that need any.
_converters: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_converters_lock = threading.Lock()


def _converters_of(models: tuple[type[Model], ...]) -> list[tuple[int, list, object]]:
    conn = connections[DEFAULT_DB_ALIAS]  # this thread's wrapper, not the proxy
    per_connection = _converters.get(conn)
    if per_connection is None:
        with _converters_lock:
            per_connection = _converters.setdefault(conn, {})
    found = per_connection.get(models)
    if found is None:
        found = []
        position = 0
        for model in models:
            table = _t(model)
            for f in table.concrete:
                column = f.get_col(model._meta.db_table)
                convs = conn.ops.get_db_converters(column) + column.get_db_converters(conn)
                if convs:
                    found.append((position, convs, column))
                position += 1
        per_connection[models] = found
    return found


def _converted(models: tuple[type[Model], ...], row) -> list:
    values = list(row)
    for position, convs, column in _converters_of(models):
        value = values[position]
        for convert in convs:
            value = convert(value, column, connection)
        values[position] = value
    return values


def _instance(model: type[Model], values: list) -> Model:
    return model.from_db(connection.alias, None, values)


# --- the key ---------------------------------------------------------------------


@cache
def _key_sql(vendor: str, for_update: bool) -> str:
    key, tenant = _t(ApiKey), _t(Tenant)
    sql = (
        f"SELECT {key.select}, {tenant.select} FROM {key.name} "
        f"INNER JOIN {tenant.name} ON ({key.qualified['tenant']} = {tenant.qualified['id']}) "
        f"WHERE {key.qualified['prefix']} = %s"
    )
    if for_update and connection.features.has_select_for_update:
        # As select_for_update(no_key=True, of=("self", "tenant")): the key's
        # row for its cap, the tenant's for its ceiling (opens of the
        # tenant's other keys count against it too).
        sql += " " + connection.ops.for_update_sql(
            no_key=connection.features.has_select_for_no_key_update,
            of=(key.name, tenant.name) if connection.features.has_select_for_update_of else (),
        )
    return sql


_KEY_AND_TENANT = (ApiKey, Tenant)


def key_with_tenant(prefix: str, *, for_update: bool = False) -> ApiKey | None:
    """The key row of this lookup prefix with its tenant (``key.tenant`` set),
    or None. ``for_update`` locks the key's and the tenant's rows (FOR NO KEY
    UPDATE OF both on PostgreSQL; SQLite's transaction holds the write lock
    already)."""
    with connection.cursor() as cursor:
        cursor.execute(_key_sql(connection.vendor, for_update), [prefix])
        row = cursor.fetchone()
    return None if row is None else _key_from_row(row)


def _key_from_row(row) -> ApiKey:
    """A row of ``_key_sql`` as the key with its tenant set."""
    values = _converted(_KEY_AND_TENANT, row)
    split = len(_t(ApiKey).concrete)
    key = _instance(ApiKey, values[:split])
    ApiKey._meta.get_field("tenant").set_cached_value(key, _instance(Tenant, values[split:]))
    return cast(ApiKey, key)


# --- the session -----------------------------------------------------------------


@cache
def _insert_sql(vendor: str) -> str:
    table = _t(Session)
    columns = ", ".join(table.column[f.name] for f in table.concrete)
    marks = ", ".join(["%s"] * len(table.concrete))
    return f"INSERT INTO {table.name} ({columns}) VALUES ({marks})"


def session_insert(session: Session) -> None:
    """Insert a new session row (its primary key set by the caller), as
    ``save(force_insert=True)`` would; the instance is then saved."""
    with connection.cursor() as cursor:
        cursor.execute(_insert_sql(connection.vendor), _insert_params(session))
    _saved(session)


def _insert_params(session: Session) -> list:
    """The insert's values as the ORM sends them; a field still at its
    constant default sends the value prepared once (most of a new row's)."""
    defaults = _prepared_defaults(connection.vendor)
    params: list = []
    # A new row's times are one value: prepared once (the last time field's value, and what was sent).
    before: tuple = (None, None)
    for f in _t(Session).concrete:
        value = f.pre_save(session, True)
        default = defaults.get(f.name)
        if default is not None and type(value) is type(default[0]) and value == default[0]:
            params.append(default[1])
            continue
        if value is before[0] and type(f) is DateTimeField:
            params.append(before[1])
            continue
        prepared = f.get_db_prep_save(value, connection)
        params.append(prepared)
        if type(f) is DateTimeField:
            before = (value, prepared)
    return params


@cache
def _prepared_defaults(vendor: str) -> dict[str, tuple[object, object]]:
    """Per field of a session row with a constant default (a value, or an
    empty dict or list; not a time): that value and what the ORM sends for it."""
    found = {}
    for f in _t(Session).concrete:
        if callable(f.default) and f.default not in (dict, list):
            continue
        value = f.get_default()
        found[f.name] = (value, f.get_db_prep_save(value, connection))
    return found


def _saved(session: Session) -> None:
    session._state.adding = False
    session._state.db = connection.alias


# --- the admission's reads, in one query (where statements.one_query_transactions) -------


@cache
def _admit_sql(vendor: str) -> str:
    # The insert, the key's and tenant's row locks with their rows, and the
    # live sessions of each counted after the lock was taken (a statement of
    # its own: it sees every open committed before). The rule that decides
    # is ``aitp.store.admission.refusal``, in Python.
    return ";\n".join((
        _insert_sql(vendor),
        _key_sql(vendor, True),
        f"SELECT ({_live_count_sql(vendor)}), ({_tenant_live_count_sql(vendor)})",
    ))


def session_admit_reads(session: Session, *, prefix: str,
                        seen_since: datetime) -> tuple[ApiKey | None, int, int]:
    """Insert the session row, lock its key's and its tenant's rows and read
    them again, and count the live sessions of the key and of the tenant
    (seen since ``seen_since``, this one included) -- in one query, so one
    round trip and one transaction: opens of one key queue on the lock for
    the time the database takes, not for round trips and the GIL in between.
    The statements run one after the other, each with a fresh view, so the
    counts see every session committed before the lock was taken.

    Returns the key as read under the lock (with its tenant; None when it is
    gone) and the two counts. The row stays: the caller takes it back out
    when the admission refuses it."""
    table = _t(Session)
    params = _insert_params(session)
    params += [prefix]
    params += [table.prep("api_key", session.api_key_id), table.prep("last_seen_at", seen_since),
               table.prep("tenant", session.tenant_id), table.prep("last_seen_at", seen_since)]
    with connection.cursor() as cursor:
        cursor.execute(_admit_sql(connection.vendor), params)
        cursor.nextset()
        row = cursor.fetchone()
        cursor.nextset()
        key_live, tenant_live = cursor.fetchone()
    _saved(session)
    return (None if row is None else _key_from_row(row)), key_live, tenant_live


@cache
def _live_count_sql(vendor: str) -> str:
    table = _t(Session)
    return (
        f"SELECT COUNT(*) FROM {table.name} WHERE {table.column['api_key']} = %s "
        f"AND {table.column['ended_at']} IS NULL AND {table.column['last_seen_at']} >= %s"
    )


def live_session_count(key_id: int, *, seen_since: datetime) -> int:
    """The key's open sessions seen since then (``admission.live_sessions_filter``)."""
    table = _t(Session)
    with connection.cursor() as cursor:
        cursor.execute(_live_count_sql(connection.vendor),
                       [table.prep("api_key", key_id), table.prep("last_seen_at", seen_since)])
        return cursor.fetchone()[0]


@cache
def _tenant_live_count_sql(vendor: str) -> str:
    table = _t(Session)
    return (
        f"SELECT COUNT(*) FROM {table.name} WHERE {table.column['tenant']} = %s "
        f"AND {table.column['ended_at']} IS NULL AND {table.column['last_seen_at']} >= %s"
    )


def tenant_live_session_count(tenant_id: int, *, seen_since: datetime) -> int:
    """The tenant's open sessions (over all its keys) seen since then."""
    table = _t(Session)
    with connection.cursor() as cursor:
        cursor.execute(_tenant_live_count_sql(connection.vendor),
                       [table.prep("tenant", tenant_id), table.prep("last_seen_at", seen_since)])
        return cursor.fetchone()[0]


@cache
def _end_sql(vendor: str) -> str:
    table = _t(Session)
    sets = ", ".join(f"{table.column[name]} = %s" for name in _END_FIELDS)
    return (f"UPDATE {table.name} SET {sets} WHERE {table.column['id']} = %s "
            f"AND {table.column['ended_at']} IS NULL")


_END_FIELDS = ("ended_at", "close_code", "close_reason", "state", "last_seen_at")


def end_fields(*, now: datetime, code: int | None, reason: str, state: str) -> dict:
    """The fields that end a session row, by name."""
    return {"ended_at": now, "close_code": code, "close_reason": reason, "state": state,
            "last_seen_at": now}


def session_end(session_id: str, *, now: datetime, code: int | None, reason: str,
                state: str) -> int | None:
    """Close the session row if it is still open; returns how many rows closed
    (None inside a ``statements.together`` block, where it goes with the rest)."""
    table = _t(Session)
    values = end_fields(now=now, code=code, reason=reason, state=state)
    params = [table.prep(name, values[name]) for name in _END_FIELDS]
    params.append(table.prep("id", session_id))
    return statements.execute(_end_sql(connection.vendor), params)
