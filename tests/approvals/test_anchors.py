"""Checkpoints of the audit chain outside the database: when they are
written, what ``verify_audit`` makes of them, and the tampering they show
that the database alone cannot (its newest events removed, its chain
rewritten by someone holding the key)."""
from __future__ import annotations

import io
import json
import logging
import os
import socket
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from django.core.management import call_command
from django.db import connection, transaction

from approvals import anchors
from approvals.audit import append_event, compute_hash, compute_keyed_hash, verify_chain
from approvals.audit_check import audit_report
from approvals.audit_keys import current_key, derive_key, key_ring
from approvals.models import AuditChainHead, AuditEvent
from tests.approvals.test_audit import rewrite_from

ROOT = Path(__file__).resolve().parents[2]
PATIENCE = 60.0  # seconds a test waits for the checkpoint thread (an event, not a pace)


@pytest.fixture
def anchor_file(settings, tmp_path) -> Path:
    """Anchoring on, to a file of this test's own; no checkpoint is due by
    count or by time unless the test says so."""
    path = tmp_path / "audit-anchors.log"
    settings.OWLLAYER_AUDIT_ANCHOR_FILE = str(path)
    settings.OWLLAYER_AUDIT_ANCHOR_URL = ""
    settings.OWLLAYER_AUDIT_ANCHOR_EVENTS = 1000
    settings.OWLLAYER_AUDIT_ANCHOR_SECONDS = 3600
    anchors.ANCHORER.reset()
    yield path
    anchors.flush(timeout=PATIENCE)
    anchors.ANCHORER.reset()


def append(tenant, action="requested") -> AuditEvent:
    with transaction.atomic():
        return append_event(tenant_id=tenant.pk, action=action, actor_kind="system",
                            actor="system", channel="system")


def checkpoints(path: Path) -> list[anchors.Checkpoint]:
    lines = anchors.read_lines(str(path), key_ring())
    assert [line.problem for line in lines] == [None] * len(lines)
    return [line.checkpoint for line in lines]


def anchor_now() -> None:
    call_command("anchor_audit", stdout=io.StringIO())


def verify(capsys, *args) -> tuple[int, str]:
    try:
        call_command("verify_audit", *args)
        code = 0
    except SystemExit as exc:
        code = exc.code
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def raw_sql(sql: str, params=()) -> None:
    with connection.cursor() as cursor:
        cursor.execute(sql.format(table=AuditEvent._meta.db_table), params)


# --- when checkpoints are written --------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_checkpoint_is_written_after_the_events_transaction_commits_never_inside_it(
        acme, anchor_file):
    with transaction.atomic():
        for _ in range(3):
            append_event(tenant_id=acme.pk, action="requested", actor_kind="system",
                         channel="system")
        anchors.flush(timeout=PATIENCE)
        assert not anchor_file.exists()

    assert anchors.flush(timeout=PATIENCE)
    # The thread may take the first event before the others are offered;
    # the newest checkpoint is of the transaction's last event.
    newest = checkpoints(anchor_file)[-1]
    assert (newest.seq, newest.hash, newest.keyed_from, newest.key_id) == (
        3, AuditEvent.objects.get(seq=3).hash, 1, current_key().id)


def test_a_flush_asked_for_while_a_checkpoint_is_written_anchors_the_newer_events(
        anchor_file, monkeypatch):
    started, release = threading.Event(), threading.Event()
    append_line = anchors.append_line

    def slow_first_line(path: str, line: str) -> None:
        if not started.is_set():
            started.set()
            release.wait(PATIENCE)
        append_line(path, line)

    monkeypatch.setattr(anchors, "append_line", slow_first_line)
    anchors.committed(1, "a" * 64, 1)  # this process's first: written at once
    assert started.wait(PATIENCE)
    anchors.committed(2, "b" * 64, 1)  # far from the count and the interval
    flushed: list[bool] = []
    flusher = threading.Thread(target=lambda: flushed.append(anchors.flush(timeout=PATIENCE)))
    flusher.start()
    with anchors.ANCHORER._cond:  # the flush has asked before the first line is done
        assert anchors.ANCHORER._cond.wait_for(lambda: anchors.ANCHORER._force, PATIENCE)

    release.set()
    flusher.join(PATIENCE)

    assert flushed == [True]
    assert [c.seq for c in checkpoints(anchor_file)] == [1, 2]


