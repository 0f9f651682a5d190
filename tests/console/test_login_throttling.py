"""Guessing passwords stops at OWLLAYER_LOGIN_FAILURE_LIMIT for one username
from one address, and at OWLLAYER_LOGIN_ADDRESS_FAILURE_LIMIT for an address
over any usernames: then even the right password is refused for
OWLLAYER_LOGIN_COOLOFF_MINUTES (django-axes, attempts kept in the database,
so every server process sees them), and the page says how long and how to
lift it."""
from __future__ import annotations

import io
import json
import os
import secrets
import subprocess
import sys
from datetime import timedelta

import pytest
from axes.models import AccessAttempt
from django.conf import settings
from django.core.management import call_command
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from owllayer_site.login_throttling import duration, lock_ends
from tests.support.daphne import PROJECT_ROOT

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


# --- whose mistakes lock whom ----------------------------------------------------------

ELSEWHERE = "203.0.113.9"


def sign_in_as(username: str, password: str, *, which: str = "console", address: str = "127.0.0.1"):
    client = Client(REMOTE_ADDR=address)
    response = client.post(reverse(LOGINS[which]), {"username": username, "password": password})
    return response, signed_in(client)


def fail(username: str, times: int, *, which: str = "console", address: str = "127.0.0.1") -> None:
    for _ in range(times):
        sign_in_as(username, "wrong", which=which, address=address)


@pytest.fixture
def oscar(django_user_model):
    return django_user_model.objects.create_user(username="oscar", password=PASSWORD, is_staff=True)


@pytest.fixture
def admin_user(django_user_model):
    return django_user_model.objects.create_superuser(username="admin", email="", password=PASSWORD)


@pytest.mark.parametrize("which", sorted(LOGINS))
def test_a_users_mistakes_lock_that_user_from_that_address_and_not_another_user_from_there(
    olga, oscar, which
):
    fail("olga", settings.AXES_FAILURE_LIMIT, which=which)

    locked, olga_in = sign_in_as("olga", PASSWORD, which=which)
    _, oscar_in = sign_in_as("oscar", PASSWORD, which=which)

    assert locked.status_code == 429 and not olga_in
    assert oscar_in


def test_a_users_mistakes_do_not_lock_that_user_out_from_another_address(olga):
    fail("olga", settings.AXES_FAILURE_LIMIT, address=ELSEWHERE)

    _, olga_in = sign_in_as("olga", PASSWORD)

    assert olga_in


def spray(count: int, *, address: str = "127.0.0.1") -> None:
    """`count` failures from one address, over usernames that each stay under
    the per-user limit (password spraying)."""
    per_name = settings.AXES_FAILURE_LIMIT - 1
    for n in range(count):
        sign_in_as(f"guess-{n // per_name}", "wrong", address=address)


def test_an_address_alone_is_not_locked_before_its_own_larger_limit(oscar):
    assert settings.OWLLAYER_LOGIN_ADDRESS_FAILURE_LIMIT > settings.AXES_FAILURE_LIMIT
    spray(settings.OWLLAYER_LOGIN_ADDRESS_FAILURE_LIMIT - 1)

    _, oscar_in = sign_in_as("oscar", PASSWORD)

    assert oscar_in


def test_an_address_alone_is_locked_at_its_own_limit_for_every_username(oscar):
    spray(settings.OWLLAYER_LOGIN_ADDRESS_FAILURE_LIMIT)

    locked, oscar_in = sign_in_as("oscar", PASSWORD)
    _, oscar_in_elsewhere = sign_in_as("oscar", PASSWORD, address=ELSEWHERE)

    assert locked.status_code == 429 and not oscar_in
    assert 'data-lockout="address"' in locked.content.decode()
    assert oscar_in_elsewhere


def test_signing_in_to_ones_own_account_does_not_clear_an_addresss_count(oscar):
    spray(settings.OWLLAYER_LOGIN_ADDRESS_FAILURE_LIMIT - 1)
    assert sign_in_as("oscar", PASSWORD)[1]

    sign_in_as("another-guess", "wrong")

    assert sign_in_as("oscar", PASSWORD)[0].status_code == 429


@pytest.mark.parametrize("which", sorted(LOGINS))
def test_the_superuser_is_not_locked_out_by_another_accounts_mistakes_from_the_same_address(
    admin_user, olga, which
):
    fail("olga", settings.AXES_FAILURE_LIMIT, which=which)

    _, admin_in = sign_in_as("admin", PASSWORD, which=which)

    assert admin_in


@pytest.mark.parametrize("which", sorted(LOGINS))
def test_the_superuser_is_not_locked_out_by_someone_guessing_its_password_elsewhere(admin_user, which):
    fail("admin", settings.AXES_FAILURE_LIMIT, which=which, address=ELSEWHERE)

    _, admin_in = sign_in_as("admin", PASSWORD, which=which)

    assert admin_in


# --- the lockout page ----------------------------------------------------------------------


