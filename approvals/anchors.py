"""Checkpoints of the audit chain, kept outside the database.

A checkpoint says "event #seq of the chain has hash H, and the keyed chain
starts at event #K", signed with the audit key (``approvals.audit_keys``).
Each is one JSON line appended to ``OWLLAYER_AUDIT_ANCHOR_FILE`` and, when
``OWLLAYER_AUDIT_ANCHOR_URL`` is set, POSTed there. Someone who can write
the database but not the anchors can no longer remove the newest events or
rewrite the chain unseen: ``manage.py verify_audit`` compares every
checkpoint with the database (``approvals.audit_check``).

When: the appender's transaction offers each event once it has committed
(``committed``, called from ``transaction.on_commit``); a thread of this
process writes a checkpoint of the newest one it was offered when this
process has anchored nothing yet, every ``OWLLAYER_AUDIT_ANCHOR_EVENTS``
events, and ``OWLLAYER_AUDIT_ANCHOR_SECONDS`` after the last checkpoint
when newer events wait -- never inside the transaction, never under the
chain's lock, never on the caller's thread. The file and the address are
written by that thread; a failure is logged once per
``OWLLAYER_AUDIT_ANCHOR_SECONDS`` and never reaches an approval.

Several processes may append to one file: each line is one ``write()`` to a
descriptor opened with ``O_APPEND``, under an exclusive ``flock``, so lines
never interleave or tear (on a local file system or a shared volume that
honours ``flock``).
"""
from __future__ import annotations

import atexit
import fcntl
import hmac
import json
import logging
import os
import socket
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime

from approvals.audit_keys import AuditKey, current_key
from runtime.config import config

logger = logging.getLogger(__name__)

CHECKPOINT_FORMAT = "owllayer-audit-checkpoint-v1"


# --- one checkpoint, as a signed line --------------------------------------------


@dataclass(frozen=True)
class Checkpoint:
    seq: int
    hash: str
    keyed_from: int
    key_id: str
    at: str  # when it was written, ISO 8601 in UTC
    by: str  # which process wrote it (host:pid)


def _signed_text(checkpoint: Checkpoint) -> str:
    fields = [CHECKPOINT_FORMAT, checkpoint.seq, checkpoint.hash, checkpoint.keyed_from,
              checkpoint.key_id, checkpoint.at, checkpoint.by]
    return json.dumps(fields, separators=(",", ":"), ensure_ascii=False)


def checkpoint_line(*, seq: int, hash: str, keyed_from: int, key: AuditKey | None = None,
                    at: datetime | None = None) -> str:
    """The signed line recording that event #seq of the chain has ``hash``."""
    key = key or current_key()
    checkpoint = Checkpoint(
        seq=seq, hash=hash, keyed_from=keyed_from, key_id=key.id,
        at=(at or datetime.now(UTC)).astimezone(UTC).isoformat(timespec="seconds"),
        by=f"{socket.gethostname()[:80]}:{os.getpid()}",
    )
    record = {**checkpoint.__dict__, "sig": key.sign(_signed_text(checkpoint))}
    return json.dumps(record, sort_keys=True, separators=(",", ":"), ensure_ascii=False) + "\n"


class BadLine(ValueError):
    """A line that is no checkpoint, or one whose signature does not hold."""

    def __init__(self, kind: str, key_id: str = "") -> None:
        self.kind = kind  # "damaged", "unknown_key" or "bad_signature"
        self.key_id = key_id
        super().__init__(kind)


