"""Test-wide fixtures and markers.

Environment defaults the settings need (DJANGO_DEBUG, OWLLAYER_LLM) are set
in pytest.ini through pytest-env: pytest-django imports the settings before
this file is loaded, so setting them here would be too late.
"""
from __future__ import annotations

import os
import shutil
from collections.abc import AsyncIterator, Iterator
from urllib.parse import quote

import pytest

from tests.support.daphne import DaphneFactory, server_env

CHROMIUM = "/usr/bin/chromium"
# Headless Debian Chromium on a machine without outside network: without the
# background-networking flags it keeps trying to reach Google's hosts.
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


# The Python client waits 5 s for a handshake or a frame, as the deployed
# browser client does. Two suites, Chromium and a dozen daphne processes on
# two loaded cores can take longer than that without anything being wrong,
# so tests wait longer unless a test names its own timeout.
CLIENT_PATIENCE = 30.0


def pytest_configure(config: pytest.Config) -> None:
    import aitp_client.client

    aitp_client.client.HANDSHAKE_TIMEOUT = CLIENT_PATIENCE
    aitp_client.client.FRAME_TIMEOUT = CLIENT_PATIENCE


@pytest.fixture(scope="session", autouse=True)
def site_application_loaded() -> None:
    """The site's ASGI module is loaded once, before any test reads its log:
    loading it sets Django up again, which replaces the logging handlers
    (among them the one a test's ``caplog`` reads)."""
    import owllayer_site.asgi  # noqa: F401


@pytest.fixture(autouse=True)
def model_access_forgotten(monkeypatch: pytest.MonkeyPatch) -> None:
    """What a test's turns find of the model's access (runtime.model_access,
    one value per process) does not become the next test's admin banner."""
    from runtime import model_access

    monkeypatch.setattr(model_access, "_current", model_access.current())


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "daphne_factory" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.e2e)


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("redis") and not os.environ.get("REDIS_URL"):
        pytest.skip("needs REDIS_URL (the second pass of `make test` sets it)")
    if item.get_closest_marker("browser") and not os.path.exists(CHROMIUM):
        if os.environ.get("CI") == "true":
            pytest.fail(f"{CHROMIUM} is missing in CI (`make setup` installs it)")
        pytest.skip(f"needs {CHROMIUM} (`make setup` installs it as root)")


@pytest.fixture(scope="session")
def django_db_modify_db_settings(django_db_modify_db_settings_parallel_suffix: None) -> None:
    """Give each run its own test database.

    Several people run the suite in one checkout and on one PostgreSQL at
    once; with a shared name, one run would drop the other's database.
    """
    from django.conf import settings

    suffix = f"p{os.getpid()}"
    for db_settings in settings.DATABASES.values():
        test_settings = db_settings.setdefault("TEST", {})
        test_name = test_settings.get("NAME")
        if not test_name:
            if db_settings["ENGINE"] == "django.db.backends.sqlite3":
                continue  # in-memory: private to this process already
            test_name = f"test_{db_settings['NAME']}"
        test_settings["NAME"] = f"{test_name}_{suffix}"


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup: None, django_db_blocker) -> Iterator[None]:
    """pytest-django's set-up, plus a clean teardown on PostgreSQL.

    Connections opened in sync_to_async worker threads stay open after the
    last test, and PostgreSQL refuses to drop a database in use: end them
    first. The database is this run's own, so they are all ours.
    """
    yield
    from django.db import connections

    with django_db_blocker.unblock():
        for connection in connections.all():
            if connection.vendor != "postgresql":
                continue
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                    " WHERE datname = current_database() AND pid <> pg_backend_pid()"
                )


def database_url_for(settings_dict: dict) -> str:
    """A DATABASE_URL that points another process at the same database."""
    engine = settings_dict["ENGINE"]
    name = str(settings_dict["NAME"])
    if engine == "django.db.backends.sqlite3":
        if name == ":memory:" or name.startswith("file:"):
            raise RuntimeError("an in-memory sqlite database is invisible to another process")
        return f"sqlite:///{name}"
    if engine == "django.db.backends.postgresql":
        credentials = quote(settings_dict.get("USER") or "", safe="")
        if settings_dict.get("PASSWORD"):
            credentials += ":" + quote(settings_dict["PASSWORD"], safe="")
        host = settings_dict.get("HOST") or "127.0.0.1"
        port = settings_dict.get("PORT") or 5432
        at = "@" if credentials else ""
        return f"postgres://{credentials}{at}{host}:{port}/{quote(name, safe='')}"
    raise RuntimeError(f"no DATABASE_URL form known for {engine}")


@pytest.fixture
def live_db_url(django_db_setup: None) -> str:
    """The DATABASE_URL under which a subprocess sees this run's test database.

    SQLite: the test database file (settings put it beside manage.py).
    PostgreSQL: the test database pytest-django created.
    """
    from django.db import connection

    return database_url_for(connection.settings_dict)


@pytest.fixture
def daphne_factory(
    request: pytest.FixtureRequest, live_db_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[DaphneFactory]:
    """Start real daphne processes: ``server = daphne_factory(OWLLAYER_X="1")``.

    Each server listens on a free 127.0.0.1 port, uses the test database
    (``live_db_url``) and this process's environment (REDIS_URL included),
    plus the given overrides (None removes a variable). It returns once the
    port accepts connections, and fails with the server's output if the
    process died first. The server offers ``.port``, ``.http_url``,
    ``.ws_url(path="/owllayer", api_key=None)``, ``.logs()`` and ``.stop()``;
    every server is stopped when the test ends.

    The server is another process: it sees only committed rows, so the test
    must be marked ``@pytest.mark.django_db(transaction=True)``.
    """
    marker = request.node.get_closest_marker("django_db")
    transactional = "transactional_db" in request.fixturenames or (
        marker is not None
        and bool(marker.kwargs.get("transaction", marker.args[0] if marker.args else False))
    )
    if not transactional:
        pytest.fail(
            "daphne_factory needs @pytest.mark.django_db(transaction=True): "
            "the server process cannot see rows of an open test transaction"
        )
    factory = DaphneFactory(server_env(live_db_url), tmp_path_factory.mktemp("daphne"))
    try:
        yield factory
    finally:
        factory.stop_all()


@pytest.fixture
def redis_required() -> str:
    """The REDIS_URL of this run; skips the test when there is none."""
    url = os.environ.get("REDIS_URL", "")
    if not url:
        pytest.skip("needs REDIS_URL (the second pass of `make test` sets it)")
    return url


@pytest.fixture(scope="session")
def chromium_path() -> str:
    """The Debian Chromium binary for browser tests (`make setup` installs it)."""
    path = CHROMIUM if os.path.exists(CHROMIUM) else (shutil.which("chromium") or CHROMIUM)
    if not os.path.exists(path):
        if os.environ.get("CI") == "true":
            pytest.fail(f"{CHROMIUM} is missing in CI (`make setup` installs it)")
        pytest.skip(f"needs {CHROMIUM} (`make setup` installs it as root)")
    return path


@pytest.fixture
async def browser(chromium_path: str) -> AsyncIterator:
    """A headless Chromium for one test (a module may override it, e.g. with a microphone)."""
    from playwright.async_api import async_playwright

    async with async_playwright() as playwright:
        launched = await playwright.chromium.launch(
            executable_path=chromium_path, args=CHROMIUM_ARGS, headless=True
        )
        try:
            yield launched
        finally:
            await launched.close()
