"""The audit chain: appending, verifying, and catching altered, removed or
reordered rows; the keyed hashes a database writer cannot remake, and the
boundary where they begin after the plain hashes of older events."""
from __future__ import annotations

import importlib
import threading
from datetime import UTC, datetime

import pytest
from django.apps import apps
from django.core.management import call_command
from django.db import connection, transaction

from approvals.audit import append_event, compute_hash, compute_keyed_hash, verify_chain
from approvals.audit_keys import current_key, derive_key
from approvals.models import GENESIS_HASH, AuditChainHead, AuditEvent

pytestmark = pytest.mark.django_db

COLUMNS = ("tenant_id, approval_id, session_id, call_id, action, actor_kind, actor, channel, "
           "args_hash, data, created_at, prev_hash, hash, key_id")


def append(tenant, action="requested", **fields) -> AuditEvent:
    with transaction.atomic():
        return append_event(tenant_id=tenant.pk, action=action, actor_kind="system",
                            actor="system", channel="system", **fields)


def raw_sql(sql: str, params=()) -> None:
    table = AuditEvent._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(sql.format(table=table), params)


def run_verify_command(capsys, *args) -> tuple[int, str]:
    try:
        call_command("verify_audit", *args)
        code = 0
    except SystemExit as exc:
        code = exc.code
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def fields_of(event: AuditEvent, **changes) -> dict:
    values = {
        "seq": event.seq, "tenant_id": event.tenant_id, "approval_id": event.approval_id,
        "session_id": event.session_id, "call_id": event.call_id, "action": event.action,
        "actor_kind": event.actor_kind, "actor": event.actor, "channel": event.channel,
        "args_hash": event.args_hash, "data": event.data, "created_at": event.created_at,
        "prev_hash": event.prev_hash,
    }
    return {**values, **changes}


def rewrite_from(seq: int, change: dict, rehash) -> None:
    """What someone with write access to the database (and no more) would do:
    change event #seq, then remake its hash and every later hash and link
    with ``rehash(event_fields) -> (hash, key_id)``, and move the head."""
    prev = AuditEvent.objects.get(seq=seq).prev_hash
    for event in AuditEvent.objects.filter(seq__gte=seq).order_by("seq"):
        values = fields_of(event, prev_hash=prev, **(change if event.seq == seq else {}))
        digest, key_id = rehash(values)
        raw_sql("UPDATE {table} SET action = %s, prev_hash = %s, hash = %s, key_id = %s "
                "WHERE seq = %s", [values["action"], prev, digest, key_id, event.seq])
        prev = digest
    AuditChainHead.objects.filter(pk=AuditChainHead.SINGLETON_PK).update(last_hash=prev)


def test_each_event_links_to_the_one_before(acme):
    first = append(acme, session_id="ses_a", call_id="tc_1", data={"note": "hello"})
    second = append(acme, action="approved")

    assert (first.seq, second.seq) == (1, 2)
    assert first.prev_hash == GENESIS_HASH
    assert second.prev_hash == first.hash
    assert len(first.hash) == 64 and first.hash != second.hash


def test_an_event_names_the_key_that_hashed_it_and_never_holds_the_key(acme, settings):
    settings.OWLLAYER_AUDIT_KEY = "the-audit-key-kept-outside-the-database"
    event = append(acme, data={"note": "hello"})

    stored = AuditEvent.objects.get(seq=event.seq)
    assert stored.key_id == derive_key("the-audit-key-kept-outside-the-database").id
    assert len(stored.key_id) == 16
    row = AuditEvent.objects.filter(seq=event.seq).values().get()
    assert not any("the-audit-key" in str(value) for value in row.values())
    assert stored.hash == compute_keyed_hash(current_key(), **fields_of(stored),
                                             starts_keyed_chain=True)


def test_without_its_own_setting_the_audit_key_comes_from_the_django_secret():
    from django.conf import settings

    # The test environment sets no OWLLAYER_AUDIT_KEY (settings.py reads it once).
    assert settings.OWLLAYER_AUDIT_KEY == settings.SECRET_KEY
    assert derive_key(settings.SECRET_KEY).secret != settings.SECRET_KEY.encode()


@pytest.mark.django_db(transaction=True)
def test_refuses_to_append_outside_a_transaction(acme):
    with pytest.raises(RuntimeError):
        append_event(tenant_id=acme.pk, action="requested", actor_kind="system", channel="system")


