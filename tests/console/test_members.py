"""Owners manage members; a tenant always keeps at least one owner. (Members
join by invitation: tests/console/test_invitations.py.)"""
from __future__ import annotations

import pytest
from django.urls import reverse

from aitp import tenancy
from aitp.models import OperatorAction
from tenants.models import TenantMembership
from tests.console.conftest import OWNER, VIEWER, member, signed_in

pytestmark = pytest.mark.django_db


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
    tenancy.membership_remove(membership=first, by=otto)
    with pytest.raises(tenancy.LastOwnerError):
        tenancy.membership_remove(membership=second, by=olivia)
    assert list(TenantMembership.objects.filter(tenant=acme).values_list("role", flat=True)) == [OWNER]


def test_a_viewer_is_not_counted_as_an_owner(olivia, victor, acme):
    with pytest.raises(tenancy.LastOwnerError):
        tenancy.membership_set_role(
            membership=TenantMembership.objects.get(user=olivia), role=VIEWER, by=olivia
        )
