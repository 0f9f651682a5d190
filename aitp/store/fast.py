"""The session store the server runs: the plain store's promises
(``aitp.store.port``), at the cost of fewer round trips and less Python.

- Statements built once per database (``statements``, ``open_statements``)
  instead of a query compiled per call on the database threads, under the
  GIL the event loop needs.
- Several sessions' writes in one transaction (``statements.together``:
  one query on PostgreSQL); a group the database refuses is written one by
  one, so only the write that fails fails.
- A session open on PostgreSQL is one query: the insert, the key's and the
  tenant's row locks, their rows read again and the live sessions counted
  (``open_statements.session_admit_reads``); the rule
  (``admission.refusal``) then decides, and a refusal takes the row back
  out. A key read for an open serves the next second's opens of that key.
- The tenant's day (``DailyUsage``), a row every session of a tenant
  shares, is written behind (``usage.UsageBuffer``).
"""
from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from datetime import date, datetime

from django.db import transaction
from django.utils import timezone

from aitp import calls
from aitp.calls import CallStatus
from aitp.models import ApiKey, Session, ToolCall
from aitp.store import admission, keys, open_statements, port, resuming, statements, usage
from aitp.store.admission import Refusal
from aitp.store.port import (
    HandshakeInfo,
    Outcomes,
    end_fields,
    live_fields,
    new_session,
    not_counted,
    turn_record_fields,
)

logger = logging.getLogger(__name__)

_FINAL_STATUSES = tuple(sorted(str(s) for s in ToolCall.FINAL_STATUSES))


@functools.cache
def _mark_sources(status: str) -> tuple[str, ...]:
    return tuple(sorted(s.value for s in calls.sources(status)))