def test_refuses_an_unknown_action(acme):
    with pytest.raises(ValueError):
        append(acme, action="teleported")


def test_keeps_raw_notes_short(acme):
    event = append(acme, data={"note": "x" * 5000})

    assert len(event.data["note"]) == 500
    assert verify_chain().ok


def test_an_untouched_chain_verifies(acme, capsys):
    for action in ("requested", "approved", "executed"):
        append(acme, action=action, data={"n": 1.5, "text": "é"})

    code, output = run_verify_command(capsys)

    assert code == 0
    assert "The audit chain is intact: 3 events checked (#1 to #3), every hash and every link." in output
    assert f"Keyed events were hashed with key {current_key().id} (the current key)." in output


def test_an_empty_chain_verifies(db, capsys):
    code, output = run_verify_command(capsys)

    assert code == 0
    assert "The audit chain is empty: 0 events checked." in output


def test_an_altered_row_breaks_the_chain_at_that_event(acme, capsys):
    for action in ("requested", "approved", "executed"):
        append(acme, action=action)
    raw_sql("UPDATE {table} SET action = 'denied' WHERE seq = 2")

    result = verify_chain()
    code, output = run_verify_command(capsys)

    assert (result.ok, result.first_bad_seq) == (False, 2)
    assert code == 1
    assert ("The audit chain is broken at event #2: hash mismatch (row altered). "
            "1 event before it checked out; nothing after it was checked.") in output


def test_an_altered_data_field_is_caught(acme):
    append(acme, data={"note": "approved by phone"})
    raw_sql("UPDATE {table} SET data = %s WHERE seq = 1", ['{"note": "approved in person"}'])

    assert verify_chain().first_bad_seq == 1


def test_a_rewritten_row_with_its_chain_remade_as_plain_sha256_is_caught_at_that_row(acme, capsys):
    for action in ("requested", "denied", "executed", "reviewed"):
        append(acme, action=action)

    rewrite_from(2, {"action": "approved"}, lambda values: (compute_hash(**values), current_key().id))

    result = verify_chain()
    code, output = run_verify_command(capsys)
    assert (result.ok, result.first_bad_seq, result.problem) == (False, 2, "hash mismatch (row altered)")
    assert code == 1 and "broken at event #2" in output


def test_a_chain_remade_as_plain_events_after_the_boundary_is_caught(acme):
    for action in ("requested", "denied", "executed"):
        append(acme, action=action)

    rewrite_from(2, {"action": "approved"}, lambda values: (compute_hash(**values), ""))

    result = verify_chain()
    assert (result.ok, result.first_bad_seq) == (False, 2)
    assert result.problem == "not keyed, though the keyed chain starts at event #1 (row altered)"


def test_a_rewritten_row_with_its_chain_remade_under_another_key_is_caught(acme):
    for action in ("requested", "denied", "executed"):
        append(acme, action=action)
    wrong = derive_key("a guess at the audit key")

    # Claiming to be the real key...
    rewrite_from(2, {"action": "approved"}, lambda values: (
        compute_keyed_hash(wrong, **values, starts_keyed_chain=False), current_key().id))
    assert (verify_chain().first_bad_seq, verify_chain().problem) == (2, "hash mismatch (row altered)")

    # ...or naming its own id.
    rewrite_from(2, {"action": "approved"}, lambda values: (
        compute_keyed_hash(wrong, **values, starts_keyed_chain=False), wrong.id))
    result = verify_chain()
    assert result.first_bad_seq == 2
    assert result.problem.startswith(f"hashed with key {wrong.id}, which is not configured")


def test_a_row_slipped_in_after_the_last_event_is_caught(acme):
    append(acme)
    raw_sql(f"INSERT INTO {{table}} (seq, {COLUMNS}) SELECT 2, {COLUMNS} FROM {{table}} WHERE seq = 1")

    result = verify_chain()

    assert (result.ok, result.first_bad_seq) == (False, 2)


def test_a_removed_row_is_caught(acme, capsys):
    for action in ("requested", "approved", "executed"):
        append(acme, action=action)
    raw_sql("DELETE FROM {table} WHERE seq = 2")

    result = verify_chain()
    code, output = run_verify_command(capsys)

    assert (result.ok, result.first_bad_seq) == (False, 3)
    assert "event #2 is missing" in result.problem
    assert code == 1 and "The audit chain is broken at event #3: event #2 is missing." in output


