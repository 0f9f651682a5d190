"""The audit chain: appending, verifying, and catching altered, removed or reordered rows."""
from __future__ import annotations

import threading

import pytest
from django.core.management import call_command
from django.db import connection, transaction

from approvals.audit import append_event, verify_chain
from approvals.models import GENESIS_HASH, AuditEvent

pytestmark = pytest.mark.django_db


def append(tenant, action="requested", **fields) -> AuditEvent:
    with transaction.atomic():
        return append_event(tenant_id=tenant.pk, action=action, actor_kind="system",
                            actor="system", channel="system", **fields)


def raw_sql(sql: str, params=()) -> None:
    table = AuditEvent._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(sql.format(table=table), params)


def run_verify_command(capsys) -> tuple[int, str]:
    try:
        call_command("verify_audit")
        code = 0
    except SystemExit as exc:
        code = exc.code
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def test_each_event_links_to_the_one_before(acme):
    first = append(acme, session_id="ses_a", call_id="tc_1", data={"note": "hello"})
    second = append(acme, action="approved")

    assert (first.seq, second.seq) == (1, 2)
    assert first.prev_hash == GENESIS_HASH
    assert second.prev_hash == first.hash
    assert len(first.hash) == 64 and first.hash != second.hash


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
    assert "audit chain ok: 3 events" in output


def test_an_empty_chain_verifies(db, capsys):
    code, output = run_verify_command(capsys)

    assert code == 0
    assert "audit chain ok: 0 events" in output


def test_an_altered_row_breaks_the_chain_at_that_event(acme, capsys):
    for action in ("requested", "approved", "executed"):
        append(acme, action=action)
    raw_sql("UPDATE {table} SET action = 'denied' WHERE seq = 2")

    result = verify_chain()
    code, output = run_verify_command(capsys)

    assert (result.ok, result.first_bad_seq) == (False, 2)
    assert code == 1
    assert "audit chain broken at event #2: hash mismatch" in output


def test_an_altered_data_field_is_caught(acme):
    append(acme, data={"note": "approved by phone"})
    raw_sql("UPDATE {table} SET data = %s WHERE seq = 1", ['{"note": "approved in person"}'])

    assert verify_chain().first_bad_seq == 1


def test_a_rewritten_row_with_a_recomputed_hash_breaks_the_next_link(acme):
    from approvals.audit import compute_hash

    for action in ("requested", "denied", "executed"):
        append(acme, action=action)
    forged = AuditEvent.objects.get(seq=2)
    new_hash = compute_hash(
        seq=2, tenant_id=forged.tenant_id, approval_id=None, session_id="", call_id="",
        action="approved", actor_kind="system", actor="system", channel="system", args_hash="",
        data={}, created_at=forged.created_at, prev_hash=forged.prev_hash,
    )
    raw_sql("UPDATE {table} SET action = 'approved', hash = %s WHERE seq = 2", [new_hash])

    result = verify_chain()

    assert (result.ok, result.first_bad_seq) == (False, 3)


def test_a_removed_row_is_caught(acme, capsys):
    for action in ("requested", "approved", "executed"):
        append(acme, action=action)
    raw_sql("DELETE FROM {table} WHERE seq = 2")

    result = verify_chain()
    code, output = run_verify_command(capsys)

    assert (result.ok, result.first_bad_seq) == (False, 3)
    assert "event #2 is missing" in result.problem
    assert code == 1 and "audit chain broken at event #3" in output


def test_a_removed_last_row_is_caught_by_the_chain_head(acme):
    for action in ("requested", "approved"):
        append(acme, action=action)
    raw_sql("DELETE FROM {table} WHERE seq = 2")

    result = verify_chain()

    assert (result.ok, result.first_bad_seq) == (False, 2)


def test_a_row_slipped_in_after_the_last_event_is_caught(acme):
    append(acme)
    columns = ("tenant_id, approval_id, session_id, call_id, action, actor_kind, actor, channel, "
               "args_hash, data, created_at, prev_hash, hash")
    raw_sql(f"INSERT INTO {{table}} (seq, {columns}) SELECT 2, {columns} FROM {{table}} WHERE seq = 1")

    result = verify_chain()

    assert (result.ok, result.first_bad_seq) == (False, 2)


def test_a_missing_chain_head_is_caught(acme):
    from approvals.models import AuditChainHead

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