def parse_line(line: str, ring: dict[str, AuditKey]) -> Checkpoint:
    """The checkpoint a line records, its signature checked against ``ring``."""
    try:
        record = json.loads(line)
        checkpoint = Checkpoint(
            seq=record["seq"], hash=record["hash"], keyed_from=record["keyed_from"],
            key_id=record["key_id"], at=record["at"], by=record["by"],
        )
        signature = record["sig"]
    except (ValueError, KeyError, TypeError):
        raise BadLine("damaged") from None
    if not (isinstance(checkpoint.seq, int) and isinstance(checkpoint.keyed_from, int)
            and all(isinstance(value, str) for value in
                    (checkpoint.hash, checkpoint.key_id, checkpoint.at, checkpoint.by, signature))):
        raise BadLine("damaged")
    key = ring.get(checkpoint.key_id)
    if key is None:
        raise BadLine("unknown_key", checkpoint.key_id)
    if not hmac.compare_digest(key.sign(_signed_text(checkpoint)).encode(), signature.encode("utf-8")):
        raise BadLine("bad_signature", checkpoint.key_id)
    return checkpoint


# --- where lines go -----------------------------------------------------------------


def append_line(path: str, line: str) -> None:
    """Append one whole line to the anchor file, safely beside other
    processes: O_APPEND puts each write at the end, the lock keeps a writer
    on a file system that splits large writes from interleaving, and the
    line is on disk before this returns."""
    data = line.encode("utf-8")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o640)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            written = os.write(fd, data)
            if written != len(data):
                raise OSError(f"short write to {path}: {written} of {len(data)} bytes")
            os.fsync(fd)
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def post_line(url: str, line: str, *, timeout: float) -> None:
    """POST the checkpoint to the configured address; raises on anything but 2xx."""
    import httpx

    response = httpx.post(url, content=line.encode("utf-8"), timeout=timeout,
                          headers={"Content-Type": "application/json"})
    response.raise_for_status()


def enabled() -> bool:
    return bool(config().audit.anchor_file or config().audit.anchor_url)


def write_checkpoint(*, seq: int, hash: str, keyed_from: int) -> str:
    """Write one checkpoint to the file and the address now, raising what
    fails (``manage.py anchor_audit``). Returns the line."""
    line = checkpoint_line(seq=seq, hash=hash, keyed_from=keyed_from)
    if config().audit.anchor_file:
        append_line(config().audit.anchor_file, line)
    if config().audit.anchor_url:
        post_line(config().audit.anchor_url, line,
                  timeout=config().audit.anchor_timeout)
    return line


# --- this process's checkpoints, written behind -------------------------------------


