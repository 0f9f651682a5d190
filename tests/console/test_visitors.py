"""Visitors in the console: the visitor secret on the keys page (owners only)
and its rotation, and the page of one visitor's conversations."""
from __future__ import annotations

from datetime import timedelta
from urllib.parse import unquote

import pytest
from django.urls import resolve, reverse
from django.utils import timezone

from aitp import tenancy
from aitp.models import OperatorAction
from aitp.transcript import action_words
from console import views
from tenants.models import Tenant
from tests.console.conftest import OWNER, VIEWER, make_session, member, signed_in

pytestmark = pytest.mark.django_db

ROTATE = {"confirm": "rotate"}


def keys_page(client):
    return client.get(reverse("console:keys", args=["acme"]))


def rotate(client, data=ROTATE, slug="acme"):
    return client.post(reverse("console:visitor_secret_rotate", args=[slug]), data)


def secret_of(tenant) -> str:
    return Tenant.objects.get(pk=tenant.pk).visitor_secret


def visitor_page(client, visitor_id: str, slug: str = "acme"):
    return client.get(views.visitor_url(slug, visitor_id))


def ago(minutes: int):
    return timezone.now() - timedelta(minutes=minutes)


# --- the secret ------------------------------------------------------------------


@pytest.mark.parametrize("role, sees_it", [(OWNER, True), (VIEWER, False)], ids=["owner", "viewer"])
def test_the_visitor_secret_is_shown_on_the_keys_page_only_to_a_role_that_manages_keys(
        django_user_model, acme, role, sees_it):
    client = signed_in(member(django_user_model, acme, "mia", role))

    page = keys_page(client)

    assert page.status_code == 200
    assert b'id="visitor-tokens"' in page.content
    assert b"JWT, HS256" in page.content
    assert (acme.visitor_secret.encode() in page.content) is sees_it
    assert (b'data-form="visitor-secret-rotate"' in page.content) is sees_it


def test_a_viewer_is_told_that_only_owners_see_the_secret(viewer_client, acme):
    assert b"Only owners see the secret." in keys_page(viewer_client).content


def test_the_keys_page_showing_the_secret_is_never_cached(owner_client):
    assert "no-store" in keys_page(owner_client)["Cache-Control"]


def test_a_tenant_sees_its_own_secret_and_never_another_tenants(owner_client, acme, beta):
    page = keys_page(owner_client)
    assert acme.visitor_secret.encode() in page.content
    assert beta.visitor_secret.encode() not in page.content


# --- rotating it -----------------------------------------------------------------


def test_an_owner_rotating_the_secret_gets_a_new_one_shown_on_the_keys_page(owner_client, acme):
    old = acme.visitor_secret

    response = rotate(owner_client)

    assert response.status_code == 302
    assert response["Location"] == reverse("console:keys", args=["acme"]) + "#visitor-tokens"
    new = secret_of(acme)
    assert new != old and new.startswith("vsec_")
    page = keys_page(owner_client)
    assert new.encode() in page.content and old.encode() not in page.content
    assert b"Visitor secret rotated." in page.content


def test_rotating_is_recorded_with_who_did_it_and_without_either_secret(owner_client, olivia, acme):
    old = acme.visitor_secret

    rotate(owner_client)

    action = OperatorAction.objects.get(action="visitor_secret_rotated")
    assert (action.tenant, action.user, action.session, action.data) == (acme, olivia, None, {})
    assert old not in str(action.data) and secret_of(acme) not in str(action.data)
    assert action_words(action.action) == "Visitor secret rotated"


def test_the_rotate_service_saves_and_returns_the_new_secret(acme, olivia):
    new = tenancy.visitor_secret_rotate(tenant=acme, by=olivia)
    assert new == acme.visitor_secret == secret_of(acme)
    assert OperatorAction.objects.filter(tenant=acme, action="visitor_secret_rotated").count() == 1


