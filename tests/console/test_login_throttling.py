"""Guessing passwords stops at OWLLAYER_LOGIN_FAILURE_LIMIT: then even the right
password is refused for OWLLAYER_LOGIN_COOLOFF_MINUTES (django-axes, attempts
kept in the database, so every server process sees them)."""
from __future__ import annotations

import pytest
from axes.models import AccessAttempt
from django.conf import settings
from django.test import Client
from django.urls import reverse

pytestmark = pytest.mark.django_db

PASSWORD = "correct horse battery staple"
LOGINS = {"admin": "admin:login", "console": "console:login"}


@pytest.fixture(autouse=True)
def quick_hashing(settings):
    # The real hasher is slow on purpose; what is tested here is the counting.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def olga(django_user_model):
    return django_user_model.objects.create_user(username="olga", password=PASSWORD, is_staff=True)


def log_in(client: Client, which: str, password: str):
    return client.post(reverse(LOGINS[which]), {"username": "olga", "password": password})


def signed_in(client: Client) -> bool:
    return "_auth_user_id" in client.session


@pytest.mark.parametrize("which", sorted(LOGINS))
def test_after_the_failure_limit_the_right_password_is_refused(olga, which):
    client = Client()
    for _ in range(settings.AXES_FAILURE_LIMIT):
        assert not signed_in(client)
        log_in(client, which, "wrong")

    response = log_in(client, which, PASSWORD)

    assert response.status_code == 429
    assert not signed_in(client)
    assert AccessAttempt.objects.filter(username="olga").exists()


@pytest.mark.parametrize("which", sorted(LOGINS))
def test_the_right_password_works_again_after_the_cool_off(olga, which):
    client = Client()
    for _ in range(settings.AXES_FAILURE_LIMIT):
        log_in(client, which, "wrong")
    assert log_in(client, which, PASSWORD).status_code == 429

    # The cool-off has passed: the failures are older than it.
    for attempt in AccessAttempt.objects.filter(username="olga"):
        attempt.attempt_time -= settings.AXES_COOLOFF_TIME * 2
        attempt.save(update_fields=["attempt_time"])
    log_in(client, which, PASSWORD)

    assert signed_in(client)


@pytest.mark.parametrize("which", sorted(LOGINS))
def test_a_few_mistakes_under_the_limit_do_not_lock_anyone_out(olga, which):
    client = Client()
    for _ in range(settings.AXES_FAILURE_LIMIT - 1):
        log_in(client, which, "wrong")

    log_in(client, which, PASSWORD)

    assert signed_in(client)
