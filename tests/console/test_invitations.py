"""Members join by invitation: an owner invites an e-mail address, and the
membership exists only once the person at that address accepts.

Personas (tests.console.conftest): Olivia owns Acme, Victor views Acme, Bea
owns Beta. Cleo has an account (cleo@shop.example) and no tenant yet.
"""
from __future__ import annotations

import re

import pytest
from django.core import mail
from django.core.mail.backends.base import BaseEmailBackend
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from aitp.models import OperatorAction
from tenants.models import Invitation, TenantMembership
from tests.console.conftest import OWNER, VIEWER, member, signed_in

pytestmark = pytest.mark.django_db

LINK = re.compile(r"(http://testserver/console/invitation/\?token=([\w-]+))")
INVITATION = reverse("console:invitation")


@pytest.fixture
def cleo(django_user_model):
    return django_user_model.objects.create_user(username="cleo", password="pw-cleo", email="cleo@shop.example")


def invite(client: Client, email: str, role: str = VIEWER, slug: str = "acme"):
    return client.post(reverse("console:members", args=[slug]), {"email": email, "role": role})


def last_link() -> tuple[str, str]:
    """The link (and its token) of the last e-mail sent."""
    link, token = LINK.search(mail.outbox[-1].body).groups()
    return link, token


def open_link(client: Client, link: str):
    """Open the e-mail's link as a browser does: it lands on the invitation page."""
    first = client.get(link)
    assert first.status_code == 302 and first["Location"] == INVITATION
    return client.get(INVITATION)


def accept(client: Client):
    return client.post(INVITATION, {"action": "accept"})


def is_member(user, slug: str = "acme") -> bool:
    return TenantMembership.objects.filter(user=user, tenant__slug=slug).exists()


# --- inviting -----------------------------------------------------------------------


def test_inviting_answers_the_same_whatever_accounts_exist(owner_client, django_user_model, victor, bea, cleo):
    django_user_model.objects.create_user(username="sam", email="sam@owllayer.example", is_staff=True)
    django_user_model.objects.create_superuser(username="root", email="root@owllayer.example", password="x")
    bea.email = "bea@beta.example"
    bea.save()
    addresses = [
        "ghost@nowhere.example",  # no account
        "cleo@shop.example",  # an account in no tenant
        "bea@beta.example",  # a member of another tenant
        "victor@acme.example",  # already a member here
        "sam@owllayer.example",  # an operator (staff)
        "root@owllayer.example",  # a superuser
    ]
    answers = []
    for address in addresses:
        response = invite(owner_client, address)
        page = owner_client.get(response["Location"])
        told = [str(message).replace(address, "ADDRESS") for message in page.context["messages"]]
        sent = mail.outbox[-1]
        body = LINK.sub("LINK", sent.body)
        answers.append((response.status_code, response["Location"], told, sent.to == [address],
                        sent.subject, body))

    assert all(answer == answers[0] for answer in answers), answers
    assert answers[0][0] == 302 and answers[0][2][0].startswith("Invitation sent to ADDRESS.")
    assert len(mail.outbox) == len(addresses)
    assert sorted(Invitation.objects.values_list("email", flat=True)) == sorted(addresses)
    # Nothing was looked up: nobody joined, nobody was told anything but the link.
    assert TenantMembership.objects.filter(tenant__slug="acme").count() == 2


def test_an_invitation_is_recorded_with_who_sent_it(owner_client, olivia):
    invite(owner_client, "Cleo@Shop.Example", OWNER)

    invitation = Invitation.objects.get()
    assert (invitation.email, invitation.role, invitation.invited_by) == ("cleo@shop.example", OWNER, olivia)
    action = OperatorAction.objects.get(action="member_invited")
    assert action.user == olivia
    assert action.data == {"email": "cleo@shop.example", "role": OWNER, "invitation": invitation.pk,
                           "replaced": 0}


def test_the_link_works_for_the_days_the_setting_gives(owner_client, settings):
    settings.OWLLAYER_INVITATION_DAYS = 2
    before = timezone.now()
    invite(owner_client, "cleo@shop.example")
    invitation = Invitation.objects.get()
    assert (invitation.expires_at - before).total_seconds() == pytest.approx(2 * 86400, abs=60)


def test_the_token_is_stored_only_as_its_hash_and_shown_only_in_the_email(owner_client):
    invite(owner_client, "cleo@shop.example")
    _link, token = last_link()
    invitation = Invitation.objects.get()

    assert len(token) >= 40
    assert token not in str(Invitation.objects.values().get())
    assert invitation.token_hash != token
    members_page = owner_client.get(reverse("console:members", args=["acme"])).content.decode()
    assert token not in members_page and "cleo@shop.example" in members_page


def test_reinviting_an_address_replaces_its_pending_link(owner_client, cleo):
    invite(owner_client, "cleo@shop.example")
    old_link, _ = last_link()
    invite(owner_client, "cleo@shop.example", OWNER)
    new_link, _ = last_link()
    client = signed_in(cleo)

    assert open_link(client, old_link).status_code == 404
    assert open_link(client, new_link).status_code == 200
    accept(client)
    assert TenantMembership.objects.get(user=cleo).role == OWNER


