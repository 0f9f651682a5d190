"""Owners manage members; a tenant always keeps at least one owner."""
from __future__ import annotations

import pytest
from django.urls import reverse

from aitp.models import OperatorAction
from console import services as console_services
from tenants.models import TenantMembership
from tests.console.conftest import OWNER, VIEWER, member, signed_in

pytestmark = pytest.mark.django_db


@pytest.fixture
def newbie(django_user_model):
    return django_user_model.objects.create_user(username="newbie", password="x", email="New@Example.com")


def add(client, user: str, role: str = VIEWER):
    return client.post(reverse("console:members", args=["acme"]), {"user": user, "role": role})


def test_an_owner_adds_an_existing_user_by_username(owner_client, olivia, acme, newbie):
    response = add(owner_client, "newbie", OWNER)
    assert response["Location"] == reverse("console:members", args=["acme"])
    assert TenantMembership.objects.get(tenant=acme, user=newbie).role == OWNER
    action = OperatorAction.objects.get(action="member_added")
    assert (action.user, action.data) == (olivia, {"member": "newbie", "role": OWNER})


def test_an_owner_adds_an_existing_user_by_email_in_any_case(owner_client, acme, newbie):
    add(owner_client, "new@example.COM")
    assert TenantMembership.objects.get(tenant=acme, user=newbie).role == VIEWER


def test_the_added_member_can_then_see_the_tenant(owner_client, newbie):
    add(owner_client, "newbie")
    assert signed_in(newbie).get(reverse("console:keys", args=["acme"])).status_code == 200


@pytest.mark.parametrize(
    "identifier, error",
    [
        ("ghost", "no account with this username or email"),
        ("ghost@example.com", "no account with this username or email"),
        ("olivia", "already a member of this tenant"),
    ],
)
def test_adding_someone_who_cannot_be_added_says_why(owner_client, olivia, identifier, error):
    response = add(owner_client, identifier)
    assert response.status_code == 200
    assert response.context["form"].errors["user"] == [error]
    assert not OperatorAction.objects.exists()


def test_an_email_shared_by_two_accounts_asks_for_the_username(owner_client, django_user_model):
    django_user_model.objects.create_user(username="a", password="x", email="same@example.com")
    django_user_model.objects.create_user(username="b", password="x", email="same@example.com")
    response = add(owner_client, "same@example.com")
    assert response.context["form"].errors["user"] == ["several accounts have this email; use the username"]


def test_a_member_of_another_tenant_can_be_added_without_losing_that_tenant(owner_client, bea, acme, beta):
    add(owner_client, "bea")
    slugs = TenantMembership.objects.filter(user=bea).values_list("tenant__slug", flat=True)
    assert set(slugs) == {"acme", "beta"}


def test_an_owner_changes_a_members_role(owner_client, victor):
    membership = TenantMembership.objects.get(user=victor)
    owner_client.post(reverse("console:member_role", args=["acme", membership.pk]), {"role": OWNER})
    membership.refresh_from_db()
    assert membership.role == OWNER
    action = OperatorAction.objects.get(action="member_role_changed")
    assert action.data == {"member": "victor", "role": OWNER, "previous": VIEWER}


def test_an_unknown_role_changes_nothing(owner_client, victor):
    membership = TenantMembership.objects.get(user=victor)
    owner_client.post(reverse("console:member_role", args=["acme", membership.pk]), {"role": "admin"})
    membership.refresh_from_db()
    assert membership.role == VIEWER


def test_an_owner_removes_a_member_after_confirming(owner_client, victor):
    membership = TenantMembership.objects.get(user=victor)
    url = reverse("console:member_remove", args=["acme", membership.pk])
    assert b"will no longer see this tenant" in owner_client.get(url).content
    assert TenantMembership.objects.filter(pk=membership.pk).exists()
    owner_client.post(url)
    assert not TenantMembership.objects.filter(pk=membership.pk).exists()
    assert OperatorAction.objects.get(action="member_removed").data == {"member": "victor", "role": VIEWER}
    assert signed_in(victor).get(reverse("console:keys", args=["acme"])).status_code == 404


def test_the_last_owner_cannot_be_removed(owner_client, olivia, victor):
    membership = TenantMembership.objects.get(user=olivia)
    response = owner_client.post(reverse("console:member_remove", args=["acme", membership.pk]), follow=True)
    assert TenantMembership.objects.filter(pk=membership.pk, role=OWNER).exists()
    assert b"The last owner cannot be removed" in response.content
    assert not OperatorAction.objects.exists()


def test_remove_is_not_offered_for_the_last_owner(owner_client, olivia, victor):
    html = owner_client.get(reverse("console:members", args=["acme"])).content.decode()
    olivia_row = html.split(f'data-member="{TenantMembership.objects.get(user=olivia).pk}"')[1].split("</tr>")[0]
    victor_row = html.split(f'data-member="{TenantMembership.objects.get(user=victor).pk}"')[1].split("</tr>")[0]
    assert ">Remove<" not in olivia_row and "last owner" in olivia_row
    assert ">Remove<" in victor_row


def test_the_remove_page_of_the_last_owner_explains_and_offers_no_button(owner_client, olivia):
    membership = TenantMembership.objects.get(user=olivia)
    html = owner_client.get(reverse("console:member_remove", args=["acme", membership.pk])).content.decode()
    assert "cannot be removed. Make someone else owner first." in html
    assert 'type="submit">Remove<' not in html


def test_the_last_owner_cannot_make_themselves_a_viewer(owner_client, olivia):
    membership = TenantMembership.objects.get(user=olivia)
    owner_client.post(reverse("console:member_role", args=["acme", membership.pk]), {"role": VIEWER})
    membership.refresh_from_db()
    assert membership.role == OWNER


def test_an_owner_may_leave_when_another_owner_remains(owner_client, olivia, django_user_model, acme):
    member(django_user_model, acme, "otto", OWNER)
    membership = TenantMembership.objects.get(user=olivia)
    response = owner_client.post(reverse("console:member_remove", args=["acme", membership.pk]))
    assert response["Location"] == reverse("console:index")
    assert not TenantMembership.objects.filter(pk=membership.pk).exists()


def test_two_owners_removing_each_other_leave_one_owner(olivia, django_user_model, acme):
    otto = member(django_user_model, acme, "otto", OWNER)
    first = TenantMembership.objects.get(user=olivia)
    second = TenantMembership.objects.get(user=otto)
    console_services.membership_remove(membership=first, by=otto)
    with pytest.raises(console_services.LastOwnerError):
        console_services.membership_remove(membership=second, by=olivia)
    assert list(TenantMembership.objects.filter(tenant=acme).values_list("role", flat=True)) == [OWNER]


def test_a_viewer_is_not_counted_as_an_owner(olivia, victor, acme):
    with pytest.raises(console_services.LastOwnerError):
        console_services.membership_set_role(
            membership=TenantMembership.objects.get(user=olivia), role=VIEWER, by=olivia
        )
