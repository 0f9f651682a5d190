"""`make lint`'s dead-code check (vulture) and its list of names used where
vulture cannot look (tools/vulture_allow.py): the list holds only names
vulture would otherwise report, so code that goes takes its entry with it."""
from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

from tests.support.daphne import PROJECT_ROOT
from tests.test_makefile import dry_run

ALLOW_LIST = "tools/vulture_allow.py"


def vulture_command(tmp_path: Path) -> list[str]:
    """The vulture command `make lint` runs, as arguments."""
    (line,) = [line for line in dry_run("lint-only", tmp_path / "venv") if "/bin/vulture " in line]
    words = shlex.split(line[line.index("/bin/vulture "):].split("&&")[0])
    return [sys.executable, "-m", "vulture", *words[1:]]


def reported(command: list[str]) -> set[str]:
    done = subprocess.run(command, cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode in (0, 3), done.stderr
    return set(re.findall(r"unused \w+ '([^']+)'", done.stdout))


def test_every_name_on_the_allow_list_is_one_vulture_would_otherwise_report(tmp_path):
    command = vulture_command(tmp_path)
    assert ALLOW_LIST in command
    listed = set(re.findall(r"\b_\.(\w+)", (PROJECT_ROOT / ALLOW_LIST).read_text()))

    without = reported([word for word in command if word != ALLOW_LIST])

    assert listed, "the allow list names nothing"
    assert sorted(listed - without) == []