class RefusingBackend(BaseEmailBackend):
    def send_messages(self, messages):
        raise ConnectionRefusedError("no mail server")


def test_an_invitation_the_mail_server_refuses_is_withdrawn_and_the_owner_told(owner_client, settings):
    settings.EMAIL_BACKEND = f"{__name__}.RefusingBackend"

    page = invite(owner_client, "cleo@shop.example")
    page = owner_client.get(page["Location"])

    told = [str(message) for message in page.context["messages"]]
    assert told == ["The invitation to cleo@shop.example could not be sent (the mail server did not "
                    "take it); nothing changed. Try again later."]
    assert list(page.context["invitations"]) == []
    assert Invitation.objects.get().withdrawn_at is not None


# --- who may invite -------------------------------------------------------------------


def test_a_viewer_cannot_invite(viewer_client):
    assert invite(viewer_client, "cleo@shop.example").status_code == 403
    assert not Invitation.objects.exists() and mail.outbox == []
    page = viewer_client.get(reverse("console:members", args=["acme"]))
    assert b"Invite a member" not in page.content


def test_an_owner_of_one_tenant_cannot_invite_into_another(bea_client, acme):
    assert invite(bea_client, "cleo@shop.example", slug="acme").status_code == 404
    assert not Invitation.objects.exists() and mail.outbox == []


def test_an_owner_of_one_tenant_who_views_another_cannot_invite_there(owner_client, olivia, beta,
                                                                      django_user_model):
    member(django_user_model, beta, "olivia", VIEWER)
    assert invite(owner_client, "cleo@shop.example", slug="beta").status_code == 403
    assert not Invitation.objects.exists() and mail.outbox == []


# --- pending invitations ------------------------------------------------------------------


def test_the_owner_sees_pending_invitations_and_withdraws_one(owner_client, olivia, cleo):
    invite(owner_client, "cleo@shop.example")
    link, _ = last_link()
    invitation = Invitation.objects.get()
    members_page = owner_client.get(reverse("console:members", args=["acme"]))
    assert list(members_page.context["invitations"]) == [invitation]

    owner_client.post(reverse("console:invitation_withdraw", args=["acme", invitation.pk]))

    assert list(owner_client.get(reverse("console:members", args=["acme"])).context["invitations"]) == []
    action = OperatorAction.objects.get(action="invitation_withdrawn")
    assert (action.user, action.data["email"]) == (olivia, "cleo@shop.example")
    client = signed_in(cleo)
    assert open_link(client, link).status_code == 404
    accept(client)
    assert not is_member(cleo)


def test_a_viewer_cannot_withdraw_an_invitation(owner_client, viewer_client):
    invite(owner_client, "cleo@shop.example")
    invitation = Invitation.objects.get()
    url = reverse("console:invitation_withdraw", args=["acme", invitation.pk])
    assert viewer_client.post(url).status_code == 403
    invitation.refresh_from_db()
    assert invitation.withdrawn_at is None


def test_an_owner_of_another_tenant_cannot_withdraw_it(owner_client, bea_client):
    invite(owner_client, "cleo@shop.example")
    invitation = Invitation.objects.get()
    assert bea_client.post(reverse("console:invitation_withdraw", args=["beta", invitation.pk])).status_code == 404
    invitation.refresh_from_db()
    assert invitation.withdrawn_at is None


# --- accepting ---------------------------------------------------------------------------


def test_the_token_leaves_the_address_bar_at_once(owner_client):
    invite(owner_client, "cleo@shop.example")
    link, token = last_link()
    first = Client().get(link)
    assert first.status_code == 302 and token not in first["Location"]


def test_an_accepted_invitation_makes_the_membership(owner_client, olivia, cleo):
    invite(owner_client, "cleo@shop.example", OWNER)
    link, _ = last_link()
    client = signed_in(cleo)

    page = open_link(client, link)
    assert page.status_code == 200 and not is_member(cleo)
    assert b"Accept as cleo" in page.content
    response = accept(client)

    assert response["Location"] == reverse("console:usage", args=["acme"])
    assert TenantMembership.objects.get(user=cleo, tenant__slug="acme").role == OWNER
    invitation = Invitation.objects.get()
    assert (invitation.accepted_by, invitation.accepted_at is not None) == (cleo, True)
    action = OperatorAction.objects.get(action="member_added")
    assert action.user == cleo
    assert action.data == {"member": "cleo", "role": OWNER, "invitation": invitation.pk,
                           "invited_by": "olivia"}
    assert client.get(reverse("console:keys", args=["acme"])).status_code == 200


