"""A key's "the agent may hand the chat to a person" switch: an owner turns
it on or off in the console and in the admin, recorded as other key changes
are; a viewer changes nothing. And where the tenant reads what became of the
alerts that switch brings: the Budget page's webhook deliveries."""
from __future__ import annotations

import pytest
from django.urls import reverse

from aitp.models import ApiKey, OperatorAction
from tests.console.conftest import VIEWER, member, signed_in
from tests.console.test_admin_writes import grant_admin_rights, key_form

pytestmark = pytest.mark.django_db

LABEL = "The agent may hand the chat to a person"


def edit_form(key: ApiKey, **changes) -> dict:
    """The console's edit form for a key as it stands (a checkbox ticked is posted, one cleared is not)."""
    fields = {"name": key.name, "allowed_origins": "\n".join(key.allowed_origins),
              "max_sessions": key.max_sessions}
    if key.handoff:
        fields["handoff"] = "on"
    fields.update(changes)
    return {name: value for name, value in fields.items() if value is not None}


def test_an_owner_creates_a_key_whose_agent_may_hand_the_chat_to_a_person(owner_client, olivia, acme):
    form_page = owner_client.get(reverse("console:key_create", args=["acme"]))
    assert LABEL in form_page.content.decode()

    owner_client.post(reverse("console:key_create", args=["acme"]), {
        "name": "help desk", "allowed_origins": "", "max_sessions": "3", "expires_at": "", "handoff": "on"})

    key = ApiKey.objects.get(tenant=acme, name="help desk")
    assert key.handoff is True
    assert OperatorAction.objects.get(action="key_created").data["handoff"] is True


def test_a_new_key_does_not_hand_the_chat_to_a_person_unless_ticked(owner_client, acme):
    owner_client.post(reverse("console:key_create", args=["acme"]), {
        "name": "plain", "allowed_origins": "", "max_sessions": "3", "expires_at": ""})

    assert ApiKey.objects.get(tenant=acme, name="plain").handoff is False


def test_an_owner_turns_the_switch_on_and_off_and_each_change_is_recorded(owner_client, olivia, acme_key):
    url = reverse("console:key_edit", args=["acme", acme_key.pk])

    assert owner_client.post(url, edit_form(acme_key, handoff="on")).status_code == 302
    acme_key.refresh_from_db()
    assert acme_key.handoff is True
    assert "checked" in str(owner_client.get(url).context["form"]["handoff"])
    listing = owner_client.get(reverse("console:keys", args=["acme"])).content.decode()
    assert "may hand the chat to a person" in listing

    owner_client.post(url, edit_form(acme_key, handoff=None))
    acme_key.refresh_from_db()
    assert acme_key.handoff is False
    assert [(a.user, a.data) for a in OperatorAction.objects.filter(action="key_updated").order_by("pk")] == [
        (olivia, {"prefix": acme_key.prefix, "handoff": True}),
        (olivia, {"prefix": acme_key.prefix, "handoff": False}),
    ]


def test_a_viewer_cannot_turn_the_switch_on(viewer_client, acme_key):
    response = viewer_client.post(reverse("console:key_edit", args=["acme", acme_key.pk]),
                                  edit_form(acme_key, handoff="on"))

    assert response.status_code == 403
    acme_key.refresh_from_db()
    assert acme_key.handoff is False
    assert not OperatorAction.objects.filter(action="key_updated").exists()


def test_an_owner_turns_the_switch_on_in_the_admin_and_it_is_recorded(django_user_model, acme, acme_key):
    owner = grant_admin_rights(member(django_user_model, acme, "olga", "owner", is_staff=True))
    client = signed_in(owner)
    assert "handoff" in client.get(reverse("admin:aitp_apikey_change", args=[acme_key.pk])
                                   ).context["adminform"].form.fields

    response = client.post(reverse("admin:aitp_apikey_change", args=[acme_key.pk]),
                           key_form(acme_key, handoff="on"))

    assert response.status_code == 302
    acme_key.refresh_from_db()
    assert acme_key.handoff is True
    action = OperatorAction.objects.get(action="key_updated")
    assert (action.user, action.data) == (owner, {"prefix": acme_key.prefix, "handoff": True})


def test_a_key_added_in_the_admin_may_hand_the_chat_to_a_person(django_user_model, acme):
    owner = grant_admin_rights(member(django_user_model, acme, "olga", "owner", is_staff=True))

    signed_in(owner).post(reverse("admin:aitp_apikey_add"), {
        "tenant": acme.pk, "name": "help desk", "allowed_origins": "[]", "max_sessions": 3, "handoff": "on"})

    assert ApiKey.objects.get(name="help desk").handoff is True


def test_a_viewer_cannot_turn_the_switch_on_in_the_admin(django_user_model, acme, acme_key):
    viewer = grant_admin_rights(member(django_user_model, acme, "vera", VIEWER, is_staff=True))

    response = signed_in(viewer).post(reverse("admin:aitp_apikey_change", args=[acme_key.pk]),
                                      key_form(acme_key, handoff="on"))

    assert response.status_code == 403
    acme_key.refresh_from_db()
    assert acme_key.handoff is False


def test_the_budget_page_lists_the_tenants_webhook_deliveries_only(viewer_client, acme, beta):
    from aitp.models import AlertDelivery

    AlertDelivery.objects.create(tenant=acme, kind="handoff_requested", url="https://acme.example/hook",
                                 attempts=3, status="failed", last_error="webhook answered 502")
    AlertDelivery.objects.create(tenant=beta, kind="approval_waiting", url="https://beta.example/hook",
                                 attempts=1, status="ok")

    page = viewer_client.get(reverse("console:budget", args=["acme"])).content.decode()

    assert "handoff_requested" in page and "webhook answered 502" in page
    assert "approval_waiting" not in page.split('data-table="deliveries"')[1]
