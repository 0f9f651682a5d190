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
that leaves state behind can fail the tests of the next one, so a survivor
found here is worth a look and a kill is worth a second one when in doubt.
"""
from __future__ import annotations

import os

from _pytest.runner import runtestprotocol


def pytest_runtestloop(session) -> bool:
    with open(os.environ["MUTANTS_FILE"]) as names:
        mutants = [name.strip() for name in names if name.strip()]
    items = session.items
    for name in mutants:
        os.environ["MUTANT_UNDER_TEST"] = name
        killed_by = ""
        for index, item in enumerate(items):
            following = items[index + 1] if index + 1 < len(items) else None
            reports = runtestprotocol(item, log=False, nextitem=following)
            if any(report.failed for report in reports):
                killed_by = item.nodeid
                if following is not None:
                    session._setupstate.teardown_exact(None)
                break
        print(f"killed {name} {killed_by}" if killed_by else f"SURVIVED {name}", flush=True)
    os.environ.pop("MUTANT_UNDER_TEST", None)
    return True