def test_a_removed_last_row_is_caught_by_the_chain_head(acme):
    for action in ("requested", "approved"):
        append(acme, action=action)
    raw_sql("DELETE FROM {table} WHERE seq = 2")

    result = verify_chain()

    assert (result.ok, result.first_bad_seq) == (False, 2)


def test_a_missing_chain_head_is_caught(acme):
    append(acme)
    AuditChainHead.objects.all().delete()

    assert verify_chain().ok is False


def test_a_reordered_chain_is_caught(acme):
    for action in ("requested", "approved", "executed"):
        append(acme, action=action)
    # Swap events 2 and 3 (through a free number, seq being unique).
    raw_sql("UPDATE {table} SET seq = 100 WHERE seq = 2")
    raw_sql("UPDATE {table} SET seq = 2 WHERE seq = 3")
    raw_sql("UPDATE {table} SET seq = 3 WHERE seq = 100")

    result = verify_chain()

    assert (result.ok, result.first_bad_seq) == (False, 2)


def test_a_stored_event_cannot_be_changed_or_deleted_through_the_orm(acme):
    event = append(acme)
    event.action = "denied"

    with pytest.raises(TypeError):
        event.save()
    with pytest.raises(TypeError):
        event.delete()
    with pytest.raises(TypeError):
        AuditEvent.objects.filter(pk=event.pk).update(action="denied")
    with pytest.raises(TypeError):
        AuditEvent.objects.all().delete()
    assert AuditEvent.objects.get(pk=event.pk).action == "requested"


def test_deleting_the_tenant_leaves_its_history_verifiable(acme):
    append(acme)
    tenant_id = acme.pk
    acme.delete()

    assert AuditEvent.objects.filter(tenant_id=tenant_id).count() == 1
    assert verify_chain().ok


# --- keys change ----------------------------------------------------------------------


def test_events_hashed_under_an_old_key_verify_while_that_key_is_listed(acme, settings, capsys):
    settings.OWLLAYER_AUDIT_KEY = "first-key"
    append(acme)
    append(acme, action="approved")
    settings.OWLLAYER_AUDIT_KEY = "second-key"
    settings.OWLLAYER_AUDIT_OLD_KEYS = ("first-key",)
    append(acme, action="executed")

    code, output = run_verify_command(capsys)

    assert code == 0
    first, second = derive_key("first-key").id, derive_key("second-key").id
    assert list(AuditEvent.objects.values_list("key_id", flat=True)) == [first, first, second]
    assert f"hashed with keys {first}, {second} (the current key)." in output

    settings.OWLLAYER_AUDIT_OLD_KEYS = ()
    code, output = run_verify_command(capsys)
    assert code == 1
    assert f"broken at event #1: hashed with key {first}, which is not configured" in output


# --- the boundary: plain events from before keyed hashing, then keyed ones ----------------


def insert_plain_events(tenant, count: int) -> None:
    """Events as a release before keyed hashing wrote them: plain SHA-256,
    no key id; then the migration's boundary after them."""
    prev = GENESIS_HASH
    for seq in range(1, count + 1):
        values = {"seq": seq, "tenant_id": tenant.pk, "approval_id": None, "session_id": "ses_old",
                  "call_id": f"tc_{seq}", "action": "approved", "actor_kind": "operator",
                  "actor": "olivia", "channel": "admin", "args_hash": "a" * 64,
                  "data": {"party": "operator"},
                  "created_at": datetime(2026, 1, 1, 12, 0, seq, tzinfo=UTC), "prev_hash": prev}
        digest = compute_hash(**values)
        raw_sql(f"INSERT INTO {{table}} (seq, {COLUMNS}) VALUES "
                "(%s, %s, NULL, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, '')",
                [seq, tenant.pk, "ses_old", f"tc_{seq}", "approved", "operator", "olivia", "admin",
                 "a" * 64, '{"party": "operator"}', values["created_at"], prev, digest])
        prev = digest
    AuditChainHead.objects.update_or_create(
        pk=AuditChainHead.SINGLETON_PK,
        defaults={"last_seq": count, "last_hash": prev, "keyed_from": 1})
    migration = importlib.import_module("approvals.migrations.0006_audit_keyed_chain")
    migration.start_keyed_chain_after_existing_events(apps, None)


