"""What `make run` and `make test` install, read from make's dry run (`make -n`,
which prints each command instead of running it; no recipe of these targets
starts a sub-make, which -n would run).

`make run` installs only what serving needs: requirements.txt and eSpeak NG
(the offline voice). Chromium, Node.js, nginx and requirements-dev.txt are
for `make test`, `make setup` and `make bench`. Each requirements file has
its own stamp in the virtualenv, so one made by `make run` gets the rest at
the first `make test`.
"""
from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.support.daphne import PROJECT_ROOT

REQUIREMENTS = PROJECT_ROOT / "requirements.txt"
DEV_REQUIREMENTS = PROJECT_ROOT / "requirements-dev.txt"


def dry_run(target: str, venv: Path, *variables: str) -> list[str]:
    """The commands `make <target> [NAME=value...]` would run with the virtualenv at `venv`."""
    env = {name: value for name, value in os.environ.items()
           if name not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEFILES")}
    done = subprocess.run(
        ["make", "--no-print-directory", "-n", target, f"VENV={venv}", *variables],
        cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def pip_installs(commands: list[str]) -> list[str]:
    """The requirements files pip would install, in order."""
    return [file for line in commands if "-m pip install " in line
            for file in re.findall(r"-r (\S+)", line)]


def apt_installs(commands: list[str]) -> set[str]:
    """The Debian packages the recipes would install (when missing, as root)."""
    packages: set[str] = set()
    joined = "\n".join(commands).replace("\\\n", " ")
    for match in re.finditer(r"apt-get install -y ([^;\n]*)", joined):
        packages.update(word for word in match.group(1).split() if not word.startswith("-"))
    return packages


def makes_a_virtualenv(commands: list[str], venv: Path) -> bool:
    return any(line.endswith(f"-m venv {venv}") for line in commands)


def a_virtualenv(tmp_path: Path, *stamps: str) -> Path:
    """A virtualenv folder with these stamps, newer than both requirements files."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").touch()
    newer = max(REQUIREMENTS.stat().st_mtime, DEV_REQUIREMENTS.stat().st_mtime) + 60
    for stamp in stamps:
        (venv / stamp).touch()
        os.utime(venv / stamp, (newer, newer))
    return venv


def test_make_run_on_a_fresh_clone_installs_only_the_runtime_requirements_and_espeak(tmp_path):
    venv = tmp_path / "venv"

    commands = dry_run("run", venv)

    assert makes_a_virtualenv(commands, venv)
    assert pip_installs(commands) == ["requirements.txt"]
    assert apt_installs(commands) == {"espeak-ng"}
    assert not any("chromium" in line or "nodejs" in line or "nginx" in line for line in commands)


def test_make_test_on_a_fresh_clone_installs_the_dev_requirements_chromium_nodejs_and_nginx(tmp_path):
    venv = tmp_path / "venv"

    commands = dry_run("test", venv)

    assert makes_a_virtualenv(commands, venv)
    assert pip_installs(commands) == ["requirements-dev.txt"]
    # nginx: the reverse-proxy tests put the documented server block in front of daphne.
    assert {"chromium", "chromium-driver", "nodejs", "espeak-ng", "nginx"} <= apt_installs(commands)


def test_make_bench_installs_nginx_besides_the_dev_requirements(tmp_path):
    commands = dry_run("bench", tmp_path / "venv")

    assert pip_installs(commands) == ["requirements-dev.txt"]
    assert "nginx" in apt_installs(commands)


def a_stand_in_virtualenv(tmp_path: Path) -> Path:
    """A virtualenv whose python only notes its arguments in `calls` (so
    make's install recipes can run here for real, installing nothing)."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    python = venv / "bin" / "python"
    python.write_text(f'#!/bin/sh\necho "$*" >> {venv / "calls"}\n')
    python.chmod(0o755)
    return venv


def install(venv: Path, stamp: str) -> list[str]:
    """Run make's install rule for `stamp` for real; the python calls it made."""
    env = {name: value for name, value in os.environ.items()
           if name not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEFILES")}
    done = subprocess.run(["make", "--no-print-directory", f"VENV={venv}", str(venv / stamp)],
                          cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    calls = venv / "calls"
    return calls.read_text().splitlines() if calls.exists() else []


def test_a_virtualenv_made_by_make_run_gets_the_dev_requirements_at_the_first_make_test(tmp_path):
    venv = a_stand_in_virtualenv(tmp_path)
    assert pip_installs(install(venv, ".installed-runtime")) == ["requirements.txt"]

    assert pip_installs(dry_run("run", venv)) == []
    assert pip_installs(dry_run("test", venv)) == ["requirements-dev.txt"]


def test_a_virtualenv_made_by_make_test_is_used_by_make_run_as_it_is(tmp_path):
    venv = a_stand_in_virtualenv(tmp_path)
    assert pip_installs(install(venv, ".installed")) == ["requirements-dev.txt"]

    assert pip_installs(dry_run("run", venv)) == []
    assert pip_installs(dry_run("test", venv)) == []


@pytest.mark.parametrize("target, file", [("run", "requirements.txt"), ("test", "requirements-dev.txt")])
def test_requirements_changed_since_the_last_install_are_installed_again(tmp_path, target, file):
    venv = a_virtualenv(tmp_path, ".installed", ".installed-runtime")
    older = min(REQUIREMENTS.stat().st_mtime, DEV_REQUIREMENTS.stat().st_mtime) - 60
    for stamp in (".installed", ".installed-runtime"):
        os.utime(venv / stamp, (older, older))

    assert pip_installs(dry_run(target, venv)) == [file]


@pytest.mark.parametrize("target", ["lint-only", "test"])
def test_make_lint_and_make_test_check_style_types_and_dead_code(tmp_path, target):
    venv = a_virtualenv(tmp_path, ".installed", ".installed-runtime")

    joined = "\n".join(dry_run(target, venv))

    for tool in (f"{venv}/bin/ruff check .", f"{venv}/bin/mypy", f"{venv}/bin/vulture "):
        assert tool in joined
    assert "tools/vulture_allow.py" in joined


def test_make_widget_release_cuts_the_named_release_with_the_release_module_and_installs_nothing(tmp_path):
    venv = a_virtualenv(tmp_path)

    commands = dry_run("widget-release", venv, "RELEASE=1.2.3")

    assert commands[-1] == f'{venv}/bin/python -m widget.releases "1.2.3"'
    assert pip_installs(commands) == [] and apt_installs(commands) == set()
