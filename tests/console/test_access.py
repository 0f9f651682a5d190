"""Who gets in: sign-in, choosing a tenant, tenant isolation, viewers, CSRF."""
from __future__ import annotations

import pytest
from django.test import Client
from django.urls import reverse

from aitp.models import ApiKey, OperatorAction
from tenants.models import TenantMembership
from tests.console.conftest import OWNER, VIEWER, make_session, member, signed_in

pytestmark = pytest.mark.django_db

TENANT_PAGES = ["console:usage", "console:keys", "console:key_create", "console:members"]


def key_pages(key_id: int) -> list[str]:
    return [
        reverse(name, args=["acme", key_id])
        for name in ("console:key_created", "console:key_edit", "console:key_revoke")
    ]


@pytest.mark.parametrize("name", TENANT_PAGES)
def test_a_visitor_who_is_not_signed_in_is_sent_to_the_login_page(client, acme, name):
    url = reverse(name, args=["acme"])
    response = client.get(url)
    assert response.status_code == 302
    assert response["Location"] == f"/console/login/?next={url}"


def test_key_session_and_member_pages_also_require_sign_in(client, acme_key, olivia):
    session = make_session(acme_key)
    membership = TenantMembership.objects.get(user=olivia)
    urls = [
        reverse("console:index"),
        *key_pages(acme_key.pk),
        reverse("console:session", args=["acme", session.pk]),
        reverse("console:member_remove", args=["acme", membership.pk]),
    ]
    for url in urls:
        response = client.get(url)
        assert response.status_code == 302, url
        assert response["Location"].startswith("/console/login/"), url


def test_a_visitor_cannot_revoke_a_key_without_signing_in(client, acme_key):
    response = client.post(reverse("console:key_revoke", args=["acme", acme_key.pk]))
    assert response.status_code == 302
    acme_key.refresh_from_db()
    assert acme_key.status == ApiKey.Status.ACTIVE


def test_signing_in_with_the_right_password_leads_to_the_console(client, olivia):
    response = client.post(reverse("console:login"), {"username": "olivia", "password": "pw-olivia"})
    assert response.status_code == 302
    assert response["Location"] == "/console/"
    assert client.get("/console/")["Location"] == reverse("console:usage", args=["acme"])


def test_a_wrong_password_shows_the_login_form_again(client, olivia):
    response = client.post(reverse("console:login"), {"username": "olivia", "password": "nope"})
    assert response.status_code == 200
    assert b"Sign in" in response.content
    assert "_auth_user_id" not in client.session


def test_the_login_page_says_where_you_are(client):
    response = client.get(reverse("console:login"))
    assert b"<title>Sign in \xc2\xb7 OwlLayer console</title>" in response.content


def test_signing_out_takes_a_post_and_ends_the_sign_in(owner_client):
    assert owner_client.get(reverse("console:logout")).status_code == 405
    response = owner_client.post(reverse("console:logout"))
    assert response["Location"] == reverse("console:login")
    assert owner_client.get(reverse("console:keys", args=["acme"])).status_code == 302


def test_a_member_of_one_tenant_is_taken_straight_to_it(owner_client):
    response = owner_client.get(reverse("console:index"))
    assert response.status_code == 302
    assert response["Location"] == "/console/t/acme/"


def test_a_member_of_several_tenants_picks_one_from_a_list(django_user_model, acme, beta):
    user = member(django_user_model, acme, "multi", VIEWER)
    member(django_user_model, beta, "multi", OWNER)
    response = signed_in(user).get(reverse("console:index"))
    assert response.status_code == 200
    assert [m.tenant.slug for m in response.context["memberships"]] == ["acme", "beta"]
    assert b'href="/console/t/beta/"' in response.content


def test_a_user_without_a_tenant_is_told_so(django_user_model):
    user = django_user_model.objects.create_user(username="nobody", password="x")
    response = signed_in(user).get(reverse("console:index"))
    assert response.status_code == 200
    assert b"not a member of any tenant" in response.content


def test_every_tenant_page_title_names_the_page_and_the_tenant(owner_client, acme_key):
    session = make_session(acme_key)
    pages = {
        reverse("console:usage", args=["acme"]): "Usage",
        reverse("console:keys", args=["acme"]): "Keys",
        reverse("console:key_create", args=["acme"]): "New key",
        reverse("console:members", args=["acme"]): "Members",
        reverse("console:session", args=["acme", session.pk]): f"Session {session.pk}",
        reverse("console:key_revoke", args=["acme", acme_key.pk]): f"Revoke key {acme_key.prefix}",
    }
    for url, title in pages.items():
        response = owner_client.get(url)
        assert response.status_code == 200, url
        expected = f"<title>{title} · Acme Store · OwlLayer console</title>"
        assert expected in response.content.decode(), url


# --- tenant isolation -------------------------------------------------------------


@pytest.mark.parametrize("name", TENANT_PAGES)
def test_a_member_of_another_tenant_gets_404_on_its_pages(bea_client, acme, name):
    assert bea_client.get(reverse(name, args=["acme"])).status_code == 404


