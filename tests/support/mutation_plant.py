"""Run the collected tests once per mutant, in one pytest process.

From inside mutmut's ``mutants/`` directory (after a ``mutmut run`` made it),
with a file of mutant names, one a line:

    cd mutants && MUTANTS_FILE=../names.txt ../.venv/bin/python -m pytest \\
        -p no:randomly -p tests.support.mutation_run -p tests.support.mutation_plant -q TESTS

Each mutant is planted as mutmut plants it (``MUTANT_UNDER_TEST``, read by
the trampolines at each call, and inherited by a daphne process a test
starts from ``mutants/``), the tests run until the first failure, and one
line says ``killed NAME TEST`` or ``SURVIVED NAME``. It saves mutmut's
fork and warm-up per mutant, at the price of one process for all: a mutant
that leaves state behind could fail the tests of the next one, so the test
that failed is run twice more with no mutant, and when it fails then too the
line says ``UNSURE NAME TEST`` (worth mutmut's own run). A survivor found
here is worth a look.

Nothing is planted when a test file could not be collected, none was
selected, or a test fails with no mutant planted: each would make every
mutant look alike.
"""
from __future__ import annotations

import os

from _pytest.runner import runtestprotocol


def pytest_runtestloop(session) -> bool:
    with open(os.environ["MUTANTS_FILE"]) as names:
        mutants = [name.strip() for name in names if name.strip()]
    items = session.items
    if session.testsfailed or not items:
        raise session.Interrupted("no mutant planted: the tests were not all collected, or none was")
    runs = ["", *mutants]
    for number, name in enumerate(runs):
        # The first test runs next (for the next mutant): the fixtures of the
        # session, the test database among them, are set up once for all.
        then = None if number == len(runs) - 1 else items[0]
        os.environ["MUTANT_UNDER_TEST"] = name
        killed_by = None
        for index, item in enumerate(items):
            following = items[index + 1] if index + 1 < len(items) else then
            if _fails(item, following):
                killed_by = item
                break
        if killed_by is None:
            if name:
                print(f"SURVIVED {name}", flush=True)
            continue
        if not name:
            raise session.Failed(f"no mutant planted: {killed_by.nodeid} fails without one")
        # The same test twice more with no mutant: a failure then is the
        # state a test left behind, not the mutant's doing (a test that fails
        # every other run after one failure passes only one of the two).
        session._setupstate.teardown_exact(killed_by)
        os.environ["MUTANT_UNDER_TEST"] = ""
        doubt = _fails(killed_by, items[0]) or _fails(killed_by, then)
        if doubt:
            session._setupstate.teardown_exact(then)
        print(f"{'UNSURE' if doubt else 'killed'} {name} {killed_by.nodeid}", flush=True)
    os.environ.pop("MUTANT_UNDER_TEST", None)
    return True


def _fails(item, following) -> bool:
    reports = runtestprotocol(item, log=False, nextitem=following)
    return any(report.failed for report in reports)
