"""The audit chain: every approval event is linked to the one before by a hash.

Each event's hash covers its own fields and the previous event's hash, so
altering, removing or reordering a stored row breaks the chain at that row,
and ``verify_chain`` names it. The chain head row is locked by every
appender, inside the caller's transaction, so concurrent writers (on any
number of processes) queue instead of forking the chain.

The hash is an HMAC-SHA256 under the audit key (``OWLLAYER_AUDIT_KEY``),
which lives outside the database: someone who can write the database can
delete or change rows, but cannot make new hashes that verify. Each event
names the key that hashed it (``key_id``, an id derived from the key), so
events hashed before a change of key verify under the old keys
(``OWLLAYER_AUDIT_OLD_KEYS``). Events stored before keyed hashing began
keep their plain SHA-256 hashes: the keyed chain starts at the head's
``keyed_from`` event, whose hash records that it starts it, and which links
to the last plain event.

What a database writer can still do -- remove the newest events, or (with
the key) rewrite the chain -- is caught by the signed checkpoints written
outside the database (``approvals.anchors``).
"""
from __future__ import annotations

import hashlib
import hmac
import json
from dataclasses import dataclass
from datetime import UTC, datetime

from django.db import connection, transaction
from django.db.models import F, Max
from django.utils import timezone

from approvals import anchors
from approvals.audit_keys import AuditKey, current_key, key_ring
from approvals.models import GENESIS_HASH, AuditChainHead, AuditEvent

# The data field holds a short note, a verdict or an error text; never raw
# tool arguments (those are identified by args_hash).
MAX_DATA_TEXT = 500

# What a keyed hash says it is (part of what is hashed): a later format
# would hash a different first item, so two formats never collide.
KEYED_FORMAT = "owllayer-audit-event-v2"


def _canonical(value) -> str:
    # Same canonical form as aitp.tools.canonical_json (sorted keys, no
    # whitespace, UTF-8 kept); defined here too so a change there can never
    # silently re-hash history.
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat(timespec="microseconds")


# --- hashes -------------------------------------------------------------------------


def compute_hash(
    *, seq: int, tenant_id: int, approval_id: int | None, session_id: str, call_id: str,
    action: str, actor_kind: str, actor: str, channel: str, args_hash: str, data: dict,
    created_at: datetime, prev_hash: str,
) -> str:
    """The plain SHA-256 of an event written before keyed hashing began."""
    fields = [
        seq, tenant_id, approval_id, session_id, call_id, action, actor_kind, actor, channel,
        args_hash, _canonical(data), _iso(created_at), prev_hash,
    ]
    return hashlib.sha256(_canonical(fields).encode("utf-8")).hexdigest()


def compute_keyed_hash(
    key: AuditKey, *, seq: int, tenant_id: int, approval_id: int | None, session_id: str,
    call_id: str, action: str, actor_kind: str, actor: str, channel: str, args_hash: str,
    data: dict, created_at: datetime, prev_hash: str, starts_keyed_chain: bool,
) -> str:
    """The HMAC-SHA256 of an event under ``key``: every field, the link to the
    event before, the key's id, and whether this event starts the keyed chain."""
    fields = [
        KEYED_FORMAT, seq, tenant_id, approval_id, session_id, call_id, action, actor_kind, actor,
        channel, args_hash, _canonical(data), _iso(created_at), prev_hash, key.id,
        starts_keyed_chain,
    ]
    return key.sign(_canonical(fields))


def _fields(event: AuditEvent) -> dict:
    return {
        "seq": event.seq, "tenant_id": event.tenant_id, "approval_id": event.approval_id,
        "session_id": event.session_id, "call_id": event.call_id, "action": event.action,
        "actor_kind": event.actor_kind, "actor": event.actor, "channel": event.channel,
        "args_hash": event.args_hash, "data": event.data, "created_at": event.created_at,
        "prev_hash": event.prev_hash,
    }


def _short_data(data: dict | None) -> dict:
    clean = {}
    for key, value in (data or {}).items():
        if isinstance(value, str) and len(value) > MAX_DATA_TEXT:
            value = value[:MAX_DATA_TEXT]
        clean[str(key)] = value
    return clean