@pytest.mark.django_db(transaction=True)
def test_a_transaction_rolled_back_leaves_no_checkpoint(acme, anchor_file):
    with pytest.raises(RuntimeError), transaction.atomic():
        append_event(tenant_id=acme.pk, action="requested", actor_kind="system", channel="system")
        raise RuntimeError("the decision failed")

    anchors.flush(timeout=PATIENCE)
    assert not anchor_file.exists()


@pytest.mark.django_db(transaction=True)
def test_a_checkpoint_comes_every_n_events(acme, anchor_file, settings):
    settings.OWLLAYER_AUDIT_ANCHOR_EVENTS = 3
    append(acme)  # this process's first: anchored at once
    assert anchors.ANCHORER.wait_until_anchored(1, PATIENCE)

    for _ in range(3):
        append(acme)

    assert anchors.ANCHORER.wait_until_anchored(4, PATIENCE)
    assert [c.seq for c in checkpoints(anchor_file)] == [1, 4]


@pytest.mark.django_db(transaction=True)
def test_a_checkpoint_comes_after_t_seconds_for_the_events_that_wait(acme, anchor_file, settings):
    settings.OWLLAYER_AUDIT_ANCHOR_SECONDS = 0.2
    append(acme)
    assert anchors.ANCHORER.wait_until_anchored(1, PATIENCE)

    append(acme)

    # One event is far from the count: only the interval anchors it.
    assert anchors.ANCHORER.wait_until_anchored(2, PATIENCE)
    assert [c.seq for c in checkpoints(anchor_file)] == [1, 2]


class Collector(BaseHTTPRequestHandler):
    bodies: list[bytes] = []

    def log_message(self, *args) -> None:
        pass

    def do_POST(self) -> None:
        self.bodies.append(self.rfile.read(int(self.headers["Content-Length"])))
        self.send_response(204)
        self.end_headers()


@pytest.fixture
def collector():
    Collector.bodies = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), Collector)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/checkpoints"
    server.shutdown()
    server.server_close()


@pytest.mark.django_db(transaction=True)
def test_each_checkpoint_is_also_posted_to_the_configured_address(
        acme, anchor_file, settings, collector):
    settings.OWLLAYER_AUDIT_ANCHOR_URL = collector

    append(acme)
    assert anchors.flush(timeout=PATIENCE)

    assert Collector.bodies == [anchor_file.read_bytes()]
    posted = anchors.parse_line(Collector.bodies[0].decode(), key_ring())
    assert (posted.seq, posted.hash) == (1, AuditEvent.objects.get(seq=1).hash)


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.django_db(transaction=True)
def test_a_failed_post_is_logged_once_per_window_and_never_fails_an_approval(
        acme, anchor_file, settings, caplog):
    from approvals import services
    from tests.approvals.conftest import make_call, make_session

    settings.OWLLAYER_AUDIT_ANCHOR_EVENTS = 1
    settings.OWLLAYER_AUDIT_ANCHOR_URL = f"http://127.0.0.1:{closed_port()}/checkpoints"
    caplog.set_level(logging.INFO, logger="approvals.anchors")
    session = make_session(acme)

    for _ in range(3):
        call = make_call(session)
        approval = services.approval_request_client(
            tool_call=call, tool_name=call.name, args=call.arguments, risk="critical",
            message="", session_id=session.id, timeout=60)
        assert anchors.flush(timeout=PATIENCE)
        decided = services.approval_decide_user(approval_id=approval.pk, session_id=session.id,
                                                approved=True)
        assert decided.status == "approved"
        assert anchors.flush(timeout=PATIENCE)

    warnings = [r.getMessage() for r in caplog.records if r.name == "approvals.anchors"]
    assert len(warnings) == 1
    assert warnings[0].startswith(f"audit checkpoint could not be posted to {settings.OWLLAYER_AUDIT_ANCHOR_URL}")
    # The file, on the other hand, has every checkpoint.
    assert [c.seq for c in checkpoints(anchor_file)] == [1, 2, 3, 4, 5, 6]


