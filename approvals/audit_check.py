"""The full check of the audit trail (``manage.py verify_audit``): the chain
in the database, walked link by link (``approvals.audit``), and every
checkpoint of the anchor files (``approvals.anchors``) compared with it.

Each finding is one plain paragraph; the check passes only when none of
them is a failure. Events after the newest checkpoint are reported, but are
no failure: they are checked by their keyed hashes, and only their removal
would go unseen until a checkpoint covers them.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from approvals import anchors
from approvals.anchors import AnchorLine
from approvals.audit import ChainWalk, walk_chain
from approvals.audit_keys import current_key, key_ring
from approvals.models import AuditEvent
from runtime.config import config

LOOKUP_BATCH = 500


@dataclass(frozen=True)
class Finding:
    failed: bool
    text: str


@dataclass(frozen=True)
class AuditReport:
    findings: tuple[Finding, ...]
    events: int  # events checked
    checkpoints: int  # checkpoints that match the database
    unanchored: int  # events after the newest matching checkpoint

    @property
    def ok(self) -> bool:
        return not any(finding.failed for finding in self.findings)


@dataclass
class _Findings:
    items: list[Finding] = field(default_factory=list)

    def ok(self, text: str) -> None:
        self.items.append(Finding(False, text))

    def failed(self, text: str) -> None:
        self.items.append(Finding(True, text))


def _events(n: int) -> str:
    return f"{n} event" if n == 1 else f"{n} events"


def _later(n: int, one: str, several: str) -> str:
    """" 1 later checkpoint <one>." / " N later checkpoints <several>."; "" for none."""
    if not n:
        return ""
    return f" 1 later checkpoint {one}." if n == 1 else f" {n} later checkpoints {several}."


def audit_report(*, anchor_files: list[str] | None = None) -> AuditReport:
    """Check the chain and the given anchor files (by default the configured
    one). The files are read before the database, so a checkpoint written
    while the check runs is always of an event the walk can see."""
    files = list(anchor_files) if anchor_files is not None else (
        [config().audit.anchor_file] if config().audit.anchor_file else [])
    ring = key_ring()
    read: dict[str, list[AnchorLine] | OSError] = {}
    for path in files:
        try:
            read[path] = anchors.read_lines(path, ring)
        except OSError as exc:
            read[path] = exc
    walk = walk_chain()
    found = _Findings()
    _report_chain(walk, found)
    keyed_events = walk.result.count - walk.plain if walk.result.ok else _keyed_count(walk)
    newest = 0
    checkpoints = 0
    removed = False
    for path, lines in read.items():
        if isinstance(lines, OSError):
            _report_unreadable(path, lines, keyed_events, found)
            continue
        matched, top, beyond_end = _report_file(path, lines, walk, found)
        checkpoints += matched
        newest = max(newest, top)
        removed = removed or beyond_end
    if not files:
        found.ok(
            "No anchor file is configured (OWLLAYER_AUDIT_ANCHOR_FILE is off) and none was named "
            "(--anchors): the chain was checked against its own hashes only, so removing its "
            "newest events, or rewriting it with the audit key, would not show."
        )
    unanchored = 0
    # (Not when a checkpoint lies past the end: the events after it are gone.)
    if walk.result.ok and walk.head_seq > newest and files and not removed:
        unanchored = walk.head_seq - newest
        first = newest + 1
        span = f"#{first}" if first == walk.head_seq else f"#{first} to #{walk.head_seq}"
        after = (f"after the newest checkpoint (event #{newest})" if newest
                 else "and no checkpoint covers any event yet")
        found.ok(
            f"{_events(unanchored)} ({span}) {'is' if unanchored == 1 else 'are'} not yet anchored, "
            f"{after}. {'Its hash checks' if unanchored == 1 else 'Their hashes check'} out, but "
            f"{'its' if unanchored == 1 else 'their'} removal would not show until a checkpoint "
            f"covers {'it' if unanchored == 1 else 'them'} (one is written every "
            f"{config().audit.anchor_events} events or "
            f"{config().audit.anchor_seconds:g} seconds, and by "
            "`manage.py anchor_audit`)."
        )
    return AuditReport(tuple(found.items), walk.result.count, checkpoints, unanchored)


def _keyed_count(walk: ChainWalk) -> int:
    return AuditEvent.objects.filter(seq__gte=walk.keyed_from).count()


def _report_chain(walk: ChainWalk, found: _Findings) -> None:
    result = walk.result
    if not result.ok:
        where = f" at event #{result.first_bad_seq}" if result.first_bad_seq is not None else ""
        found.failed(
            f"The audit chain is broken{where}: {result.problem}. "
            f"{_events(result.count)} before it checked out; nothing after it was checked."
        )
        return
    if result.count == 0:
        found.ok("The audit chain is empty: 0 events checked.")
        return
    parts = [f"The audit chain is intact: {_events(result.count)} checked (#1 to #{result.count}), "
             "every hash and every link."]
    if walk.plain:
        parts.append(f"Events #1 to #{walk.plain} are plain SHA-256 links from before keyed "
                     f"hashing; the keyed chain starts at event #{walk.keyed_from}.")
    if walk.key_ids:
        current = current_key().id
        named = ", ".join(f"{key_id}{' (the current key)' if key_id == current else ''}"
                          for key_id in walk.key_ids)
        parts.append(f"Keyed events were hashed with key{'s' if len(walk.key_ids) > 1 else ''} "
                     f"{named}.")
    found.ok(" ".join(parts))


def _report_unreadable(path: str, error: OSError, keyed_events: int, found: _Findings) -> None:
    missing = isinstance(error, FileNotFoundError)
    what = (f"The anchor file {path} does not exist" if missing
            else f"The anchor file {path} cannot be read ({error.strerror or error})")
    if keyed_events:
        found.failed(
            f"{what}, though the chain holds {_events(keyed_events)} written since checkpoints "
            "began: it was removed or moved, or anchoring never worked. Nothing shows whether "
            "the newest events were removed."
        )
    else:
        found.ok(f"{what}; no keyed event needs it yet.")


def _stored_hashes(seqs: set[int]) -> dict[int, str]:
    ordered = sorted(seqs)
    stored: dict[int, str] = {}
    for start in range(0, len(ordered), LOOKUP_BATCH):
        batch = ordered[start:start + LOOKUP_BATCH]
        stored.update(AuditEvent.objects.filter(seq__in=batch).values_list("seq", "hash"))
    return stored


def _report_file(path: str, lines: list[AnchorLine], walk: ChainWalk,
                 found: _Findings) -> tuple[int, int, bool]:
    """Compare one file's checkpoints with the database; (how many matched,
    the newest event a matching checkpoint covers, whether one lies past the
    chain's end)."""
    checkpoints = [line for line in lines if line.checkpoint is not None]
    stored = _stored_hashes({line.checkpoint.seq for line in checkpoints if line.checkpoint})
    chain_end = max(stored, default=0)
    chain_end = max(chain_end, walk.head_seq)
    matched, newest = 0, 0
    truncated: list[AnchorLine] = []
    rewritten: list[AnchorLine] = []
    moved_boundary: list[AnchorLine] = []
    for line in checkpoints:
        checkpoint = line.checkpoint
        assert checkpoint is not None
        if checkpoint.seq > chain_end:
            truncated.append(line)
        elif stored.get(checkpoint.seq) != checkpoint.hash:
            rewritten.append(line)
        elif checkpoint.keyed_from != walk.keyed_from:
            moved_boundary.append(line)
        else:
            matched += 1
            newest = max(newest, checkpoint.seq)
    if matched:
        found.ok(f"{matched} checkpoint{'s' if matched != 1 else ''} in {path} "
                 f"match{'es' if matched == 1 else ''} the database (the newest covers event #{newest}).")
    elif not lines:
        found.ok(f"The anchor file {path} holds no checkpoint yet.")
    if truncated:
        first = truncated[0]
        assert first.checkpoint is not None
        top = max(line.checkpoint.seq for line in truncated if line.checkpoint)
        found.failed(
            f"The checkpoint on line {first.number} of {path} (written {first.checkpoint.at} by "
            f"{first.checkpoint.by}) records event #{first.checkpoint.seq}, but the database's "
            f"chain ends at event #{chain_end}: events after #{chain_end} (up to #{top} at "
            "least) were removed, or the database was restored from an older copy."
            + _later(len(truncated) - 1, "lies beyond the end too", "lie beyond the end too")
        )
    if rewritten:
        first = rewritten[0]
        assert first.checkpoint is not None
        seq = first.checkpoint.seq
        now = stored.get(seq)
        has = f"has hash {now[:16]}…" if now else "is missing"
        found.failed(
            f"The checkpoint on line {first.number} of {path} (written {first.checkpoint.at}) "
            f"records event #{seq} with hash {first.checkpoint.hash[:16]}…, but the database's "
            f"event #{seq} {has}: the chain was rewritten at or before event #{seq}."
            + _later(len(rewritten) - 1, "does not match either", "do not match either")
        )
    if moved_boundary:
        first = moved_boundary[0]
        assert first.checkpoint is not None
        found.failed(
            f"The checkpoint on line {first.number} of {path} says the keyed chain starts at "
            f"event #{first.checkpoint.keyed_from}, but the database says it starts at event "
            f"#{walk.keyed_from}: keyed events were rewritten as plain ones, or the chain head "
            "was altered." + _later(len(moved_boundary) - 1, "disagrees the same way", "disagree the same way")
        )
    _report_bad_lines(path, lines, found)
    return matched, newest, bool(truncated)


