"""Keys in the console: create (shown once), list, edit, revoke."""
from __future__ import annotations

import base64
import hashlib
from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from aitp import notify, services, tenancy
from aitp.models import ApiKey, OperatorAction
from aitp.store import keys
from tests.console.conftest import make_session
from widget import assets, releases

pytestmark = pytest.mark.django_db

NEW_KEY = {
    "name": "storefront",
    "allowed_origins": "https://shop.example\r\nhttp://localhost:8000\r\n",
    "max_sessions": "7",
    "expires_at": "",
}


def create_key(client, **overrides):
    return client.post(reverse("console:key_create", args=["acme"]), {**NEW_KEY, **overrides})


def test_an_owner_creates_a_key_and_sees_it_again_on_its_page_while_the_key_record_holds_only_its_hash(
        owner_client, acme):
    response = create_key(owner_client)
    key = ApiKey.objects.get(tenant=acme)
    assert response.status_code == 200
    raw_key = response.context["raw_key"]
    assert raw_key and raw_key.startswith(key.prefix)
    assert raw_key.encode() in response.content
    assert keys.api_key_lookup(raw_key) == key
    assert "no-store" in response["Cache-Control"]

    # A publishable key is public by design: its page shows it again.
    later = owner_client.get(reverse("console:key_created", args=["acme", key.pk]))
    assert later.context["raw_key"] == raw_key
    assert raw_key.encode() in later.content
    assert raw_key not in key.key_hash and key.key_hash == keys.key_hash(raw_key)


def test_a_new_key_is_never_stored_in_the_session_or_a_cookie(owner_client, acme):
    response = create_key(owner_client)
    raw_key = response.context["raw_key"]
    session = owner_client.session
    assert all(raw_key not in str(session[name]) for name in session.keys())  # noqa: SIM118 (a session store is not a dict)
    assert all(raw_key not in cookie.value for cookie in owner_client.cookies.values())
    assert all(raw_key not in value for value in response.cookies.values())


def test_the_plaintext_never_appears_in_a_url_or_on_the_key_list(owner_client, acme):
    response = create_key(owner_client)
    raw_key = response.context["raw_key"]
    assert "Location" not in response
    listing = owner_client.get(reverse("console:keys", args=["acme"]))
    assert raw_key.encode() not in listing.content


def test_a_created_key_keeps_its_origins_cap_and_expiry(owner_client, acme):
    create_key(owner_client, expires_at="2099-01-02T03:04")
    key = ApiKey.objects.get(tenant=acme)
    assert key.name == "storefront"
    assert key.allowed_origins == ["https://shop.example", "http://localhost:8000"]
    assert key.max_sessions == 7
    assert key.expires_at.isoformat() == "2099-01-02T03:04:00+00:00"


def test_creating_a_key_is_recorded_with_who_did_it_and_without_the_plaintext(owner_client, olivia, acme):
    raw_key = create_key(owner_client).context["raw_key"]
    action = OperatorAction.objects.get(action="key_created")
    key = ApiKey.objects.get(tenant=acme)
    assert (action.tenant, action.user, action.data["prefix"]) == (acme, olivia, key.prefix)
    assert action.data["allowed_origins"] == ["https://shop.example", "http://localhost:8000"]
    assert raw_key not in str(action.data)


def test_the_plaintext_of_one_key_is_not_shown_on_another_keys_page(owner_client, acme, acme_key):
    raw_key = create_key(owner_client).context["raw_key"]
    response = owner_client.get(reverse("console:key_created", args=["acme", acme_key.pk]))
    assert response.context["raw_key"] == acme_key.raw
    assert raw_key.encode() not in response.content


@pytest.mark.parametrize(
    "origins, message",
    [
        ("https://shop.example/checkout", "no path"),
        ("shop.example", "scheme must be http or https"),
        ("ftp://shop.example", "scheme must be http or https"),
        ("https://*.shop.example", "wildcards"),
        ("https://shop.example?x=1", "no path"),
        ("https://shop.example:99999", "not a valid origin"),
    ],
)
def test_a_key_with_an_origin_that_is_not_an_origin_is_refused(owner_client, acme, origins, message):
    response = create_key(owner_client, allowed_origins=f"https://ok.example\n{origins}")
    assert response.status_code == 200
    errors = response.context["form"].errors["allowed_origins"]
    assert any(message in error and "line 2" in error for error in errors), errors
    assert not ApiKey.objects.filter(tenant=acme).exists()


def test_an_expiry_in_the_past_is_refused(owner_client, acme):
    response = create_key(owner_client, expires_at="2001-01-01T00:00")
    assert response.context["form"].errors["expires_at"] == ["the expiry must be in the future"]
    assert not ApiKey.objects.filter(tenant=acme).exists()


