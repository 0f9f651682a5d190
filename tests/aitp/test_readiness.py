"""Liveness (/healthz: the process answers) and readiness (/readyz: the
database, Redis, the migrations and the drain), as Kubernetes names them."""
from __future__ import annotations

import pytest
from django.db import OperationalError, connection
from django.db.migrations.recorder import MigrationRecorder

from aitp import processes, views
from tests.support.daphne import free_port

pytestmark = pytest.mark.django_db

EVERY_CHECK_PASSING = {"database": "ok", "redis": "not used", "migrations": "ok", "process": "serving"}


@pytest.fixture(autouse=True)
def migrations_checked_again(monkeypatch):
    """Each test's readiness reads the migrations, not what an earlier test found."""
    monkeypatch.setattr(views, "_migrated", False)


@pytest.fixture
def database_down(monkeypatch):
    def unreachable():
        raise OperationalError("connection refused")

    monkeypatch.setattr(connection, "cursor", unreachable)


@pytest.fixture
def no_redis_url(settings):
    settings.REDIS_URL = ""


def test_the_health_check_answers_ok_when_the_database_answers(client):
    answer = client.get("/healthz")
    assert answer.status_code == 200
    assert answer.json() == {"status": "ok"}


def test_liveness_answers_ok_while_the_process_answers_even_when_its_database_does_not(
        client, database_down):
    answer = client.get("/healthz")

    assert answer.status_code == 200
    assert answer.json() == {"status": "ok"}


def test_liveness_answers_ok_while_the_process_drains(client, monkeypatch):
    monkeypatch.setattr(processes, "_draining", True)

    assert client.get("/healthz").status_code == 200


def test_readiness_answers_200_naming_every_check_when_all_pass(client, no_redis_url):
    answer = client.get("/readyz")

    assert answer.status_code == 200
    assert answer.json() == {"status": "ready", "checks": EVERY_CHECK_PASSING}
    assert "no-cache" in answer["Cache-Control"]


def test_readiness_answers_503_naming_the_database_when_it_does_not_answer(
        client, no_redis_url, database_down):
    answer = client.get("/readyz")

    assert answer.status_code == 503
    assert answer.json()["status"] == "not ready"
    assert answer.json()["checks"]["database"] == "unreachable"
    assert answer.json()["checks"]["process"] == "serving"


def test_readiness_answers_503_while_the_process_stops(client, no_redis_url, monkeypatch):
    assert client.get("/readyz").status_code == 200
    monkeypatch.setattr(processes, "_draining", True)

    answer = client.get("/readyz")

    assert answer.status_code == 503
    assert answer.json() == {"status": "not ready",
                             "checks": {**EVERY_CHECK_PASSING, "process": "draining"}}


def test_readiness_answers_503_naming_redis_when_the_channel_layers_redis_does_not_answer(
        client, settings):
    # Nothing listens there: refused at once.
    settings.REDIS_URL = f"redis://127.0.0.1:{free_port()}/0"

    answer = client.get("/readyz")

    assert answer.status_code == 503
    assert answer.json()["checks"] == {**EVERY_CHECK_PASSING, "redis": "unreachable"}


@pytest.mark.redis
def test_readiness_answers_200_when_the_channel_layers_redis_answers(client, redis_required, settings):
    settings.REDIS_URL = redis_required

    answer = client.get("/readyz")

    assert answer.status_code == 200
    assert answer.json()["checks"]["redis"] == "ok"


def test_readiness_answers_503_while_a_migration_is_not_applied(client, no_redis_url):
    recorder = MigrationRecorder(connection)
    latest = max(name for app, name in recorder.applied_migrations() if app == "aitp")
    # The database forgets it applied the app's latest migration (in this
    # test's transaction): the executor's plan now holds it.
    recorder.record_unapplied("aitp", latest)

    answer = client.get("/readyz")

    assert answer.status_code == 503
    assert answer.json()["checks"] == {**EVERY_CHECK_PASSING, "migrations": "1 unapplied"}
    recorder.record_applied("aitp", latest)
    assert client.get("/readyz").status_code == 200


def test_readiness_reads_the_migrations_no_more_once_it_found_them_all_applied(
        client, no_redis_url, monkeypatch):
    assert client.get("/readyz").status_code == 200

    def unexpected():
        raise AssertionError("the migrations were read again")

    monkeypatch.setattr(views, "unapplied_migrations", unexpected)
    assert client.get("/readyz").status_code == 200


@pytest.mark.parametrize("path", ["/healthz", "/readyz"])
def test_a_probe_addressed_to_the_processs_own_ip_is_answered_whatever_allowed_hosts_says(
        client, settings, no_redis_url, path):
    settings.ALLOWED_HOSTS = ["owl.example.com"]

    answer = client.get(path, HTTP_HOST="10.1.2.3:8000")

    assert answer.status_code == 200
    assert answer.json()["status"] in ("ok", "ready")


def test_any_other_path_at_an_address_not_allowed_is_still_refused(client, settings):
    settings.ALLOWED_HOSTS = ["owl.example.com"]

    assert client.get("/console/", HTTP_HOST="10.1.2.3:8000").status_code == 400


@pytest.mark.parametrize("path", ["/healthz", "/readyz"])
def test_a_probe_over_plain_http_is_answered_not_redirected_when_https_is_on(
        client, settings, no_redis_url, path):
    settings.SECURE_SSL_REDIRECT = True

    assert client.get(path).status_code == 200
