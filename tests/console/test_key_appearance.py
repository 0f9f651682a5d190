"""The appearance of a key's widget in the console: owners change it on the
key's edit page, viewers read it, every change is recorded (docs/widget.md,
appearance; docs/admin-and-console.md)."""
from __future__ import annotations

import html
import re
from urllib.parse import unquote

import pytest
from django.urls import reverse

from aitp import preview, tenancy
from aitp.models import ApiKey, OperatorAction
from widget import releases
from widget.services import key_set_appearance

pytestmark = pytest.mark.django_db

FRENCH = {
    "name": "Chouette",
    "greeting": "Bonjour ! Que puis-je faire pour vous ?",
    "accent": "#FFCC00",
    "position": "left",
    "language": "fr",
    "prompts": "Où est ma commande ?\r\nPayer mon panier\r\n\r\n",
}


def appearance_url(key) -> str:
    return reverse("console:key_appearance", args=["acme", key.pk])


def save(client, key, **overrides):
    return client.post(appearance_url(key), {**FRENCH, **overrides})


def test_an_owner_saves_the_appearance_on_the_key_and_the_change_is_recorded(owner_client, olivia, acme_key):
    response = save(owner_client, acme_key)

    assert response.status_code == 302
    assert response["Location"] == reverse("console:key_edit", args=["acme", acme_key.pk])
    acme_key.refresh_from_db()
    assert acme_key.widget_appearance == {
        "name": "Chouette", "greeting": "Bonjour ! Que puis-je faire pour vous ?", "accent": "#ffcc00",
        "position": "left", "language": "fr", "prompts": ["Où est ma commande ?", "Payer mon panier"],
    }
    action = OperatorAction.objects.get(action="key_updated")
    assert (action.user, action.tenant_id) == (olivia, acme_key.tenant_id)
    assert action.data == {"prefix": acme_key.prefix, "widget_appearance": acme_key.widget_appearance}


def test_the_key_edit_page_shows_the_saved_appearance_in_its_form(owner_client, acme_key):
    save(owner_client, acme_key)

    page = owner_client.get(reverse("console:key_edit", args=["acme", acme_key.pk]))

    assert page.status_code == 200
    assert b"Appearance of the widget" in page.content
    form = page.context["appearance_form"]
    assert form.initial["name"] == "Chouette"
    assert form.initial["prompts"] == "Où est ma commande ?\nPayer mon panier"
    assert f'action="{appearance_url(acme_key)}"'.encode() in page.content


def test_saving_the_same_appearance_again_records_nothing_more(owner_client, acme_key):
    save(owner_client, acme_key)
    save(owner_client, acme_key)
    # The defaults on a key that has none are no change either.
    other, _ = tenancy.key_create(tenant=acme_key.tenant, name="other")
    owner_client.post(appearance_url(other), {"position": "right", "language": "en"})

    assert OperatorAction.objects.filter(action="key_updated").count() == 1
    other.refresh_from_db()
    assert other.widget_appearance == {}


def test_a_viewer_reads_the_appearance_but_cannot_save_it(viewer_client, acme_key):
    key_set_appearance(key=acme_key, look={"name": "Chouette"})

    page = viewer_client.get(appearance_url(acme_key))
    refused = save(viewer_client, acme_key, name="Hibou")

    assert page.status_code == 200
    assert page.context["appearance_form"].initial["name"] == "Chouette"
    assert all(field.disabled for field in page.context["appearance_form"].fields.values())
    assert b'data-form="appearance"' not in page.content
    assert b"Only owners change it." in page.content
    assert refused.status_code == 403
    acme_key.refresh_from_db()
    assert acme_key.widget_appearance["name"] == "Chouette"
    assert OperatorAction.objects.filter(action="key_updated").count() == 1  # the setting up only


def test_the_key_list_leads_a_viewer_to_the_appearance(viewer_client, acme_key):
    listing = viewer_client.get(reverse("console:keys", args=["acme"]))
    assert appearance_url(acme_key).encode() in listing.content


def test_another_tenants_key_has_no_appearance_page_here(owner_client, beta_key):
    assert owner_client.get(reverse("console:key_appearance", args=["acme", beta_key.pk])).status_code == 404
    assert owner_client.post(reverse("console:key_appearance", args=["acme", beta_key.pk]),
                             FRENCH).status_code == 404


def test_a_revoked_keys_appearance_cannot_be_changed(owner_client, acme_key):
    tenancy.key_revoke(key=acme_key)
    response = save(owner_client, acme_key)
    assert response.status_code == 302
    acme_key.refresh_from_db()
    assert acme_key.widget_appearance == {}