@pytest.mark.parametrize("cap", ["0", "-1", "abc"])
def test_a_session_cap_below_one_is_refused(owner_client, acme, cap):
    response = create_key(owner_client, max_sessions=cap)
    assert "max_sessions" in response.context["form"].errors
    assert not ApiKey.objects.filter(tenant=acme).exists()


def test_the_key_list_shows_prefix_name_status_origins_cap_and_sessions_today(owner_client, acme_key):
    now = timezone.now()
    make_session(acme_key, started_at=now)
    make_session(acme_key, started_at=now, ended_at=now)
    make_session(acme_key, started_at=now - timedelta(days=2), ended_at=now - timedelta(days=2))
    ApiKey.objects.filter(pk=acme_key.pk).update(last_used_at=now)

    response = owner_client.get(reverse("console:keys", args=["acme"]))
    (row,) = response.context["keys"]
    assert row.sessions_today == 2
    assert row.live_sessions == 1
    html = response.content.decode()
    for text in (acme_key.prefix, "shop", "Active", "https://shop.example", ">5<", f"{now.day} {now:%b %Y}, "):
        assert text in html, text


def test_a_key_that_accepts_any_origin_is_flagged_on_the_list(owner_client, acme):
    tenancy.key_create(tenant=acme, name="open")
    response = owner_client.get(reverse("console:keys", args=["acme"]))
    assert b"any origin" in response.content


# --- revoke ----------------------------------------------------------------------


def test_the_revoke_page_asks_first_and_changes_nothing(owner_client, acme_key):
    make_session(acme_key)
    response = owner_client.get(reverse("console:key_revoke", args=["acme", acme_key.pk]))
    assert response.status_code == 200
    assert response.context["live_sessions"] == 1
    assert b"Revoke this key" in response.content
    acme_key.refresh_from_db()
    assert acme_key.status == ApiKey.Status.ACTIVE


def test_revoking_goes_through_the_service_and_notifies_live_sessions(
    owner_client, olivia, acme_key, monkeypatch, django_capture_on_commit_callbacks
):
    notified = []
    monkeypatch.setattr(notify, "key_changed", notified.append)
    with django_capture_on_commit_callbacks(execute=True):
        response = owner_client.post(reverse("console:key_revoke", args=["acme", acme_key.pk]))
    assert response["Location"] == reverse("console:keys", args=["acme"])
    acme_key.refresh_from_db()
    assert acme_key.status == ApiKey.Status.REVOKED
    assert acme_key.revoked_at is not None
    action = OperatorAction.objects.get(tenant=acme_key.tenant)
    assert (action.action, action.user, action.data) == ("key_revoked", olivia, {"prefix": acme_key.prefix})
    assert notified == [acme_key.pk]
    assert services.api_key_refusal(acme_key, origin="https://shop.example", now=timezone.now()).code == (
        "api_key_revoked"
    )


def test_revoking_a_revoked_key_again_records_nothing_more(owner_client, acme_key):
    url = reverse("console:key_revoke", args=["acme", acme_key.pk])
    owner_client.post(url)
    owner_client.post(url)
    assert OperatorAction.objects.filter(action="key_revoked").count() == 1


# --- edit ------------------------------------------------------------------------


def test_an_owner_edits_origins_and_cap_through_the_service(owner_client, olivia, acme_key):
    url = reverse("console:key_edit", args=["acme", acme_key.pk])
    form = owner_client.get(url).context["form"]
    assert form["allowed_origins"].value() == "https://shop.example"
    response = owner_client.post(
        url,
        {"name": "shop", "allowed_origins": "https://shop.example\nHTTPS://New.Example:443/",
         "max_sessions": "2"},
    )
    assert response["Location"] == reverse("console:keys", args=["acme"])
    acme_key.refresh_from_db()
    assert acme_key.allowed_origins == ["https://shop.example", "https://new.example"]
    assert acme_key.max_sessions == 2
    action = OperatorAction.objects.get(action="key_updated")
    assert action.user == olivia
    assert action.data == {
        "prefix": acme_key.prefix,
        "allowed_origins": ["https://shop.example", "https://new.example"],
        "max_sessions": 2,
    }


def test_an_edit_with_a_bad_origin_changes_nothing(owner_client, acme_key):
    url = reverse("console:key_edit", args=["acme", acme_key.pk])
    response = owner_client.post(
        url, {"name": "shop", "allowed_origins": "https://x.example/path", "max_sessions": "2"}
    )
    assert response.status_code == 200
    assert response.context["form"].errors["allowed_origins"]
    acme_key.refresh_from_db()
    assert (acme_key.allowed_origins, acme_key.max_sessions) == (["https://shop.example"], 5)
    assert not OperatorAction.objects.exists()


