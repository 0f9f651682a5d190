"""The session store in plain Django: the ORM, one transaction per unit of
work, the tenant's day counted at once. It keeps every promise of
``aitp.store.port`` (the contract tests run it beside the fast store): read
it to learn what a write does, then ``aitp.store.fast`` for how the server
makes it cheap."""
from __future__ import annotations

import json
from datetime import date, datetime

from django.db import transaction
from django.db.models import Case, DateTimeField, F, Value, When
from django.db.models.functions import Coalesce
from django.utils import timezone

from aitp import calls
from aitp.calls import CallStatus
from aitp.models import ApiKey, ConversationMessage, Session, ToolCall, TurnRecord
from aitp.store import admission, keys, port, resuming, usage
from aitp.store.admission import Refusal
from aitp.store.port import (
    HandshakeInfo,
    Outcomes,
    each_alone,
    end_fields,
    live_fields,
    new_session,
    not_counted,
    turn_record_fields,
)


def _key_read(prefix: str, *, for_update: bool = False) -> ApiKey | None:
    """The key of a lookup prefix with its tenant; locked (FOR NO KEY UPDATE
    of both rows) ``for_update``."""
    rows = ApiKey.objects.select_related("tenant")
    if for_update:
        rows = rows.select_for_update(no_key=True, of=("self", "tenant"))
    return rows.filter(prefix=prefix).first()


def _stored(value):
    """A JSON value as the ORM stores it (JSON text written already is parsed)."""
    return json.loads(value) if isinstance(value, str) else value


