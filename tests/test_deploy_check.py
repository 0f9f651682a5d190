"""`manage.py check --deploy` is clean in production mode with OWLLAYER_HTTPS=true."""
from __future__ import annotations

import os
import secrets
import subprocess
import sys
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[1]


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