# --- what verify_audit finds ----------------------------------------------------------------


def test_a_chain_that_matches_its_checkpoints_verifies_and_names_what_is_not_anchored_yet(
        acme, anchor_file, capsys):
    for _ in range(3):
        append(acme)
    anchor_now()
    append(acme)
    append(acme)

    code, output = verify(capsys)

    assert code == 0, output
    assert f"1 checkpoint in {anchor_file} matches the database (the newest covers event #3)." in output
    assert "2 events (#4 to #5) are not yet anchored, after the newest checkpoint (event #3)." in output
    report = audit_report()
    assert (report.ok, report.events, report.checkpoints, report.unanchored) == (True, 5, 1, 2)


def test_events_no_checkpoint_covers_yet_are_reported_as_such(acme, anchor_file, capsys):
    append(acme)

    code, output = verify(capsys)

    assert code == 1
    assert "1 event (#1) is not yet anchored, and no checkpoint covers any event yet." in output
    # The file never appeared though a keyed event was written: that is a finding.
    assert f"The anchor file {anchor_file} does not exist, though the chain holds 1 event" in output


def test_removing_the_newest_events_is_named_through_the_checkpoint(acme, anchor_file, capsys):
    for _ in range(5):
        append(acme)
    anchor_now()
    # Remove #4 and #5 and make the head agree: the database alone is consistent.
    third = AuditEvent.objects.get(seq=3)
    raw_sql("DELETE FROM {table} WHERE seq > 3")
    AuditChainHead.objects.update(last_seq=3, last_hash=third.hash)
    assert verify_chain().ok

    code, output = verify(capsys)

    assert code == 1
    assert ("records event #5, but the database's chain ends at event #3: events after #3 "
            "(up to #5 at least) were removed, or the database was restored from an older copy."
            in output)
    # #3 is not "waiting for a checkpoint": the one past it says what came after.
    assert "not yet anchored" not in output


def test_a_chain_rewritten_with_the_key_is_named_through_the_checkpoint(acme, anchor_file, capsys):
    for action in ("requested", "denied", "executed", "reviewed"):
        append(acme, action)
    anchor_now()
    append(acme)
    anchor_now()
    # Someone holding the database and the key remakes every hash from #2 on.
    rewrite_from(2, {"action": "approved"}, lambda values: (
        compute_keyed_hash(current_key(), **values, starts_keyed_chain=False), current_key().id))
    assert verify_chain().ok

    code, output = verify(capsys)

    assert code == 1
    rewritten = AuditEvent.objects.get(seq=4).hash
    assert (f"records event #4 with hash {checkpoints(anchor_file)[0].hash[:16]}…, but the "
            f"database's event #4 has hash {rewritten[:16]}…: the chain was rewritten at or "
            "before event #4. 1 later checkpoint does not match either." in output)


def test_a_chain_rewritten_as_plain_events_is_named_through_the_checkpoint(acme, anchor_file, capsys):
    for _ in range(3):
        append(acme)
    anchor_now()
    # The whole chain remade as "old" plain events, with the boundary after them.
    rewrite_from(1, {}, lambda values: (compute_hash(**values), ""))
    AuditChainHead.objects.update(keyed_from=4)
    assert verify_chain().ok

    code, output = verify(capsys)

    assert code == 1
    assert "the chain was rewritten at or before event #3" in output


def test_a_moved_boundary_is_named_through_the_checkpoint(acme, anchor_file, capsys):
    for _ in range(3):
        append(acme)
    anchor_now()
    AuditChainHead.objects.update(keyed_from=2)

    code, output = verify(capsys)

    assert code == 1
    assert ("says the keyed chain starts at event #1, but the database says it starts at event #2"
            in output)


def forge(line: str, **changes) -> str:
    record = json.loads(line)
    record.update(changes)
    return json.dumps(record) + "\n"