class PlainStore:
    def session_open(self, *, raw_key: str, info: HandshakeInfo) -> tuple[Session | None, Refusal | None]:
        now = timezone.now()
        key = keys.api_key_lookup(raw_key, read=_key_read)
        refusal = admission.api_key_refusal(key, origin=info.origin, preview_key_id=info.preview_key_id, now=now)
        if refusal is not None:
            return None, refusal
        with transaction.atomic():
            # The row first, then the locks: they are held for the counts and the commit only.
            session = new_session(key, info, now)
            session.save(force_insert=True)
            locked = keys.api_key_lookup(raw_key, for_update=True, read=_key_read)
            refusal = admission.refusal_counting_rows(locked, origin=info.origin, now=now,
                                                      preview_key_id=info.preview_key_id)
            if refusal is not None:
                transaction.set_rollback(True)
                return None, refusal
            if admission.key_use_stale(locked, now):
                ApiKey.objects.filter(pk=locked.pk).update(last_used_at=now)
            usage.usage_write_now(locked.tenant_id, now, sessions=1)
        session.tenant = locked.tenant
        return session, None

    session_resume = staticmethod(resuming.session_resume)

    def remembered_key_id(self, raw_key: str) -> int | None:
        return None  # every open reads its key

    def session_write_live(self, *, session_id: str, snapshot: dict | None = None,
                           state: str | None = None, visits: list[dict] = (),
                           ending: dict | None = None) -> None:
        fields = live_fields(now=timezone.now(), snapshot=snapshot, state=state, ending=ending)
        if "tools" in fields:
            fields["tools"] = _stored(fields["tools"])
        with transaction.atomic():
            rows = Session.objects.filter(id=session_id, ended_at__isnull=True)
            if visits:
                history = rows.select_for_update().values_list("page_history", flat=True).first()
                if history is None:
                    return
                fields["page_history"] = (list(history) + list(visits))[-port.PAGE_HISTORY_LIMIT:]
            rows.update(**fields)

    def sessions_write_live(self, writes: list[dict]) -> Outcomes:
        return each_alone(writes, lambda write: self.session_write_live(**write))

    def session_close(self, *, session_id: str, code: int | None, reason: str = "",
                      live: dict | None = None) -> None:
        ending = end_fields(now=timezone.now(), code=code, reason=reason)
        if live is None:
            Session.objects.filter(id=session_id, ended_at__isnull=True).update(**ending)
        else:
            self.session_write_live(session_id=session_id, **live, ending=ending)

    def sessions_close(self, closes: list[dict]) -> Outcomes:
        def close(each: dict) -> None:
            try:
                self.session_close(**each)
            except Exception:
                if each.get("live") is None:
                    raise
                self.session_close(**{**each, "live": None})

        return each_alone(closes, close)

    def turn_checkpoint(self, *, session_id: str, tenant_id: int, turn: int, messages: list[dict],
                        calls: list[dict] = (), usage: dict | None = None,
                        finished: list[dict] = (), counted: dict | None = None,
                        figures: dict | None = None) -> None:
        now = timezone.now()
        with transaction.atomic():
            for outcome in finished:
                self.tool_call_finish(**outcome, now=now)
            ConversationMessage.objects.bulk_create([
                ConversationMessage(session_id=session_id, seq=m["seq"], turn=turn, role=m["role"],
                                    content=m["content"], created_at=now)
                for m in messages
            ], ignore_conflicts=True)
            self._record(session_id, turn, calls, now)
            if usage is not None:
                Session.objects.filter(id=session_id).update(
                    last_activity_at=now,
                    **{name: F(name) + int(amount) for name, amount in usage.items()})
                _usage_now(tenant_id, now, not_counted(usage, counted))
            if figures is not None:
                TurnRecord.objects.bulk_create([TurnRecord(session_id=session_id, ended_at=now,
                                                           **turn_record_fields(figures, usage))],
                                               ignore_conflicts=True)

    def turn_checkpoints(self, checkpoints: list[dict]) -> Outcomes:
        return each_alone(checkpoints, lambda checkpoint: self.turn_checkpoint(**checkpoint))

    def tool_calls_record(self, *, session_id: str, turn: int, calls: list[dict]) -> None:
        self._record(session_id, turn, calls, timezone.now())

    def _record(self, session_id: str, turn: int, new: list[dict], now: datetime) -> None:
        ToolCall.objects.bulk_create([
            ToolCall(session_id=session_id, call_id=call["call_id"],
                     tool_use_id=call["tool_use_id"], turn=turn, name=call["name"][:64],
                     arguments=call["arguments"], risk=call.get("risk", "none"),
                     origin=call.get("origin", ToolCall.Origin.CLIENT),
                     status=ToolCall.Status.PENDING, result=None, error="",
                     created_at=call.get("created_at") or now)
            for call in new
        ], ignore_conflicts=True)

    def tool_call_mark(self, *, call_id: str, status: str, sent: bool = False,
                       risk: str | None = None, origin: str | None = None) -> None:
        status = CallStatus(status).value
        sources = [s.value for s in calls.sources(status)]
        changes: dict = {"status": Case(When(status__in=sources, then=Value(status)),
                                        default=F("status"))}
        if sent:
            changes["sent_at"] = timezone.now()
        changes.update({name: value for name, value in (("risk", risk), ("origin", origin))
                        if value is not None})
        ToolCall.objects.filter(call_id=call_id).update(**changes)

    def tool_call_marks(self, marks: list[dict]) -> Outcomes:
        return each_alone(marks, lambda mark: self.tool_call_mark(**mark))

    def tool_call_finish(self, *, call_id: str, status: str, result=None, error: str = "",
                         risk: str | None = None, origin: str | None = None,
                         created_at: datetime | None = None, sent_at: datetime | None = None,
                         now: datetime | None = None) -> None:
        now = now or timezone.now()
        open_call = ToolCall.objects.filter(call_id=call_id).exclude(
            status__in=ToolCall.FINAL_STATUSES)
        if created_at is None:
            created_at = open_call.values_list("created_at", flat=True).first()
            if created_at is None:
                return
        changes: dict = {
            "status": status, "result": result, "error": error[:4000], "finished_at": now,
            "duration_ms": max(0, int((now - created_at).total_seconds() * 1000)),
        }
        changes.update({name: value for name, value in (("risk", risk), ("origin", origin))
                        if value is not None})
        if sent_at is not None:
            changes["sent_at"] = Coalesce(F("sent_at"), Value(sent_at, output_field=DateTimeField()))
        open_call.update(**changes)

    def tool_calls_finish(self, finished: list[dict]) -> None:
        with transaction.atomic():
            for outcome in finished:
                self.tool_call_finish(**outcome)

    # The tenant's day is written with each open and checkpoint: nothing waits.

    def usage_flush(self) -> int:
        return 0

    def usage_flush_logged(self) -> int:
        return 0

    def usage_pending(self) -> dict[tuple[int, date], dict[str, int]]:
        return {}


def _usage_now(tenant_id: int, now: datetime, amounts: dict) -> None:
    usage.usage_write_now(tenant_id, now, **amounts)
