"""A served process raises its soft open-files limit to the hard one
(owllayer_site.serve): every page holds a socket, and a soft limit of 1,024
would refuse pages long before the process is busy."""
from __future__ import annotations

import os
import resource
from pathlib import Path

import pytest

pytestmark = pytest.mark.django_db(transaction=True)


def soft_open_files_limit(pid: int) -> int:
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            return int(line.split()[3])
    raise AssertionError("no open-files line in /proc/<pid>/limits")


def open_files_now() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_a_served_process_may_hold_as_many_sockets_as_the_hard_limit_allows(daphne_factory):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    # Low, but above what this test process holds already (after a long run, more
    # than 256): starting the server opens a few more here.
    low = min(max(256, open_files_now() + 128), hard)
    if low == hard:
        pytest.skip("the hard open-files limit leaves nothing to raise")
    # The server inherits this process's limits: a low soft limit first.
    resource.setrlimit(resource.RLIMIT_NOFILE, (low, hard))
    try:
        server = daphne_factory()
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert soft_open_files_limit(server.process.pid) == hard
