"""Viewers change nothing anywhere; console owners invite only ordinary accounts.

Personas: Olivia owns Acme (staff), Vera is staff and a *viewer* of Acme (she
watches the live pages, with every model permission on keys, and still
changes nothing), Victor is a console viewer of Acme, Sam is a staff account
and Root a superuser that no tenant owner can pull into a tenant.
"""
from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission
from django.test import Client
from django.urls import reverse

from aitp.models import ApiKey, OperatorAction
from aitp.store import keys
from approvals.models import Approval
from tenants.models import TenantMembership
from tests.console.conftest import OWNER, VIEWER, member
from tests.operators.conftest import make_session, operator_approval

pytestmark = pytest.mark.django_db


@pytest.fixture
def vera(django_user_model, acme):
    """Staff, viewer of Acme, holding every model permission on keys and tenants."""
    user = member(django_user_model, acme, "vera", VIEWER, is_staff=True)
    user.user_permissions.add(*Permission.objects.filter(
        content_type__app_label="aitp", content_type__model__in=["apikey", "tenant"]
    ))
    return user


@pytest.fixture
def vera_client(vera) -> Client:
    client = Client()
    client.force_login(vera)
    return client


@pytest.fixture
def acme_session(acme):
    return make_session(acme, "ses_acme", current_url="/cart", title="Your cart")


# --- the admin ------------------------------------------------------------------


def test_a_viewer_cannot_decide_an_operator_approval_in_the_admin(vera_client, acme_session):
    approval = operator_approval(acme_session)
    url = reverse("admin:approvals_approval_decide", args=[approval.pk])

    response = vera_client.post(url, {"decision": "approve", "note": ""})

    assert response.status_code == 403
    approval.refresh_from_db()
    assert approval.status == Approval.Status.PENDING and approval.operator_decision is None
    page = vera_client.get(reverse("admin:approvals_approval_change", args=[approval.pk]))
    assert page.status_code == 200 and page.context["can_decide"] is False


def test_a_viewer_cannot_decide_from_the_live_session_page(vera_client, acme_session):
    approval = operator_approval(acme_session)
    url = reverse("operators:live_approval_decide", args=[acme_session.pk, approval.pk])

    response = vera_client.post(url, {"decision": "approve"})

    assert response.status_code == 403
    approval.refresh_from_db()
    assert approval.status == Approval.Status.PENDING


def test_the_approval_service_refuses_a_viewer_whatever_the_screen(vera, acme_session):
    from approvals import services

    approval = operator_approval(acme_session)
    with pytest.raises(services.ApprovalError) as caught:
        services.approval_decide_operator(approval_id=approval.pk, user=vera, approved=True)
    assert caught.value.code == "not_allowed"


def test_a_viewer_cannot_review_a_decided_approval(vera_client, acme_session, olivia):
    from approvals import services

    approval = operator_approval(acme_session)
    services.approval_decide_operator(approval_id=approval.pk, user=olivia, approved=False)
    url = reverse("admin:approvals_approval_review", args=[approval.pk])

    response = vera_client.post(url, {"verdict": "ok"})

    assert response.status_code == 403
    approval.refresh_from_db()
    assert approval.review_status == Approval.ReviewStatus.UNREVIEWED


@pytest.mark.parametrize("command, extra", [
    ("end", {"message": "bye"}), ("reload", {}), ("redirect", {"url": "/checkout"}),
])
def test_a_viewer_cannot_end_reload_or_redirect_a_session(vera_client, acme_session, command, extra):
    url = reverse("operators:live_session_command", args=[acme_session.pk])

    response = vera_client.post(url, {"command": command, **extra})

    assert response.status_code == 403
    assert not OperatorAction.objects.filter(session=acme_session).exists()
    page = vera_client.get(reverse("operators:live_session", args=[acme_session.pk]))
    assert page.status_code == 200 and page.context["may_act"] is False