@pytest.mark.parametrize("which, look", [("admin", 'id="site-name"'), ("console", 'class="brand"')])
def test_the_lockout_page_is_the_logins_own_look_with_how_long_and_until_when(olga, which, look):
    fail("olga", settings.AXES_FAILURE_LIMIT, which=which)

    response, _ = sign_in_as("olga", PASSWORD, which=which)

    page = response.content.decode()
    last_failure = AccessAttempt.objects.get(username="olga").attempt_time
    ends_at = timezone.localtime(last_failure + settings.AXES_COOLOFF_TIME)
    assert response.status_code == 429
    assert look in page
    assert "Too many failed sign-ins" in page
    assert f"<strong data-lasts>{duration(settings.AXES_COOLOFF_TIME)}</strong>" in page
    assert f"<strong data-ends-at>{ends_at:%H:%M:%S} UTC</strong>" in page


@pytest.mark.parametrize("which", sorted(LOGINS))
def test_the_lockout_page_names_the_command_that_lifts_exactly_that_lock(olga, oscar, which):
    fail("olga", settings.AXES_FAILURE_LIMIT, which=which)
    fail("oscar", settings.AXES_FAILURE_LIMIT - 1, which=which)
    page = sign_in_as("olga", PASSWORD, which=which)[0].content.decode()
    command = "manage.py axes_reset_ip_username 127.0.0.1 olga"
    assert f"<pre class=\"lockout-command\" data-command>{command}</pre>" in page

    call_command(*command.split()[1:], stdout=io.StringIO())

    assert sign_in_as("olga", PASSWORD, which=which)[1]
    assert AccessAttempt.objects.get(username="oscar").failures_since_start == settings.AXES_FAILURE_LIMIT - 1


def test_an_addresss_lockout_page_names_the_command_that_lifts_the_address(oscar):
    spray(settings.OWLLAYER_LOGIN_ADDRESS_FAILURE_LIMIT)
    page = sign_in_as("oscar", PASSWORD)[0].content.decode()
    command = "manage.py axes_reset_ip 127.0.0.1"
    assert f"<pre class=\"lockout-command\" data-command>{command}</pre>" in page

    call_command(*command.split()[1:], stdout=io.StringIO())

    assert sign_in_as("oscar", PASSWORD)[1]


def test_a_try_while_locked_out_does_not_make_the_lock_longer(olga):
    fail("olga", settings.AXES_FAILURE_LIMIT)
    locked_at = AccessAttempt.objects.get(username="olga").attempt_time

    sign_in_as("olga", PASSWORD)
    sign_in_as("olga", "wrong")

    attempt = AccessAttempt.objects.get(username="olga")
    assert attempt.attempt_time == locked_at
    assert attempt.failures_since_start == settings.AXES_FAILURE_LIMIT


def test_an_addresss_lock_ends_when_its_oldest_failures_no_longer_leave_enough():
    start = timezone.now()
    minute = timedelta(minutes=1)
    rows = [(start + 2 * minute, 20), (start, 30), (start + minute, 25)]

    # 75 in all; at 50 the lock holds while at least 50 are left: without the
    # oldest row (30) 45 are left, so it ends a cool-off after that row.
    assert lock_ends(rows, 50, 15 * minute) == start + 15 * minute
    assert lock_ends(rows, 40, 15 * minute) == start + 16 * minute


def test_durations_are_said_in_words():
    assert [duration(timedelta(seconds=s)) for s in (1, 30, 60, 900, 3600, 5400)] == [
        "1 second", "30 seconds", "1 minute", "15 minutes", "1 hour", "1 hour 30 minutes"]


# --- how long a lock lasts by default -----------------------------------------------------


def settings_in_a_fresh_process(**env: str) -> dict:
    """The login settings a new process reads from exactly this environment."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("OWLLAYER_", "DJANGO_"))}
    script = ("import json, django; django.setup(); from django.conf import settings as s; "
              "print(json.dumps([s.AXES_COOLOFF_TIME.total_seconds(), s.AXES_FAILURE_LIMIT, "
              "s.OWLLAYER_LOGIN_ADDRESS_FAILURE_LIMIT]))")
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=120,
        env={**clean, "DJANGO_SETTINGS_MODULE": "owllayer_site.settings", **env},
    )
    assert done.returncode == 0, done.stderr
    cool_off, pair, address = json.loads(done.stdout)
    return {"cool_off_minutes": cool_off / 60, "pair": pair, "address": address}


def test_in_debug_mode_a_lock_lasts_a_minute():
    assert settings_in_a_fresh_process(DJANGO_DEBUG="true")["cool_off_minutes"] == 1


def test_in_production_a_lock_lasts_fifteen_minutes_and_an_address_takes_ten_times_the_failures():
    read = settings_in_a_fresh_process(DJANGO_DEBUG="false", DJANGO_SECRET_KEY=secrets.token_urlsafe(50))
    assert read == {"cool_off_minutes": 15, "pair": 5, "address": 50}


def test_an_address_limit_under_the_per_user_limit_is_refused_at_start_up():
    with pytest.raises(AssertionError, match="OWLLAYER_LOGIN_ADDRESS_FAILURE_LIMIT must be >= 5"):
        settings_in_a_fresh_process(DJANGO_DEBUG="true", OWLLAYER_LOGIN_ADDRESS_FAILURE_LIMIT="3")