class FastStore:
    # --- the open ---------------------------------------------------------------

    def session_open(self, *, raw_key: str, info: HandshakeInfo) -> tuple[Session | None, Refusal | None]:
        """The key is read and checked without a lock first (a bad key costs no
        transaction; a key read for an open less than
        ``keys.KEY_READ_FRESH_FOR`` seconds ago is not read again), then
        admitted: in one query on PostgreSQL, in one transaction elsewhere."""
        now = timezone.now()
        key = keys.key_for_open(raw_key)
        refusal = admission.api_key_refusal(key, origin=info.origin, preview_key_id=info.preview_key_id, now=now)
        if refusal is not None:
            return None, refusal
        if statements.one_query_transactions():
            return self._open_in_one_query(key, raw_key, info, now)
        return self._open_locked(key, raw_key, info, now)

    session_resume = staticmethod(resuming.session_resume)

    def remembered_key_id(self, raw_key: str) -> int | None:
        return keys.remembered_key_id(raw_key)

    def _open_in_one_query(self, key: ApiKey, raw_key: str, info: HandshakeInfo,
                           now: datetime) -> tuple[Session | None, Refusal | None]:
        session = new_session(key, info, now)
        locked, key_live, tenant_live = open_statements.session_admit_reads(
            session, prefix=raw_key[:keys.LOOKUP_PREFIX_LENGTH],
            seen_since=admission.stale_before(now))
        if not keys.matches(locked, raw_key):
            locked = None
        refusal = admission.refusal(locked, origin=info.origin, preview_key_id=info.preview_key_id, now=now,
                                    key_live=lambda: key_live, tenant_live=lambda: tenant_live)
        if refusal is not None:
            Session.objects.filter(pk=session.pk).delete()
            return None, refusal
        return self._opened(session, locked, now), None

    def _open_locked(self, key: ApiKey, raw_key: str, info: HandshakeInfo,
                     now: datetime) -> tuple[Session | None, Refusal | None]:
        """The open in one transaction of several statements: the row
        inserted, then the key's and tenant's rows locked and read again
        (FOR NO KEY UPDATE: the rows other opens insert hold a KEY SHARE lock
        on them until they commit; a FOR UPDATE would wait for them)."""
        seen_since = admission.stale_before(now)
        with transaction.atomic():
            session = new_session(key, info, now)
            open_statements.session_insert(session)
            locked = keys.api_key_lookup(raw_key, for_update=True)
            refusal = admission.refusal(
                locked, origin=info.origin, preview_key_id=info.preview_key_id, now=now,
                key_live=lambda: open_statements.live_session_count(locked.pk, seen_since=seen_since),
                tenant_live=lambda: open_statements.tenant_live_session_count(
                    locked.tenant_id, seen_since=seen_since))
            if refusal is not None:
                transaction.set_rollback(True)
                return None, refusal
            if admission.key_use_stale(locked, now):
                ApiKey.objects.filter(pk=locked.pk).update(last_used_at=now)
        session.tenant = locked.tenant  # as read under the lock: its prompt as it is now
        usage.usage_count(locked.tenant_id, now, sessions=1)
        return session, None

    def _opened(self, session: Session, locked: ApiKey, now: datetime) -> Session:
        if admission.key_use_stale(locked, now):
            ApiKey.objects.filter(pk=locked.pk).update(last_used_at=now)
        session.tenant = locked.tenant  # as read under the lock: its prompt as it is now
        usage.usage_count(locked.tenant_id, now, sessions=1)
        return session

    # --- the live row and its close -----------------------------------------------

    def session_write_live(self, *, session_id: str, snapshot: dict | None = None,
                           state: str | None = None, visits: list[dict] = (),
                           ending: dict | None = None) -> None:
        fields = live_fields(now=timezone.now(), snapshot=snapshot, state=state, ending=ending)
        if visits:
            statements.session_live_visits(session_id=session_id, fields=fields,
                                           visits=list(visits), keep=port.PAGE_HISTORY_LIMIT)
        else:
            statements.session_live_update(session_id=session_id, fields=fields)

    def sessions_write_live(self, writes: list[dict]) -> Outcomes:
        return _together_or_alone(writes, lambda write: self.session_write_live(**write))

    def session_close(self, *, session_id: str, code: int | None, reason: str = "",
                      live: dict | None = None) -> None:
        now = timezone.now()
        ending = end_fields(now=now, code=code, reason=reason)
        if live is None:
            open_statements.session_end(session_id, now=now, code=code,
                                        reason=ending["close_reason"], state=ending["state"])
            return
        self.session_write_live(session_id=session_id, **live, ending=ending)

    def sessions_close(self, closes: list[dict]) -> Outcomes:
        return _together_or_alone(closes, lambda close: self.session_close(**close),
                                  alone=self._session_close_alone)

    def _session_close_alone(self, close: dict) -> None:
        try:
            self.session_close(**close)
        except Exception as exc:
            if close.get("live") is None:
                raise
            logger.warning("session %s: its last page snapshot could not be written (%s); "
                           "closing the row without it", close["session_id"], type(exc).__name__)
            self.session_close(**{**close, "live": None})

    # --- the turn's writes -----------------------------------------------------------

    def turn_checkpoint(self, *, session_id: str, tenant_id: int, turn: int, messages: list[dict],
                        calls: list[dict] = (), usage: dict | None = None,
                        finished: list[dict] = (), counted: dict | None = None,
                        figures: dict | None = None) -> None:
        """In one transaction (``statements.together``: one round trip on
        PostgreSQL); the usage counted in the tenant's day once it committed."""
        now = timezone.now()
        with statements.together():
            self._checkpoint_statements(session_id=session_id, turn=turn, messages=messages,
                                        calls=calls, usage=usage, finished=finished,
                                        figures=figures, now=now)
        if usage is not None:
            _count(tenant_id, now, usage, counted)

    def turn_checkpoints(self, checkpoints: list[dict]) -> Outcomes:
        now = timezone.now()

        def statements_of(checkpoint: dict) -> None:
            self._checkpoint_statements(**{k: v for k, v in checkpoint.items()
                                           if k not in ("tenant_id", "counted")}, now=now)

        def count_usage(checkpoint: dict) -> None:
            if checkpoint.get("usage") is not None:
                _count(checkpoint["tenant_id"], now, checkpoint["usage"], checkpoint.get("counted"))

        return _together_or_alone(checkpoints, statements_of,
                                  alone=lambda checkpoint: self.turn_checkpoint(**checkpoint),
                                  committed=count_usage)

    def _checkpoint_statements(self, *, session_id: str, turn: int, messages: list[dict],
                               calls: list[dict] = (), usage: dict | None = None,
                               finished: list[dict] = (), figures: dict | None = None,
                               now: datetime) -> None:
        for outcome in finished:
            self.tool_call_finish(**outcome, now=now)
        if messages:
            statements.messages_insert(session_id=session_id, turn=turn, messages=messages, now=now)
        if calls:
            statements.calls_insert(session_id=session_id, turn=turn, calls=calls, now=now)
        if usage is not None:
            statements.session_usage_add(session_id=session_id, now=now, amounts=usage)
        if figures is not None:
            statements.turn_insert(session_id=session_id, fields=turn_record_fields(figures, usage), now=now)

    def tool_calls_record(self, *, session_id: str, turn: int, calls: list[dict]) -> None:
        statements.calls_insert(session_id=session_id, turn=turn, calls=calls, now=timezone.now())

    def tool_call_mark(self, *, call_id: str, status: str, sent: bool = False,
                       risk: str | None = None, origin: str | None = None) -> None:
        status = CallStatus(status).value
        statements.call_mark(
            call_id=call_id, status=status, sources=_mark_sources(status),
            sent_at=timezone.now() if sent else None, risk=risk, origin=origin,
        )

    def tool_call_marks(self, marks: list[dict]) -> Outcomes:
        return _together_or_alone(marks, lambda mark: self.tool_call_mark(**mark))

    def tool_call_finish(self, *, call_id: str, status: str, result=None, error: str = "",
                         risk: str | None = None, origin: str | None = None,
                         created_at: datetime | None = None, sent_at: datetime | None = None,
                         now: datetime | None = None) -> None:
        """``created_at``, when the caller recorded the row with it, saves a
        read; ``sent_at`` is kept as the time it was sent unless its mark
        wrote one."""
        now = now or timezone.now()
        if created_at is None:
            call = ToolCall.objects.filter(call_id=call_id).only("created_at", "status").first()
            if call is None or call.status in ToolCall.FINAL_STATUSES:
                return
            created_at = call.created_at
        statements.call_finish(
            call_id=call_id, status=status, result=result, error=error[:4000], finished_at=now,
            duration_ms=max(0, int((now - created_at).total_seconds() * 1000)), risk=risk,
            origin=origin, sent_at=sent_at, finals=_FINAL_STATUSES,
        )

    def tool_calls_finish(self, finished: list[dict]) -> None:
        with statements.together():
            for outcome in finished:
                self.tool_call_finish(**outcome)

    # --- the tenant's day, written behind --------------------------------------------

    def usage_flush(self) -> int:
        return usage.usage_flush()

    def usage_flush_logged(self) -> int:
        return usage.usage_flush_logged()

    def usage_pending(self) -> dict[tuple[int, date], dict[str, int]]:
        return usage.usage_pending()


def _count(tenant_id: int, now: datetime, amounts: dict, counted: dict | None) -> None:
    usage.usage_count(tenant_id, now, **not_counted(amounts, counted))


def _together_or_alone(
    writes: list[dict], write: Callable[[dict], None], *,
    alone: Callable[[dict], None] | None = None, committed: Callable[[dict], None] | None = None,
) -> Outcomes:
    """The writes of several sessions (``runtime.group_write``) in one
    transaction, ``statements.together``: one query on PostgreSQL. For each,
    None or what it raised: when the database refuses them together (a value
    of one session it cannot store), each is written alone (``alone``, or
    ``write`` in a transaction of its own), so only that one fails.
    ``committed`` runs for each once its transaction committed."""
    alone = alone or write
    if len(writes) > 1:
        try:
            with statements.together():
                for each in writes:
                    write(each)
        except Exception:
            pass  # rolled back whole: find the one that fails, alone
        else:
            if committed is not None:
                for each in writes:
                    committed(each)
            return [None] * len(writes)
    return port.each_alone(writes, alone)