def test_an_owner_still_ends_a_session(django_user_model, acme, acme_session):
    client = Client()
    client.force_login(member(django_user_model, acme, "otto", OWNER, is_staff=True))
    url = reverse("operators:live_session_command", args=[acme_session.pk])

    response = client.post(url, {"command": "end", "message": ""})

    assert response.status_code == 302
    assert OperatorAction.objects.filter(session=acme_session, action="session_end").exists()


def test_a_viewer_with_key_permissions_cannot_edit_or_revoke_a_key_in_the_admin(vera_client, acme):
    from aitp import tenancy

    key, _raw = tenancy.key_create(tenant=acme, name="shop")
    change = reverse("admin:aitp_apikey_change", args=[key.pk])

    edit = vera_client.post(change, {"tenant": acme.pk, "name": "renamed", "status": "revoked",
                                     "allowed_origins": "[]", "max_sessions": 3})
    revoke = vera_client.post(reverse("admin:aitp_apikey_changelist"),
                              {"action": "revoke_keys", "_selected_action": [key.pk]})

    assert edit.status_code == 403
    assert revoke.status_code in (200, 302, 403)
    key.refresh_from_db()
    assert (key.name, key.status) == ("shop", ApiKey.Status.ACTIVE)


# --- the console ----------------------------------------------------------------


def console_posts(slug: str, key_id: int, membership_id: int) -> list[str]:
    tenant = f"/console/t/{slug}/"
    return [
        tenant + "keys/new/",
        tenant + f"keys/{key_id}/edit/",
        tenant + f"keys/{key_id}/revoke/",
        tenant + "members/",
        tenant + f"members/{membership_id}/role/",
        tenant + f"members/{membership_id}/remove/",
    ]


def test_a_console_viewer_changes_nothing_with_any_post(viewer_client, olivia, acme, acme_key):
    membership = TenantMembership.objects.get(tenant=acme, user=olivia)
    before = (ApiKey.objects.count(), TenantMembership.objects.count(), OperatorAction.objects.count())

    for url in console_posts("acme", acme_key.pk, membership.pk):
        response = viewer_client.post(url, {"name": "x", "role": "viewer", "user": "victor",
                                            "allowed_origins": "", "max_sessions": "1"})
        assert response.status_code == 403, url

    after = (ApiKey.objects.count(), TenantMembership.objects.count(), OperatorAction.objects.count())
    assert after == before
    acme_key.refresh_from_db()
    assert acme_key.status == ApiKey.Status.ACTIVE
    membership.refresh_from_db()
    assert membership.role == OWNER


def test_the_membership_service_refuses_an_operator_account(olivia, acme, django_user_model):
    from aitp import tenancy

    staff = django_user_model.objects.create_user(username="sam", password="x", is_staff=True)
    with pytest.raises(ValueError):
        tenancy.membership_add(tenant=acme, user=staff, role=OWNER, by=olivia)
    assert not TenantMembership.objects.filter(user=staff).exists()


def test_a_key_made_in_the_admin_is_shown_once_and_never_stored_in_clear(django_user_model, acme):

    root = django_user_model.objects.create_superuser(username="root", password="x")
    client = Client()
    client.force_login(root)

    response = client.post(reverse("admin:aitp_apikey_add"), {
        "tenant": acme.pk, "name": "admin-made", "status": "active", "allowed_origins": "[]",
        "max_sessions": 3,
    })

    assert response.status_code == 200, response.content[:500]
    raw = response.context["raw_key"]
    key = ApiKey.objects.get(name="admin-made")
    assert keys.api_key_lookup(raw) == key
    assert "no-store" in response["Cache-Control"]
    session = client.session
    assert all(raw not in str(session[name]) for name in session.keys())  # noqa: SIM118 (a session store is not a dict)
    assert all(raw not in cookie.value for cookie in client.cookies.values())
    assert raw.encode() not in client.get(reverse("admin:aitp_apikey_changelist")).content