def _report_bad_lines(path: str, lines: list[AnchorLine], found: _Findings) -> None:
    by_kind: dict[str, list[AnchorLine]] = {}
    for line in lines:
        if line.problem is not None:
            by_kind.setdefault(line.problem.kind, []).append(line)
    others = {kind: len(bad) - 1 for kind, bad in by_kind.items()}
    if "bad_signature" in by_kind:
        first = by_kind["bad_signature"][0]
        found.failed(
            f"Line {first.number} of {path} is a checkpoint with a bad signature: the key it "
            "names did not sign it, so it was forged or altered after it was written."
            + _later(others["bad_signature"], "is bad the same way", "are bad the same way")
        )
    if "unknown_key" in by_kind:
        first = by_kind["unknown_key"][0]
        assert first.problem is not None
        found.failed(
            f"Line {first.number} of {path} is signed with key {first.problem.key_id}, which is "
            "not configured: add the key it was written with to OWLLAYER_AUDIT_OLD_KEYS to "
            "check it (or the line was forged)."
            + _later(others["unknown_key"], "names a key that is not configured",
                     "name keys that are not configured")
        )
    if "damaged" in by_kind:
        first = by_kind["damaged"][0]
        found.failed(
            f"Line {first.number} of {path} is not a checkpoint (not JSON, or a field is missing "
            "or of the wrong kind): the file was damaged or edited."
            + (f" {others['damaged']} more line{'s are' if others['damaged'] != 1 else ' is'} "
               "damaged." if others["damaged"] else "")
        )