def test_rotating_without_ticking_the_confirm_box_changes_nothing(owner_client, acme):
    old = acme.visitor_secret

    response = rotate(owner_client, data={})

    assert response.status_code == 302
    assert secret_of(acme) == old
    assert not OperatorAction.objects.filter(action="visitor_secret_rotated").exists()
    assert b"tick the box to confirm" in keys_page(owner_client).content


def test_rotating_takes_a_post_only(owner_client, acme):
    old = acme.visitor_secret

    response = owner_client.get(reverse("console:visitor_secret_rotate", args=["acme"]) + "?confirm=rotate")

    assert response.status_code == 405
    assert secret_of(acme) == old


def test_a_viewer_cannot_rotate_the_secret(viewer_client, acme):
    old = acme.visitor_secret

    assert rotate(viewer_client).status_code == 403
    assert secret_of(acme) == old
    assert not OperatorAction.objects.filter(action="visitor_secret_rotated").exists()


def test_a_member_of_another_tenant_cannot_rotate_its_secret(bea_client, acme, beta):
    acme_secret, beta_secret = acme.visitor_secret, beta.visitor_secret

    assert rotate(bea_client).status_code == 404
    assert (secret_of(acme), secret_of(beta)) == (acme_secret, beta_secret)


def test_someone_not_signed_in_cannot_rotate_the_secret(client, acme):
    old = acme.visitor_secret

    response = rotate(client)

    assert response.status_code == 302 and response["Location"].startswith("/console/login/")
    assert secret_of(acme) == old


# --- a visitor's conversations ---------------------------------------------------


@pytest.fixture
def conversations(acme_key, beta_key):
    """Acme's three sessions of visitor cus_42 (oldest first), one of another
    visitor, one without a visitor, and Beta's own cus_42."""
    sessions = [make_session(acme_key, visitor_id="cus_42", started_at=ago(minutes), title=title)
                for minutes, title in ((300, "Home"), (60, "Tents"), (5, "Checkout"))]
    sessions[0].ended_at = ago(290)
    sessions[0].save(update_fields=["ended_at"])
    return {
        "cus_42": sessions,
        "other": make_session(acme_key, visitor_id="cus_7", started_at=ago(2)),
        "anonymous": make_session(acme_key, started_at=ago(1)),
        "beta": make_session(beta_key, visitor_id="cus_42", started_at=ago(3)),
    }


def listed(response) -> list[str]:
    return [session.id for session in response.context["sessions"]]


def test_a_visitors_page_lists_that_visitors_sessions_of_the_tenant_newest_first(owner_client, conversations):
    response = visitor_page(owner_client, "cus_42")

    assert response.status_code == 200
    assert listed(response) == [s.id for s in reversed(conversations["cus_42"])]
    for session in conversations["cus_42"]:
        assert reverse("console:session", args=["acme", session.id]).encode() in response.content
    for other in ("other", "anonymous", "beta"):
        assert conversations[other].id.encode() not in response.content


def test_a_visitors_page_shows_when_each_session_started_its_page_turns_and_state(owner_client, conversations):
    html = visitor_page(owner_client, "cus_42").content.decode()

    assert "Checkout" in html and "Tents" in html and "Home" in html
    assert "<th>Started</th>" in html and '<th class="num">Turns</th>' in html
    assert "ended" in html and "<time datetime=" in html


def test_a_viewer_reads_a_visitors_page_too(viewer_client, conversations):
    assert len(listed(visitor_page(viewer_client, "cus_42"))) == 3


def test_a_member_of_another_tenant_gets_404_on_a_visitors_page(bea_client, conversations):
    response = visitor_page(bea_client, "cus_42", slug="acme")

    assert response.status_code == 404
    assert conversations["cus_42"][0].id.encode() not in response.content


def test_a_visitor_id_used_only_by_another_tenant_shows_nothing_of_theirs(owner_client, beta_key):
    theirs = make_session(beta_key, visitor_id="beta-only-visitor")

    response = visitor_page(owner_client, "beta-only-visitor")

    assert response.status_code == 200
    assert listed(response) == []
    assert theirs.id.encode() not in response.content
    assert b"No conversations of this visitor." in response.content