def test_a_member_of_acme_gets_404_on_beta_ids_under_either_slug(
    owner_client, bea, beta_key, beta_session
):
    """Guessing ids: another tenant's key, session or membership id is 404,
    under the other tenant's slug and under the member's own slug alike."""
    bea_membership = TenantMembership.objects.get(user=bea)
    for slug in ("beta", "acme"):
        urls = [
            reverse("console:key_created", args=[slug, beta_key.pk]),
            reverse("console:key_edit", args=[slug, beta_key.pk]),
            reverse("console:key_revoke", args=[slug, beta_key.pk]),
            reverse("console:session", args=[slug, beta_session.pk]),
            reverse("console:member_remove", args=[slug, bea_membership.pk]),
        ]
        for url in urls:
            assert owner_client.get(url).status_code == 404, url
            assert owner_client.post(url).status_code == 404, url
    beta_key.refresh_from_db()
    assert beta_key.status == ApiKey.Status.ACTIVE
    assert TenantMembership.objects.filter(pk=bea_membership.pk).exists()
    assert not OperatorAction.objects.filter(tenant=beta_key.tenant).exists()


def test_another_tenants_membership_cannot_be_changed_by_guessing_its_id(owner_client, bea, beta):
    bea_membership = TenantMembership.objects.get(user=bea, tenant=beta)
    for url in (
        reverse("console:member_role", args=["acme", bea_membership.pk]),
        reverse("console:member_remove", args=["acme", bea_membership.pk]),
    ):
        assert owner_client.post(url, {"role": VIEWER}).status_code == 404
    bea_membership.refresh_from_db()
    assert bea_membership.role == OWNER


def test_the_key_list_shows_only_the_tenants_own_keys(owner_client, acme_key, beta_key):
    response = owner_client.get(reverse("console:keys", args=["acme"]))
    assert [k.pk for k in response.context["keys"]] == [acme_key.pk]
    assert beta_key.prefix.encode() not in response.content


def test_the_usage_page_lists_only_the_tenants_own_sessions(owner_client, acme_key, beta_session):
    mine = make_session(acme_key)
    response = owner_client.get(reverse("console:usage", args=["acme"]))
    assert [s.pk for s in response.context["recent_sessions"]] == [mine.pk]
    assert beta_session.pk.encode() not in response.content


# --- viewers ---------------------------------------------------------------------


def test_a_viewer_cannot_create_a_key(viewer_client, acme):
    url = reverse("console:key_create", args=["acme"])
    assert viewer_client.get(url).status_code == 403
    response = viewer_client.post(url, {"name": "x", "allowed_origins": "", "max_sessions": 3})
    assert response.status_code == 403
    assert not ApiKey.objects.filter(tenant=acme).exists()


def test_a_viewer_cannot_revoke_or_edit_a_key(viewer_client, acme_key):
    revoke = reverse("console:key_revoke", args=["acme", acme_key.pk])
    edit = reverse("console:key_edit", args=["acme", acme_key.pk])
    assert viewer_client.get(revoke).status_code == 403
    assert viewer_client.post(revoke).status_code == 403
    edited = {"name": "x", "allowed_origins": "", "max_sessions": 1}
    assert viewer_client.post(edit, edited).status_code == 403
    acme_key.refresh_from_db()
    assert acme_key.status == ApiKey.Status.ACTIVE
    assert acme_key.max_sessions == 5
    assert not OperatorAction.objects.exists()


def test_a_viewer_cannot_add_change_or_remove_members(viewer_client, olivia, victor, django_user_model):
    django_user_model.objects.create_user(username="newbie", password="x")
    olivia_membership = TenantMembership.objects.get(user=olivia)
    assert viewer_client.post(
        reverse("console:members", args=["acme"]), {"email": "newbie@example.com", "role": OWNER}
    ).status_code == 403
    assert viewer_client.post(
        reverse("console:member_role", args=["acme", olivia_membership.pk]), {"role": VIEWER}
    ).status_code == 403
    remove = reverse("console:member_remove", args=["acme", olivia_membership.pk])
    assert viewer_client.post(remove).status_code == 403
    assert TenantMembership.objects.filter(tenant__slug="acme").count() == 2
    olivia_membership.refresh_from_db()
    assert olivia_membership.role == OWNER


def test_a_viewer_reads_keys_usage_and_sessions_without_change_controls(viewer_client, acme_key):
    session = make_session(acme_key)
    keys = viewer_client.get(reverse("console:keys", args=["acme"]))
    assert keys.status_code == 200
    assert acme_key.prefix.encode() in keys.content
    assert b"New key" not in keys.content and b"Revoke" not in keys.content
    assert viewer_client.get(reverse("console:usage", args=["acme"])).status_code == 200
    assert viewer_client.get(reverse("console:session", args=["acme", session.pk])).status_code == 200
    members = viewer_client.get(reverse("console:members", args=["acme"]))
    assert members.status_code == 200 and b"Invite a member" not in members.content


# --- CSRF ------------------------------------------------------------------------


def test_a_post_without_the_csrf_token_is_refused(olivia, acme_key):
    client = Client(enforce_csrf_checks=True)
    client.force_login(olivia)
    response = client.post(reverse("console:key_revoke", args=["acme", acme_key.pk]))
    assert response.status_code == 403
    acme_key.refresh_from_db()
    assert acme_key.status == ApiKey.Status.ACTIVE


def test_every_console_form_carries_a_csrf_token(owner_client, acme_key, olivia):
    membership = TenantMembership.objects.get(user=olivia)
    for url in (
        reverse("console:key_create", args=["acme"]),
        reverse("console:key_edit", args=["acme", acme_key.pk]),
        reverse("console:key_revoke", args=["acme", acme_key.pk]),
        reverse("console:members", args=["acme"]),
        reverse("console:member_remove", args=["acme", membership.pk]),
    ):
        html = owner_client.get(url).content.decode()
        forms = html.count("<form")
        assert forms >= 1, url
        assert html.count('name="csrfmiddlewaretoken"') == forms, url
