"""`manage.py check --deploy` is clean in production mode with OWLLAYER_HTTPS=true,
and with exactly the environment docs/operations.md's several-process example sets."""
from __future__ import annotations

import os
import re
import secrets
import shlex
import subprocess
import sys
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[1]
OPERATIONS_DOC = PROJECT_ROOT / "docs" / "operations.md"
# The example writes "..." where a secret goes.
PLACEHOLDER = "..."


def check_deploy(**env: str) -> subprocess.CompletedProcess:
    full_env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("OWLLAYER_", "DJANGO_"))},
        "DJANGO_DEBUG": "false",
        "DJANGO_SECRET_KEY": secrets.token_urlsafe(60),
        "ALLOWED_HOSTS": "owllayer.example",
        **env,
    }
    return subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=PROJECT_ROOT, env=full_env, capture_output=True, text=True, timeout=120,
    )


def test_check_deploy_is_clean_with_https_settings():
    result = check_deploy(OWLLAYER_HTTPS="true")

    assert result.returncode == 0, result.stdout + result.stderr
    assert "System check identified no issues" in result.stdout + result.stderr


def test_without_https_settings_check_deploy_names_what_is_missing():
    result = check_deploy()

    output = result.stdout + result.stderr
    assert result.returncode != 0
    for code in ("security.W004", "security.W008", "security.W012", "security.W016"):
        assert code in output


def documented_several_process_environment() -> dict[str, str]:
    """The variables the "Running several processes" example of docs/operations.md exports."""
    section = OPERATIONS_DOC.read_text().split("## Running several processes", 1)[1].split("\n## ", 1)[0]
    block = next(b for b in re.findall(r"```sh\n(.*?)```", section, flags=re.DOTALL)
                 if "owllayer_site.serve" in b)
    env: dict[str, str] = {}
    for line in block.splitlines():
        words = shlex.split(line, comments=True)
        if words[:1] == ["export"]:
            env.update(word.split("=", 1) for word in words[1:])
    return env


def test_the_documented_several_process_example_passes_check_deploy_without_a_warning():
    env = documented_several_process_environment()
    assert env.get("DJANGO_SECRET_KEY") == PLACEHOLDER  # the one value the reader supplies
    env["DJANGO_SECRET_KEY"] = secrets.token_urlsafe(50)
    clean = {k: v for k, v in os.environ.items()
             if not k.startswith(("OWLLAYER_", "DJANGO_")) and k not in ("DATABASE_URL", "REDIS_URL", "ALLOWED_HOSTS")}

    result = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=PROJECT_ROOT, env={**clean, **env}, capture_output=True, text=True, timeout=120,
    )

    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "System check identified no issues" in output
    assert "WARNINGS" not in output