def test_a_forged_anchor_line_has_a_bad_signature(acme, anchor_file, capsys):
    for _ in range(3):
        append(acme)
    anchor_now()
    genuine = anchor_file.read_text()
    # A checkpoint claiming the chain ended at #2, to cover a removal of #3.
    with anchor_file.open("a") as out:
        out.write(forge(genuine, seq=2, hash=AuditEvent.objects.get(seq=2).hash))

    code, output = verify(capsys)

    assert code == 1
    assert (f"Line 2 of {anchor_file} is a checkpoint with a bad signature: the key it names did "
            "not sign it, so it was forged or altered after it was written.") in output
    assert f"1 checkpoint in {anchor_file} matches the database" in output


def test_an_anchor_line_signed_with_a_key_not_configured_is_named(acme, anchor_file, capsys):
    append(acme)
    stranger = derive_key("someone else's key")
    with anchor_file.open("a") as out:
        out.write(anchors.checkpoint_line(seq=1, hash=AuditEvent.objects.get(seq=1).hash,
                                          keyed_from=1, key=stranger))

    code, output = verify(capsys)

    assert code == 1
    assert f"Line 1 of {anchor_file} is signed with key {stranger.id}, which is not configured" in output


def test_a_damaged_anchor_line_is_named(acme, anchor_file, capsys):
    append(acme)
    anchor_now()
    with anchor_file.open("a") as out:
        out.write('{"seq": 1, "hash": "cut sh\n')

    code, output = verify(capsys)

    assert code == 1
    assert f"Line 2 of {anchor_file} is not a checkpoint" in output


def test_a_copy_of_the_anchors_kept_elsewhere_can_be_checked(acme, anchor_file, capsys, tmp_path):
    append(acme)
    anchor_now()
    copy = tmp_path / "copy.log"
    copy.write_bytes(anchor_file.read_bytes())
    anchor_file.unlink()

    code, output = verify(capsys, "--anchors", str(copy))

    assert code == 0, output
    assert f"1 checkpoint in {copy} matches the database" in output


def test_without_an_anchor_file_the_chain_is_checked_alone_and_said_so(acme, settings, capsys):
    settings.OWLLAYER_AUDIT_ANCHOR_FILE = ""
    append(acme)

    code, output = verify(capsys)

    assert code == 0
    assert "No anchor file is configured (OWLLAYER_AUDIT_ANCHOR_FILE is off)" in output


def test_each_finding_is_one_paragraph(acme, anchor_file, capsys):
    append(acme)
    anchor_now()
    append(acme)

    report = audit_report()

    assert len(report.findings) == 3
    assert all("\n" not in finding.text for finding in report.findings)


# --- many processes, one chain, one file ------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_processes_appending_at_once_never_fork_the_chain_and_keep_every_anchor_line_whole(
        acme, anchor_file, settings, live_db_url):
    settings.OWLLAYER_AUDIT_ANCHOR_EVENTS = 1
    append(acme)
    processes, events, lines = 3, 15, 200
    env = {**os.environ, "DATABASE_URL": live_db_url, "PYTHONPATH": str(ROOT),
           "OWLLAYER_AUDIT_ANCHOR_FILE": str(anchor_file), "OWLLAYER_AUDIT_ANCHOR_EVENTS": "1",
           "OWLLAYER_AUDIT_ANCHOR_URL": ""}
    children = [
        subprocess.Popen([sys.executable, "-m", "tests.approvals.anchor_appender", str(acme.pk),
                          str(events), str(lines)], cwd=ROOT, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        for _ in range(processes)
    ]
    # Meanwhile this process appends too, from threads.
    workers = [threading.Thread(target=lambda: [append(acme) for _ in range(5)]) for _ in range(2)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    outputs = [child.communicate(timeout=300)[0].decode() for child in children]
    assert [child.returncode for child in children] == [0] * processes, outputs
    assert anchors.flush(timeout=PATIENCE)

    result = verify_chain()
    assert result.ok, result.problem
    assert result.count == 1 + 2 * 5 + processes * events
    written = checkpoints(anchor_file)  # every line whole, parsed and signed
    assert sum(1 for c in written if c.seq == 1) >= processes * lines
    assert max(c.seq for c in written) == result.count
    report = audit_report()
    assert report.ok, [finding.text for finding in report.findings]
    assert report.unanchored == 0
