"""The audit chain: every approval event is linked to the one before by a hash.

Each event's hash covers its own fields and the previous event's hash, so
altering, removing or reordering a stored row breaks the chain at that row,
and ``verify_chain`` names it. The chain head row is locked by every
appender, inside the caller's transaction, so concurrent writers (on any
number of processes) queue instead of forking the chain.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import UTC, datetime

from django.db import connection
from django.db.models import F, Max
from django.utils import timezone

from approvals.models import GENESIS_HASH, AuditChainHead, AuditEvent

# The data field holds a short note, a verdict or an error text; never raw
# tool arguments (those are identified by args_hash).
MAX_DATA_TEXT = 500


def _canonical(value) -> str:
    # Same canonical form as aitp.tools.canonical_json (sorted keys, no
    # whitespace, UTF-8 kept); defined here too so a change there can never
    # silently re-hash history.
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat(timespec="microseconds")


def compute_hash(
    *, seq: int, tenant_id: int, approval_id: int | None, session_id: str, call_id: str,
    action: str, actor_kind: str, actor: str, channel: str, args_hash: str, data: dict,
    created_at: datetime, prev_hash: str,
) -> str:
    fields = [
        seq, tenant_id, approval_id, session_id, call_id, action, actor_kind, actor, channel,
        args_hash, _canonical(data), _iso(created_at), prev_hash,
    ]
    return hashlib.sha256(_canonical(fields).encode("utf-8")).hexdigest()


def _event_hash(event: AuditEvent) -> str:
    return compute_hash(
        seq=event.seq, tenant_id=event.tenant_id, approval_id=event.approval_id,
        session_id=event.session_id, call_id=event.call_id, action=event.action,
        actor_kind=event.actor_kind, actor=event.actor, channel=event.channel,
        args_hash=event.args_hash, data=event.data, created_at=event.created_at,
        prev_hash=event.prev_hash,
    )


def _short_data(data: dict | None) -> dict:
    clean = {}
    for key, value in (data or {}).items():
        if isinstance(value, str) and len(value) > MAX_DATA_TEXT:
            value = value[:MAX_DATA_TEXT]
        clean[str(key)] = value
    return clean


def lock_chain() -> AuditChainHead:
    """Lock the chain head for the rest of the current transaction.

    Call it first in a transaction that will append. PostgreSQL locks the row
    (the UPDATE and FOR UPDATE); SQLite ignores FOR UPDATE, but the UPDATE
    takes the database write lock before anything is read, so a second writer
    waits for it instead of failing on a read-to-write lock upgrade.
    """
    if not connection.in_atomic_block:
        raise RuntimeError("the audit chain can only be locked inside a transaction")
    pk = AuditChainHead.SINGLETON_PK
    touched = AuditChainHead.objects.filter(pk=pk).update(last_seq=F("last_seq"))
    if not touched:
        # The row comes with the migration; a test flush or a hand-cleaned
        # database removes it. Recreate it (a racing creator is handled by
        # get_or_create's retry on the unique pk).
        AuditChainHead.objects.get_or_create(pk=pk)
    return AuditChainHead.objects.select_for_update().get(pk=pk)


def append_event(
    *, tenant_id: int, action: str, actor_kind: str, actor: str = "", channel: str,
    approval_id: int | None = None, session_id: str = "", call_id: str = "",
    args_hash: str = "", data: dict | None = None,
) -> AuditEvent:
    """Append one event to the chain. Must run inside the transaction that
    writes the change it records, so both commit or neither does."""
    if action not in AuditEvent.Action.values:
        raise ValueError(f"unknown audit action {action!r}")
    if actor_kind not in AuditEvent.ActorKind.values:
        raise ValueError(f"unknown actor kind {actor_kind!r}")
    if channel not in AuditEvent.Channel.values:
        raise ValueError(f"unknown channel {channel!r}")
    head = lock_chain()
    event = AuditEvent(
        seq=head.last_seq + 1,
        tenant_id=tenant_id,
        approval_id=approval_id,
        session_id=session_id or "",
        call_id=call_id or "",
        action=action,
        actor_kind=actor_kind,
        actor=(actor or "")[:150],
        channel=channel,
        args_hash=args_hash or "",
        data=_short_data(data),
        # Whole microseconds in UTC: what every supported database stores, so
        # the hash recomputed from the stored row matches.
        created_at=timezone.now().astimezone(UTC),
        prev_hash=head.last_hash,
    )
    event.hash = _event_hash(event)
    event.save()
    AuditChainHead.objects.filter(pk=head.pk).update(last_seq=event.seq, last_hash=event.hash)
    return event


@dataclass(frozen=True)
class VerifyResult:
    ok: bool
    count: int
    first_bad_seq: int | None
    problem: str


def verify_chain() -> VerifyResult:
    """Walk the chain in order and report the first broken link.

    The walk covers the events up to the chain head as read first. An event
    appended meanwhile lies beyond it and is left for the next run; a row
    beyond the head that no appender wrote is reported.
    """
    head = _read_head()
    head_seq, head_hash = head if head is not None else (0, GENESIS_HASH)
    expected_seq = 1
    expected_prev = GENESIS_HASH
    count = 0
    events = AuditEvent.objects.filter(seq__lte=head_seq).order_by("seq")
    for event in events.iterator(chunk_size=2000):
        if event.seq != expected_seq:
            if event.seq > expected_seq:
                problem = f"event #{expected_seq} is missing"
            else:
                problem = f"duplicate or reordered sequence number {event.seq}"
            return VerifyResult(False, count, event.seq, problem)
        if event.prev_hash != expected_prev:
            problem = (
                "first event does not start the chain" if expected_seq == 1
                else f"does not link to event #{expected_seq - 1} (removed or reordered)"
            )
            return VerifyResult(False, count, event.seq, problem)
        if _event_hash(event) != event.hash:
            return VerifyResult(False, count, event.seq, "hash mismatch (row altered)")
        count += 1
        expected_seq += 1
        expected_prev = event.hash
    if count < head_seq:
        # Every row checked out, but the head knows of later events.
        return VerifyResult(
            False, count, count + 1,
            f"event #{count + 1} is missing (chain head records {head_seq} events)",
        )
    if expected_prev != head_hash:
        return VerifyResult(False, count, head_seq, "chain head does not match the last event")
    beyond = AuditEvent.objects.filter(seq__gt=head_seq).aggregate(top=Max("seq"))["top"]
    if beyond is not None:
        # Read after the rows: an appender commits its row and the head
        # together, so a head read now covers every row it wrote.
        fresh = _read_head()
        if fresh is None:
            return VerifyResult(False, count, None, "chain head row is missing")
        if beyond > fresh[0]:
            return VerifyResult(False, count, beyond, "event lies beyond the chain head")
    return VerifyResult(True, count, None, "")


def _read_head() -> tuple[int, str] | None:
    return (
        AuditChainHead.objects.filter(pk=AuditChainHead.SINGLETON_PK)
        .values_list("last_seq", "last_hash")
        .first()
    )
