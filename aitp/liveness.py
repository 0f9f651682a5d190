"""The liveness rules of server processes: is the process behind a
``ServerProcess`` row gone? (The rules are listed in ``aitp.processes``.)

Kept apart from the process's lifecycle and sweep so that the services,
which count a key's live sessions without those of gone processes, and the
sweep, which closes rows through the services, import in one direction.
"""
from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.utils import timezone

from aitp.models import ServerProcess
from runtime.config import config

# A pid running a process that started this long after the row was
# registered is someone else's: the clock of /proc and ours may differ by
# a tick, and registration always comes seconds after the process started.
START_TIME_TOLERANCE = timedelta(seconds=2)

_current_id = ""


def current_id() -> str:
    """This process's ServerProcess id, or "" when none was registered."""
    return _current_id


def set_current_id(process_id: str) -> None:
    global _current_id
    _current_id = process_id


def hostname() -> str:
    """This host as the liveness rules see it: the host name and the pid
    namespace, so containers sharing a host name (host networking) never
    judge each other's pids."""
    name = socket.gethostname()
    try:
        namespace = os.readlink("/proc/self/ns/pid")  # "pid:[4026531836]"
    except OSError:
        return name[:200]
    return f"{name} {namespace}"[:200]


def _clock_ticks() -> int:
    try:
        return os.sysconf("SC_CLK_TCK")
    except (ValueError, OSError, AttributeError):
        return 100


def _boot_time() -> float | None:
    try:
        with open("/proc/stat") as stat:
            for line in stat:
                if line.startswith("btime "):
                    return float(line.split()[1])
    except OSError:
        return None
    return None


@dataclass(frozen=True)
class PidState:
    running: bool
    started_at: datetime | None  # when the process now holding the pid started, if known


def pid_state(pid: int) -> PidState:
    """Whether ``pid`` runs a live process on this host, and since when.

    A zombie (killed, not yet reaped by its parent) is not running."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            raw = stat.read()
    except FileNotFoundError:
        return PidState(False, None)
    except OSError:
        raw = None
    if raw is None:  # no /proc: ask the kernel whether the pid exists
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return PidState(False, None)
        except PermissionError:
            pass
        return PidState(True, None)
    # The command name (field 2) is in parentheses and may hold spaces.
    fields = raw[raw.rfind(")") + 2:].split()
    state, start_ticks = fields[0], int(fields[19])
    if state in ("Z", "X", "x"):
        return PidState(False, None)
    boot = _boot_time()
    if boot is None:
        return PidState(True, None)
    started = datetime.fromtimestamp(boot + start_ticks / _clock_ticks(), tz=UTC)
    return PidState(True, started)


def is_gone(process: ServerProcess, *, now: datetime, this_host: str | None = None) -> bool:
    """The liveness rules of the module docstring, for one process row."""
    if process.stopped_at is not None:
        return True
    if process.last_seen_at < now - timedelta(seconds=3 * config().store.heartbeat_interval):
        return True
    if process.hostname == (this_host or hostname()):
        if process.id == _current_id:
            return False
        state = pid_state(process.pid)
        if not state.running:
            return True
        if state.started_at is not None and state.started_at > process.started_at + START_TIME_TOLERANCE:
            return True  # the pid now belongs to a process started after this one registered
    return False


def gone_ids(process_ids, *, now: datetime | None = None) -> set[str]:
    """Of these process ids, those known to be gone (ids without a row are
    left to the heartbeat rule)."""
    now = now or timezone.now()
    ids = {pid for pid in process_ids if pid}
    if not ids:
        return set()
    here = hostname()
    return {row.id for row in ServerProcess.objects.filter(id__in=ids) if is_gone(row, now=now, this_host=here)}