def test_plain_events_from_before_then_keyed_ones_verify_across_the_boundary(acme, capsys):
    insert_plain_events(acme, 3)
    assert AuditChainHead.objects.get().keyed_from == 4

    first_keyed = append(acme)
    append(acme, action="approved")

    assert first_keyed.seq == 4 and first_keyed.prev_hash == AuditEvent.objects.get(seq=3).hash
    assert first_keyed.hash == compute_keyed_hash(current_key(), **fields_of(first_keyed),
                                                  starts_keyed_chain=True)
    code, output = run_verify_command(capsys)
    assert code == 0, output
    assert "5 events checked (#1 to #5)" in output
    assert ("Events #1 to #3 are plain SHA-256 links from before keyed hashing; "
            "the keyed chain starts at event #4.") in output


def test_a_plain_event_from_before_still_catches_an_altered_row(acme):
    insert_plain_events(acme, 3)
    append(acme)
    raw_sql("UPDATE {table} SET actor = 'mallory' WHERE seq = 2")

    result = verify_chain()

    assert (result.first_bad_seq, result.problem) == (2, "hash mismatch (row altered)")


@pytest.mark.parametrize("keyed_from,bad_seq,problem", [
    (5, 4, "keyed, though the keyed chain starts at event #5 (row altered)"),
    (3, 3, "not keyed, though the keyed chain starts at event #3 (row altered)"),
])
def test_moving_the_boundary_is_caught(acme, keyed_from, bad_seq, problem):
    insert_plain_events(acme, 3)
    append(acme)
    append(acme)
    AuditChainHead.objects.update(keyed_from=keyed_from)

    result = verify_chain()

    assert (result.ok, result.first_bad_seq, result.problem) == (False, bad_seq, problem)


def test_the_first_keyed_event_records_that_it_starts_the_keyed_chain(acme):
    insert_plain_events(acme, 2)
    first_keyed = append(acme)
    append(acme)

    # The same event, claimed not to start the keyed chain, hashes otherwise.
    assert first_keyed.hash != compute_keyed_hash(current_key(), **fields_of(first_keyed),
                                                  starts_keyed_chain=False)
    # Dropping the plain events and moving the boundary to the first keyed one
    # (a chain that "was always keyed") breaks there.
    raw_sql("DELETE FROM {table} WHERE seq < 3")
    raw_sql("UPDATE {table} SET seq = seq - 2")
    AuditChainHead.objects.update(keyed_from=1, last_seq=2)
    assert verify_chain().first_bad_seq == 1


# --- the keyed hash of history never changes -----------------------------------------------


GOLDEN_FIELDS = {
    "seq": 7, "tenant_id": 3, "approval_id": 11, "session_id": "ses_golden", "call_id": "tc_golden",
    "action": "approved", "actor_kind": "operator", "actor": "olivia", "channel": "console",
    "args_hash": "a" * 64, "data": {"note": "café", "party": "operator", "n": 1.5},
    "created_at": datetime(2026, 3, 1, 10, 30, 45, 123456, tzinfo=UTC), "prev_hash": "b" * 64,
}
# Computed once when the keyed format was fixed: a stored chain stays
# verifiable only while the same fields and key hash to the same value.
GOLDEN_KEY_ID = "69bcb665aa2841ae"
GOLDEN_KEYED_HASH = "cffdf51bc7cfee4df6aa81958dca50c5bdb2cc95dbdb21948ddf8df0de410fa8"


def test_the_keyed_hash_of_a_stored_event_never_changes_across_releases():
    key = derive_key("golden audit key")
    assert key.id == GOLDEN_KEY_ID
    assert compute_keyed_hash(key, **GOLDEN_FIELDS, starts_keyed_chain=False) == GOLDEN_KEYED_HASH


# --- many writers ---------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_concurrent_appenders_never_fork_the_chain(acme):
    workers, per_worker = 4, 5
    barrier = threading.Barrier(workers)
    failures: list[BaseException] = []

    def work() -> None:
        try:
            barrier.wait()
            for _ in range(per_worker):
                append(acme)
        except BaseException as exc:  # reported by the assertion below
            failures.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=work) for _ in range(workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert failures == []
    result = verify_chain()
    assert result.ok, result.problem
    assert result.count == workers * per_worker
