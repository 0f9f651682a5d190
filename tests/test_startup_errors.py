"""The start-up checks of owllayer_site/startup_errors.py, without a server."""
from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest
from django.core.exceptions import ImproperlyConfigured

from owllayer_site import startup_errors
from tests.support.daphne import PROJECT_ROOT


@pytest.mark.parametrize("url, shown", [
    ("postgres://owl:hunter2@db:5432/owllayer", "postgres://owl:***@db:5432/owllayer"),
    ("redis://:hunter2@redis:6379/0", "redis://:***@redis:6379/0"),
    ("postgres://owl@db/owllayer", "postgres://owl@db/owllayer"),
    ("sqlite:////srv/owl/db.sqlite3", "sqlite:////srv/owl/db.sqlite3"),
])
def test_a_printed_url_never_shows_its_password(url, shown):
    assert startup_errors.hide_password(url) == shown


def test_a_port_someone_listens_on_is_named_in_use_and_a_free_one_is_not():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]

        said = startup_errors.port_in_use("127.0.0.1", port)

    assert said is not None and said.startswith(f"port {port} on 127.0.0.1 is already in use")
    assert startup_errors.port_in_use("127.0.0.1", port) is None


def test_unusable_settings_are_explained_with_where_every_setting_is_listed():
    said = startup_errors.explain(ImproperlyConfigured("OWLLAYER_X must be an integer, got 'ten'"))

    assert said.startswith("The settings cannot be used: OWLLAYER_X must be an integer")
    assert "docs/configuration.md" in said


def test_a_failure_that_is_not_a_setup_problem_is_left_to_its_traceback():
    assert startup_errors.explain(KeyError("session")) is None


def test_an_unusable_redis_url_stops_the_settings_with_its_reason():
    # Another interpreter: the settings module is read once per process.
    env = {**os.environ, "DJANGO_DEBUG": "true", "REDIS_URL": "redis://localhost:notaport/0"}
    done = subprocess.run([sys.executable, "-c", "import owllayer_site.settings"], cwd=PROJECT_ROOT,
                          env=env, capture_output=True, text=True, timeout=60)

    assert done.returncode != 0
    assert "REDIS_URL is not a usable redis:// URL: Port could not be cast" in done.stderr