def test_someone_not_signed_in_is_sent_to_sign_in_from_a_visitors_page(client, conversations):
    response = visitor_page(client, "cus_42")
    assert response.status_code == 302 and response["Location"].startswith("/console/login/")


def test_a_visitors_page_says_when_it_lists_only_the_most_recent(owner_client, conversations, monkeypatch):
    monkeypatch.setattr(views, "VISITOR_SESSIONS", 2)

    response = visitor_page(owner_client, "cus_42")

    assert listed(response) == [s.id for s in reversed(conversations["cus_42"])][:2]
    assert b"The 2 most recent conversations." in response.content


def test_the_session_record_links_to_its_visitors_page(owner_client, conversations):
    session = conversations["cus_42"][1]
    url = views.visitor_url("acme", "cus_42")

    record = owner_client.get(reverse("console:session", args=["acme", session.id]))

    assert url == "/console/t/acme/visitors/cus_42/"
    assert f'href="{url}"'.encode() in record.content
    assert session.id in listed(owner_client.get(url))


def test_a_session_without_a_visitor_shows_no_visitor_link(owner_client, conversations):
    record = owner_client.get(reverse("console:session", args=["acme", conversations["anonymous"].id]))

    assert record.status_code == 200
    assert b"data-visitor" not in record.content
    assert b"/visitors/" not in record.content


def test_the_usage_page_links_each_session_with_a_visitor_to_its_page(owner_client, conversations):
    html = owner_client.get(reverse("console:usage", args=["acme"])).content.decode()

    assert "<th>Visitor</th>" in html
    assert html.count('href="/console/t/acme/visitors/cus_42/"') == 3
    assert 'href="/console/t/acme/visitors/cus_7/"' in html


ODD_IDS = {
    "a slash": "crm/accounts/42",
    "a step up": "a/../../keys",
    "spaces": "Jane Q. Doe",
    "unicode": "Zoë 山田 ✓",
    "a script": "<script>alert(1)</script>",
    "URL characters": "50%?a=b&c#d+e",
    "128 characters": "x/" * 64,
}


@pytest.mark.parametrize("visitor_id", ODD_IDS.values(), ids=ODD_IDS.keys())
def test_any_visitor_id_leads_to_its_own_page_escaped(owner_client, acme_key, visitor_id):
    session = make_session(acme_key, visitor_id=visitor_id)
    make_session(acme_key, visitor_id="someone else")

    record = owner_client.get(reverse("console:session", args=["acme", session.id]))
    url = views.visitor_url("acme", visitor_id)
    page = owner_client.get(url)

    assert f'href="{url}"'.encode() in record.content
    prefix = "/console/t/acme/visitors/"
    assert url.startswith(prefix) and url.endswith("/") and "/" not in url[len(prefix):-1]
    assert all(character not in url for character in ' <>"?#')
    match = resolve(unquote(url))
    assert (match.view_name, match.kwargs["visitor_id"]) == ("console:visitor", visitor_id)
    assert page.status_code == 200
    assert listed(page) == [session.id]
    for html in (record.content, page.content):
        assert b"<script>alert(1)" not in html
    if visitor_id.startswith("<script>"):
        assert b"&lt;script&gt;alert(1)&lt;/script&gt;" in page.content


def test_a_visitor_id_is_written_as_text_on_its_page_and_in_the_title(owner_client, acme_key):
    make_session(acme_key, visitor_id="Zoë <b>&</b>")

    html = visitor_page(owner_client, "Zoë <b>&</b>").content.decode()

    assert "<title>Visitor Zoë &lt;b&gt;&amp;&lt;/b&gt; · Acme Store · OwlLayer console</title>" in html
    assert "<code data-visitor-id>Zoë &lt;b&gt;&amp;&lt;/b&gt;</code>" in html
