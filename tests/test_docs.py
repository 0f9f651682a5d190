"""The README documents every setting the server reads from the environment."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def environment_variables_read_by_settings() -> set[str]:
    source = (ROOT / "owllayer_site" / "settings.py").read_text()
    names = set(re.findall(r'env_(?:str|bool|int|float|list|choice)\(\s*"([A-Z_]+)"', source))
    names |= set(re.findall(r'os\.environ\.get\(\s*"([A-Z_]+)"', source))
    return names


def test_the_settings_read_the_variables_this_check_expects():
    names = environment_variables_read_by_settings()
    assert {"DATABASE_URL", "REDIS_URL", "DJANGO_SECRET_KEY", "OWLLAYER_WS_PATH"} <= names


def test_the_readme_documents_every_environment_variable():
    readme = (ROOT / "README.md").read_text()
    missing = sorted(name for name in environment_variables_read_by_settings() if f"`{name}`" not in readme)
    assert missing == []


def test_the_readme_shows_the_two_commands():
    readme = (ROOT / "README.md").read_text()
    assert "make run" in readme and "make test" in readme