@pytest.mark.parametrize(("field", "value", "message"), [
    ("accent", "red", "Must be a colour written #rrggbb, like #1f5fd1."),
    ("accent", "#12345", "Must be a colour written #rrggbb, like #1f5fd1."),
    ("accent", "#1234567", "Must be a colour written #rrggbb, like #1f5fd1."),
    ("accent", "rgb(1,2,3)", "Must be a colour written #rrggbb, like #1f5fd1."),
    ("name", "N" * 41, "At most 40 characters (this one has 41)."),
    ("greeting", "G" * 301, "At most 300 characters (this one has 301)."),
    ("prompts", "one\ntwo\nthree\nfour\nfive", "At most 4 prompts (there are 5)."),
    ("prompts", "short\n" + "P" * 81, "Prompt 2: at most 80 characters (this one has 81)."),
    ("position", "top", "Select a valid choice. top is not one of the available choices."),
    ("language", "de", "Select a valid choice. de is not one of the available choices."),
])
def test_an_appearance_that_breaks_a_rule_is_refused_with_a_clear_message_and_nothing_is_saved(
        owner_client, acme_key, field, value, message):
    response = save(owner_client, acme_key, **{field: value})

    assert response.status_code == 200
    assert response.context["appearance_form"].errors[field] == [message]
    assert message.encode() in response.content.replace(b"&#x27;", b"'")
    acme_key.refresh_from_db()
    assert acme_key.widget_appearance == {}
    assert not OperatorAction.objects.filter(action="key_updated").exists()


@pytest.mark.parametrize(("field", "value", "kept"), [
    ("accent", "#1F5FD1", "#1f5fd1"),
    ("accent", "", ""),
    ("name", "N" * 40, "N" * 40),
    ("greeting", "G" * 300, "G" * 300),
    ("greeting", "Bonjour !\r\nJe suis là.", "Bonjour !\nJe suis là."),
    ("prompts", "one\ntwo\nthree\nfour", ["one", "two", "three", "four"]),
    ("prompts", "P" * 80, ["P" * 80]),
    ("prompts", "", []),
    ("position", "right", "right"),
    ("language", "en", "en"),
])
def test_an_appearance_at_the_edge_of_each_rule_is_saved(owner_client, acme_key, field, value, kept):
    response = save(owner_client, acme_key, **{field: value})

    assert response.status_code == 302
    acme_key.refresh_from_db()
    assert acme_key.widget_appearance[field] == kept


def test_the_keys_appearance_page_is_refused_to_someone_of_another_tenant(bea_client, acme_key):
    assert bea_client.get(appearance_url(acme_key)).status_code == 404


def test_the_appearance_starts_as_the_widgets_defaults(owner_client, acme_key):
    page = owner_client.get(appearance_url(acme_key))
    assert page.context["appearance_form"].initial == {
        "name": "", "greeting": "", "accent": "", "position": "right", "language": "en", "prompts": "",
    }
    assert ApiKey.objects.get(pk=acme_key.pk).widget_appearance == {}


# --- the preview: the real widget of the key on its console pages -----------------


def previewed(page) -> preview.Ticket | None:
    """The preview a console page carries, its ticket read as the socket would read it."""
    found = re.search(r'data-endpoint="ws://testserver/owllayer\?previewTicket=([^"]+)"', page.content.decode())
    if found is None:
        return None
    return preview.read(unquote(html.unescape(found.group(1))), origin="http://testserver")


def test_the_appearance_page_carries_the_keys_widget_with_a_ticket_for_its_owner(owner_client, olivia, acme_key):
    page = owner_client.get(appearance_url(acme_key))

    assert previewed(page) == preview.Ticket(key_id=acme_key.pk, origin="http://testserver", user_id=olivia.pk)
    assert f'data-api-key="{acme_key.raw}"'.encode() in page.content
    module = f'data-module="/widget/{releases.load().current}/owllayer-widget.js"'
    assert module.encode() in page.content
    assert b"drawn with the values above as they are typed" in page.content


def test_the_key_edit_page_opens_no_preview_and_leads_to_it(owner_client, acme_key):
    page = owner_client.get(reverse("console:key_edit", args=["acme", acme_key.pk]))

    assert previewed(page) is None and b"widget-preview" not in page.content
    assert f'<a href="{appearance_url(acme_key)}">Try it in a live preview</a>'.encode() in page.content


def test_a_save_from_the_preview_comes_back_to_it(owner_client, acme_key):
    response = save(owner_client, acme_key, **{"from": "preview"})

    assert response.status_code == 302
    assert response["Location"] == appearance_url(acme_key)
    acme_key.refresh_from_db()
    assert acme_key.widget_appearance["name"] == "Chouette"


def test_a_viewer_sees_the_preview_on_the_appearance_page_with_a_ticket_of_their_own(viewer_client, victor, acme_key):
    page = viewer_client.get(appearance_url(acme_key))

    assert previewed(page) == preview.Ticket(key_id=acme_key.pk, origin="http://testserver", user_id=victor.pk)
    assert b"drawn with these values" in page.content


def test_a_revoked_key_has_no_preview(viewer_client, acme_key):
    tenancy.key_revoke(key=acme_key)
    page = viewer_client.get(appearance_url(acme_key))
    assert page.status_code == 200
    assert previewed(page) is None and b"widget-preview" not in page.content


def test_a_key_made_before_keys_were_kept_has_no_preview(viewer_client, acme_key):
    ApiKey.objects.filter(pk=acme_key.pk).update(publishable="")
    page = viewer_client.get(appearance_url(acme_key))
    assert page.status_code == 200
    assert b"widget-preview" not in page.content


def test_the_appearance_page_with_its_preview_ticket_is_not_kept_by_caches(viewer_client, acme_key):
    page = viewer_client.get(appearance_url(acme_key))
    assert "no-store" in page["Cache-Control"]