class Anchorer:
    """Decides when this process writes a checkpoint, and writes it on a
    thread of its own (started with the first event offered)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._latest: tuple[int, str, int] | None = None  # (seq, hash, keyed_from)
        self._anchored = 0  # the newest event this process has anchored (0: none yet)
        self._anchored_at = 0.0  # time.monotonic() of that checkpoint
        self._writing = False
        self._force = False
        self._thread: threading.Thread | None = None
        self._warned_at: dict[str, float] = {}  # "file" / "url" -> when last logged
        self._exit_hook = False

    def committed(self, seq: int, hash: str, keyed_from: int) -> None:
        """An event that has committed (cheap: no I/O here)."""
        if not enabled():
            return
        with self._cond:
            if seq <= self._anchored:
                # A chain that starts again (another database): anchor it anew.
                self._anchored, self._latest = 0, None
            if self._latest is None or seq > self._latest[0]:
                self._latest = (seq, hash, keyed_from)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="audit-anchor", daemon=True)
                self._thread.start()
            if not self._exit_hook:
                # A clean exit anchors what this process appended last.
                atexit.register(self.flush, timeout=config().audit.anchor_timeout + 1)
                self._exit_hook = True
            self._cond.notify_all()

    def flush(self, timeout: float | None = None) -> bool:
        """Write a checkpoint of the newest event now if one is owed, and wait
        for it (tests, and the process's exit). False when it did not finish in time."""
        with self._cond:
            if not self._owed():
                return not self._writing or self._cond.wait_for(lambda: not self._writing, timeout)
            self._force = True
            self._cond.notify_all()
            return self._cond.wait_for(lambda: not self._owed() and not self._writing, timeout)

    def wait_until_anchored(self, seq: int, timeout: float | None = None) -> bool:
        """Wait until this process has anchored event #seq or a later one."""
        with self._cond:
            return self._cond.wait_for(lambda: self._anchored >= seq and not self._writing, timeout)

    def reset(self) -> None:
        """Forget what was anchored (a test's fresh database)."""
        with self._cond:
            self._latest, self._anchored, self._anchored_at = None, 0, 0.0
            self._warned_at.clear()

    def _owed(self) -> bool:
        return self._latest is not None and self._latest[0] > self._anchored

    def _wait(self) -> float | None:
        """Seconds until a checkpoint is due (0: now), None: nothing owed."""
        if not self._owed():
            return None
        assert self._latest is not None
        if self._force or self._anchored == 0:
            return 0.0
        if self._latest[0] - self._anchored >= config().audit.anchor_events:
            return 0.0
        return max(0.0, self._anchored_at + config().audit.anchor_seconds - time.monotonic())

    def _run(self) -> None:
        while True:
            with self._cond:
                while (wait := self._wait()) != 0.0:
                    self._cond.wait(wait)
                assert self._latest is not None
                seq, digest, keyed_from = self._latest
                # A flush asked for while this checkpoint is written is for
                # newer events: it stays asked for.
                self._writing, self._force = True, False
            try:
                self._write(seq, digest, keyed_from)
            finally:
                with self._cond:
                    # Done (or failed and logged): the next checkpoint comes
                    # with the next events or the next interval.
                    self._anchored = max(self._anchored, seq)
                    self._anchored_at = time.monotonic()
                    self._writing = False
                    self._cond.notify_all()

    def _write(self, seq: int, digest: str, keyed_from: int) -> None:
        try:
            line = checkpoint_line(seq=seq, hash=digest, keyed_from=keyed_from)
        except Exception:
            logger.exception("audit checkpoint of event #%s could not be made", seq)
            return
        path, url = config().audit.anchor_file, config().audit.anchor_url
        if path:
            try:
                append_line(path, line)
            except Exception as exc:
                self._failed("file", f"could not append to {path} ({exc})")
            else:
                self._worked("file", f"appended to {path}")
        if url:
            try:
                post_line(url, line, timeout=config().audit.anchor_timeout)
            except Exception as exc:
                self._failed("url", f"could not be posted to {url} ({type(exc).__name__}: {exc})")
            else:
                self._worked("url", f"posted to {url}")

    def _failed(self, target: str, what: str) -> None:
        now = time.monotonic()
        last = self._warned_at.get(target)
        if last is None or now - last >= config().audit.anchor_seconds:
            self._warned_at[target] = now
            logger.warning("audit checkpoint %s; approvals go on, the newest events stay "
                           "unanchored until a checkpoint succeeds", what)

    def _worked(self, target: str, what: str) -> None:
        if self._warned_at.pop(target, None) is not None:
            logger.info("audit checkpoint %s again", what)


ANCHORER = Anchorer()


def committed(seq: int, hash: str, keyed_from: int) -> None:
    """An appended event committed (``approvals.audit.append_event``)."""
    ANCHORER.committed(seq, hash, keyed_from)


def flush(timeout: float | None = None) -> bool:
    return ANCHORER.flush(timeout)


# --- reading the file back ------------------------------------------------------------


@dataclass(frozen=True)
class AnchorLine:
    path: str
    number: int  # 1-based
    checkpoint: Checkpoint | None
    problem: BadLine | None


def read_lines(path: str, ring: dict[str, AuditKey]) -> list[AnchorLine]:
    """Every line of an anchor file, each parsed and its signature checked.
    Raises OSError when the file cannot be read."""
    found = []
    with open(path, encoding="utf-8", errors="replace") as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                found.append(AnchorLine(path, number, parse_line(line, ring), None))
            except BadLine as problem:
                found.append(AnchorLine(path, number, None, problem))
    return found