def test_a_revoked_key_cannot_be_edited(owner_client, acme_key):
    tenancy.key_revoke(key=acme_key)
    url = reverse("console:key_edit", args=["acme", acme_key.pk])
    response = owner_client.post(url, {"name": "x", "allowed_origins": "", "max_sessions": "9"})
    assert response.status_code == 302
    acme_key.refresh_from_db()
    assert acme_key.max_sessions == 5
    assert not OperatorAction.objects.filter(action="key_updated").exists()


def test_a_new_key_comes_with_the_widget_snippet_holding_the_key_and_the_integrity_hash(owner_client, acme):
    response = create_key(owner_client)
    raw_key = response.context["raw_key"]
    snippet = response.context["embed_snippet"]
    integrity = assets.asset("owllayer-widget.js").integrity
    release = releases.load().current
    assert snippet.startswith(f'<script type="module" src="http://testserver/widget/{release}/owllayer-widget.js"')
    assert f'integrity="{integrity}" crossorigin="anonymous"' in snippet
    assert f'data-api-key="{raw_key}"></script>' in snippet
    html = response.content.decode()
    assert 'data-embed-snippet>&lt;script type=&quot;module&quot; src=' in html
    assert 'data-copy="new-key"' in html and 'data-copy="embed-snippet"' in html


def test_the_keys_page_shows_its_snippet_any_time_later_with_the_integrity_of_the_served_file(
        owner_client, acme):
    create_key(owner_client)
    key = ApiKey.objects.get()
    served = owner_client.get(reverse("widget:asset", args=[releases.load().current, "owllayer-widget.js"]))
    integrity = "sha384-" + base64.b64encode(hashlib.sha384(served.content).digest()).decode()

    for page in ("console:key_edit", "console:key_created"):
        later = owner_client.get(reverse(page, args=["acme", key.pk]))
        snippet = later.context["embed_snippet"]
        assert f'integrity="{integrity}"' in snippet, page
        assert f'data-api-key="{key.publishable}"' in snippet, page
        assert "data-embed-snippet" in later.content.decode(), page


def test_a_key_made_before_keys_were_kept_says_its_snippet_cannot_be_shown(owner_client, acme_key):
    ApiKey.objects.filter(pk=acme_key.pk).update(publishable="")
    page = owner_client.get(reverse("console:key_edit", args=["acme", acme_key.pk]))
    assert page.context["embed_snippet"] is None
    assert "cannot be shown" in page.content.decode()


def live_session_from(key, origin: str):
    from django.utils import timezone

    from tests.console.conftest import make_session

    return make_session(key, origin=origin, last_seen_at=timezone.now())


def test_narrowing_origins_asks_first_and_says_how_many_live_sessions_end(owner_client, acme_key):
    live_session_from(acme_key, "https://shop.example")
    live_session_from(acme_key, "https://shop.example")
    live_session_from(acme_key, "https://new.example")
    url = reverse("console:key_edit", args=["acme", acme_key.pk])
    narrowed = {"name": "shop", "allowed_origins": "https://new.example", "max_sessions": "5"}

    warning = owner_client.post(url, narrowed)

    assert warning.status_code == 200
    assert "2 live sessions will end." in warning.content.decode()
    assert "Save and end 2 sessions" in warning.content.decode()
    acme_key.refresh_from_db()
    assert acme_key.allowed_origins == ["https://shop.example"]
    assert not OperatorAction.objects.exists()

    confirmed = owner_client.post(url, {**narrowed, "confirm_ending": "2"}, follow=True)

    acme_key.refresh_from_db()
    assert acme_key.allowed_origins == ["https://new.example"]
    assert "2 live sessions from removed origins are being ended." in confirmed.content.decode()


def test_an_origin_change_that_ends_no_live_session_saves_at_once(owner_client, acme_key):
    live_session_from(acme_key, "https://shop.example")
    url = reverse("console:key_edit", args=["acme", acme_key.pk])

    response = owner_client.post(url, {"name": "shop", "max_sessions": "5",
                                       "allowed_origins": "https://shop.example\nhttps://new.example"})

    assert response.status_code == 302
    acme_key.refresh_from_db()
    assert acme_key.allowed_origins == ["https://shop.example", "https://new.example"]


def test_the_client_script_the_snippet_imports_may_be_loaded_from_any_origin(client):
    # A module script from another origin needs CORS: the shop's page is not this site.
    response = client.get("/static/owllayer/owllayer-client.js", HTTP_ORIGIN="https://shop.example")
    assert response.status_code == 200
    assert response["Access-Control-Allow-Origin"] == "*"
    assert "javascript" in response["Content-Type"]
