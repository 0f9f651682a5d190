"""The server's check of the model key at start: one cheap request to the
Models API, what the banner and the log say of it, and the admin's banner
while the model refuses the key or cannot be reached."""
from __future__ import annotations

import re
from html import unescape

import httpx
import pytest
from django.contrib.auth import get_user_model

from runtime import model_access
from tests.support.daphne import free_port
from tests.support.fake_anthropic import FakeAnthropicServer

RIGHT_KEY = "sk-ant-the-right-one"
WRONG_KEY = "sk-ant-a-wrong-one"


@pytest.fixture
def fake():
    with FakeAnthropicServer(api_key=RIGHT_KEY) as server:
        yield server


def anthropic_env(base_url: str, key: str) -> dict[str, str]:
    return {"OWLLAYER_LLM": "anthropic", "ANTHROPIC_API_KEY": key, "ANTHROPIC_BASE_URL": base_url,
            "OWLLAYER_MODEL_CHECK_TIMEOUT": "5"}


def banner(server) -> list[str]:
    """The start banner's lines: what the serve command itself printed."""
    return [line for line in server.logs().splitlines() if line.startswith("owllayer_site.serve: ")]


@pytest.mark.django_db(transaction=True)
def test_a_server_whose_model_key_is_refused_says_so_naming_the_variable_and_still_serves(
        daphne_factory, fake):
    server = daphne_factory(anthropic_env(fake.base_url, WRONG_KEY))

    (line,) = [line for line in banner(server) if "model" in line]
    assert line.startswith("owllayer_site.serve: error: ")
    assert "refused the key in ANTHROPIC_API_KEY" in line and "http 401" in line
    assert WRONG_KEY not in server.logs()
    # ... and the log says the same, as an ERROR.
    assert re.search(r" ERROR owllayer_site\.serve the model API at .* refused the key in "
                     r"ANTHROPIC_API_KEY", server.logs())
    assert fake.model_lists == 1 and fake.requests == []  # one request, and no tokens spent
    assert httpx.get(f"{server.http_url}/healthz", timeout=10).status_code == 200


@pytest.mark.django_db(transaction=True)
def test_a_server_whose_model_api_is_unreachable_says_so_and_still_serves(daphne_factory):
    nowhere = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    server = daphne_factory(anthropic_env(nowhere, RIGHT_KEY))

    (line,) = [line for line in banner(server) if "model" in line]
    assert line.startswith("owllayer_site.serve: warning: ")
    assert f"the model API at {nowhere} is unreachable" in line and "Serving anyway" in line
    assert re.search(r" WARNING owllayer_site\.serve the model API at .* is unreachable", server.logs())
    assert httpx.get(f"{server.http_url}/healthz", timeout=10).status_code == 200


@pytest.mark.django_db(transaction=True)
def test_a_server_whose_model_key_is_accepted_says_so_in_one_line(daphne_factory, fake):
    server = daphne_factory(anthropic_env(fake.base_url, RIGHT_KEY))

    (line,) = [line for line in banner(server) if "model" in line]
    assert line.startswith("owllayer_site.serve: model: ") and "key accepted" in line
    assert fake.model_lists == 1


@pytest.mark.django_db(transaction=True)
def test_a_server_on_the_offline_backend_checks_no_key(daphne_factory, fake):
    server = daphne_factory(OWLLAYER_LLM="offline", ANTHROPIC_BASE_URL=fake.base_url)

    assert [line for line in banner(server) if "model" in line] == []
    assert fake.model_lists == 0


# --- the admin's banner --------------------------------------------------------------


@pytest.fixture
def superuser(db):
    return get_user_model().objects.create_superuser("root", "", "pw-root-1234")


def model_banner(html: str) -> str | None:
    found = re.search(r'<li class="error model-problem" id="model-problem"[^>]*>(.*?)</li>', html, re.S)
    return unescape(found.group(1)) if found else None


@pytest.mark.parametrize("path", ["/admin/", "/admin/aitp/session/", "/admin/live/"])
def test_every_admin_page_shows_the_banner_while_the_model_refuses_the_key(
        client, superuser, settings, path):
    settings.OWLLAYER_LLM = "anthropic"
    settings.ANTHROPIC_API_KEY = WRONG_KEY
    client.force_login(superuser)
    model_access.record(model_access.REFUSED, "http 401 authentication_error",
                        found_by="the start-up check")

    text = model_banner(client.get(path).content.decode())

    assert text is not None
    assert "refuses this server's key (ANTHROPIC_API_KEY)" in text and "auth_failed" in text
    assert "http 401 authentication_error" in text and "the start-up check" in text


def test_the_admin_shows_the_banner_while_the_model_api_is_unreachable(client, superuser):
    client.force_login(superuser)
    model_access.turn_failed("unreachable", "ConnectError: refused")

    text = model_banner(client.get("/admin/").content.decode())

    assert text is not None and "cannot be reached" in text and "a turn" in text


def test_the_banner_goes_once_a_turn_gets_an_answer(client, superuser):
    client.force_login(superuser)
    model_access.turn_failed("auth_failed", "http 401 authentication_error")
    assert model_banner(client.get("/admin/").content.decode()) is not None

    model_access.turn_answered()

    assert model_banner(client.get("/admin/").content.decode()) is None


def test_no_banner_while_the_key_is_accepted_or_not_checked(client, superuser):
    client.force_login(superuser)
    assert model_banner(client.get("/admin/").content.decode()) is None
    model_access.record(model_access.ACCEPTED, found_by="the start-up check")
    assert model_banner(client.get("/admin/").content.decode()) is None


def test_a_turn_failing_for_another_reason_changes_nothing(client, superuser):
    client.force_login(superuser)
    for code in ("rate_limited", "overloaded", "timeout", "bad_request"):
        model_access.turn_failed(code)

    assert model_access.current().state == model_access.UNKNOWN
    assert model_banner(client.get("/admin/").content.decode()) is None