def test_an_existing_account_signs_in_through_the_link_and_accepts(owner_client, cleo):
    invite(owner_client, "cleo@shop.example")
    link, _ = last_link()
    client = Client()

    page = open_link(client, link)
    assert b"Sign in as the account with this address" in page.content
    assert page.context["sign_up"] is None
    signed = client.post(reverse("console:login"),
                         {"username": "cleo", "password": "pw-cleo", "next": INVITATION})
    assert signed["Location"] == INVITATION
    accept(client)

    assert is_member(cleo)


def test_a_new_person_makes_an_account_through_the_link_and_joins(owner_client, django_user_model):
    invite(owner_client, "new.person@shop.example")
    link, _ = last_link()
    client = Client()

    page = open_link(client, link)
    assert page.context["sign_up"] is not None
    response = client.post(INVITATION, {"action": "sign_up", "username": "newbie",
                                        "password1": "a long pass phrase", "password2": "a long pass phrase"})

    assert response["Location"] == reverse("console:usage", args=["acme"])
    user = django_user_model.objects.get(username="newbie")
    assert (user.email, user.is_staff, user.is_superuser) == ("new.person@shop.example", False, False)
    assert TenantMembership.objects.get(user=user).role == VIEWER
    assert client.get(reverse("console:keys", args=["acme"])).status_code == 200  # signed in


def test_an_address_with_an_account_cannot_make_a_second_one_through_the_link(owner_client, cleo,
                                                                               django_user_model):
    invite(owner_client, "cleo@shop.example")
    link, _ = last_link()
    client = Client()
    open_link(client, link)

    client.post(INVITATION, {"action": "sign_up", "username": "cleo2",
                             "password1": "a long pass phrase", "password2": "a long pass phrase"})

    assert not django_user_model.objects.filter(username="cleo2").exists()
    assert not is_member(cleo)


def test_sign_up_through_an_invitation_can_be_turned_off(owner_client, settings, django_user_model):
    settings.OWLLAYER_INVITATION_SIGN_UP = False
    invite(owner_client, "new.person@shop.example")
    link, _ = last_link()
    client = Client()

    page = open_link(client, link)
    assert page.context["sign_up"] is None and b"Accounts are not made here" in page.content
    client.post(INVITATION, {"action": "sign_up", "username": "newbie",
                             "password1": "a long pass phrase", "password2": "a long pass phrase"})

    assert not django_user_model.objects.filter(username="newbie").exists()
    assert Invitation.objects.get().accepted_at is None


def test_a_link_used_once_is_refused_the_second_time(owner_client, cleo):
    invite(owner_client, "cleo@shop.example")
    link, _ = last_link()
    first = signed_in(cleo)
    open_link(first, link)
    accept(first)
    TenantMembership.objects.filter(user=cleo).delete()  # removed since; the link stays used

    again = signed_in(cleo)
    page = open_link(again, link)
    accept(again)

    assert page.status_code == 404 and b"cannot be used" in page.content
    assert not is_member(cleo)


def test_an_expired_link_is_refused(owner_client, cleo):
    invite(owner_client, "cleo@shop.example")
    link, _ = last_link()
    Invitation.objects.update(expires_at=timezone.now())
    client = signed_in(cleo)

    page = open_link(client, link)
    accept(client)

    assert page.status_code == 404
    assert not is_member(cleo)


def test_a_made_up_link_is_refused_like_a_used_one(cleo):
    client = signed_in(cleo)
    page = open_link(client, "http://testserver" + INVITATION + "?token=not-a-token-we-sent")
    assert page.status_code == 404 and b"cannot be used" in page.content


def test_a_link_opened_by_another_addresses_account_is_refused(owner_client, cleo, bea):
    bea.email = "bea@beta.example"
    bea.save()
    invite(owner_client, "cleo@shop.example")
    link, _ = last_link()
    intruder = signed_in(bea)

    page = open_link(intruder, link)
    assert b"sent to another e-mail address" in page.content and b"Accept as" not in page.content
    accept(intruder)

    assert not is_member(bea)
    assert Invitation.objects.get().accepted_at is None
    rightful = signed_in(cleo)  # the link still works for the invited address
    open_link(rightful, link)
    accept(rightful)
    assert is_member(cleo)


@pytest.mark.parametrize("operator", ["staff", "superuser"])
def test_an_operator_account_with_the_invited_address_cannot_accept(owner_client, django_user_model, operator):
    account = django_user_model.objects.create_user(
        username="sam", email="sam@owllayer.example", password="x", is_staff=True,
        is_superuser=operator == "superuser",
    )
    invite(owner_client, "sam@owllayer.example", OWNER)
    link, _ = last_link()
    client = signed_in(account)

    page = open_link(client, link)
    assert b"Operator accounts cannot join a tenant through an invitation." in page.content
    accept(client)

    assert not is_member(account)


def test_an_existing_member_accepting_keeps_the_role_they_have(owner_client, victor):
    invite(owner_client, "victor@acme.example", OWNER)
    link, _ = last_link()
    client = signed_in(victor)
    open_link(client, link)

    accept(client)

    assert TenantMembership.objects.get(user=victor).role == VIEWER
    assert OperatorAction.objects.filter(action="invitation_accepted", user=victor).exists()