# --- appending ----------------------------------------------------------------------


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
    writes the change it records, so both commit or neither does. Once that
    transaction commits, the event is offered to this process's checkpoints
    (``approvals.anchors``): no file or network work happens under the lock."""
    if action not in AuditEvent.Action.values:
        raise ValueError(f"unknown audit action {action!r}")
    if actor_kind not in AuditEvent.ActorKind.values:
        raise ValueError(f"unknown actor kind {actor_kind!r}")
    if channel not in AuditEvent.Channel.values:
        raise ValueError(f"unknown channel {channel!r}")
    head = lock_chain()
    key = current_key()
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
        key_id=key.id,
    )
    event.hash = compute_keyed_hash(
        key, **_fields(event), starts_keyed_chain=event.seq == head.keyed_from
    )
    event.save()
    AuditChainHead.objects.filter(pk=head.pk).update(last_seq=event.seq, last_hash=event.hash)
    if anchors.enabled():
        seq, digest, keyed_from = event.seq, event.hash, head.keyed_from
        transaction.on_commit(lambda: anchors.committed(seq, digest, keyed_from), robust=True)
    return event


# --- verifying ----------------------------------------------------------------------


@dataclass(frozen=True)
class VerifyResult:
    ok: bool
    count: int
    first_bad_seq: int | None
    problem: str


@dataclass(frozen=True)
class ChainWalk:
    """What a walk of the chain found, for the full report (``approvals.audit_check``)."""

    result: VerifyResult
    head_seq: int  # the chain head as read before the walk (0: no head row)
    keyed_from: int  # the first keyed event, as the head records it
    plain: int  # plain events checked
    key_ids: tuple[str, ...]  # the keys of the keyed events checked, first used first


def verify_chain() -> VerifyResult:
    """Walk the chain in order and report the first broken link."""
    return walk_chain().result


def walk_chain() -> ChainWalk:
    """Walk the chain in order, checking each event's hash (plain before the
    keyed chain, keyed with the key it names from there on) and its link.

    The walk covers the events up to the chain head as read first. An event
    appended meanwhile lies beyond it and is left for the next run; a row
    beyond the head that no appender wrote is reported.
    """
    head = _read_head()
    head_seq, head_hash, keyed_from = head if head is not None else (0, GENESIS_HASH, 1)
    ring = key_ring()
    expected_seq = 1
    expected_prev = GENESIS_HASH
    count = plain = 0
    key_ids: list[str] = []

    def walked(result: VerifyResult) -> ChainWalk:
        return ChainWalk(result, head_seq, keyed_from, plain, tuple(key_ids))

    events = AuditEvent.objects.filter(seq__lte=head_seq).order_by("seq")
    for event in events.iterator(chunk_size=2000):
        problem = _link_problem(event, expected_seq, expected_prev) or _hash_problem(event, keyed_from, ring)
        if problem:
            return walked(VerifyResult(False, count, event.seq, problem))
        if event.key_id:
            if event.key_id not in key_ids:
                key_ids.append(event.key_id)
        else:
            plain += 1
        count += 1
        expected_seq += 1
        expected_prev = event.hash
    return walked(_end_result(count, head_seq, expected_prev, head_hash))


def _link_problem(event: AuditEvent, expected_seq: int, expected_prev: str) -> str:
    """Why the event is not the next link of the chain ("" when it is)."""
    if event.seq > expected_seq:
        return f"event #{expected_seq} is missing"
    if event.seq < expected_seq:
        return f"duplicate or reordered sequence number {event.seq}"
    if event.prev_hash != expected_prev:
        return ("first event does not start the chain" if expected_seq == 1
                else f"does not link to event #{expected_seq - 1} (removed or reordered)")
    return ""


def _end_result(count: int, head_seq: int, last_hash: str, head_hash: str) -> VerifyResult:
    """The walk's result once every row up to the head checked out: the head
    must know of no more events and end where the rows end, and no row may lie
    beyond it that no appender wrote."""
    if count < head_seq:
        # Every row checked out, but the head knows of later events.
        return VerifyResult(
            False, count, count + 1,
            f"event #{count + 1} is missing (chain head records {head_seq} events)",
        )
    if last_hash != head_hash:
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


def _hash_problem(event: AuditEvent, keyed_from: int, ring: dict[str, AuditKey]) -> str:
    """Why the event's stored hash is not the one its fields make ("" when it is)."""
    if event.seq < keyed_from:
        if event.key_id:
            return f"keyed, though the keyed chain starts at event #{keyed_from} (row altered)"
        expected = compute_hash(**_fields(event))
    else:
        if not event.key_id:
            return f"not keyed, though the keyed chain starts at event #{keyed_from} (row altered)"
        key = ring.get(event.key_id)
        if key is None:
            return (f"hashed with key {event.key_id}, which is not configured "
                    "(OWLLAYER_AUDIT_KEY, OWLLAYER_AUDIT_OLD_KEYS), or the row was altered")
        expected = compute_keyed_hash(
            key, **_fields(event), starts_keyed_chain=event.seq == keyed_from
        )
    if not hmac.compare_digest(expected.encode(), event.hash.encode("utf-8")):
        return "hash mismatch (row altered)"
    return ""


def _read_head() -> tuple[int, str, int] | None:
    return (
        AuditChainHead.objects.filter(pk=AuditChainHead.SINGLETON_PK)
        .values_list("last_seq", "last_hash", "keyed_from")
        .first()
    )
