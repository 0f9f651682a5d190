"""A key's widget appearance: what widget/appearance.py lets a key keep, and
GET /widget/appearance, which tells any page that appearance and nothing
else, for a usable key only (docs/widget.md, appearance)."""
from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from aitp import tenancy
from aitp.models import ApiKey, OperatorAction
from widget import appearance
from widget.appearance import AppearanceError
from widget.services import key_set_appearance

DEFAULTS = {"name": "", "greeting": "", "accent": "", "position": "right", "language": "en", "prompts": []}
FRENCH = {"name": "Chouette", "greeting": "Bonjour !", "accent": "#0B6E4F", "position": "left",
          "language": "fr", "prompts": ["Où est ma commande ?", "Payer mon panier"]}


def refusal(data: dict) -> dict[str, str]:
    with pytest.raises(AppearanceError) as refused:
        appearance.clean(data)
    return refused.value.errors


# --- what an appearance may hold -------------------------------------------------------


def test_an_empty_appearance_is_the_defaults():
    assert appearance.clean({}) == DEFAULTS
    assert appearance.public(None) == DEFAULTS
    assert appearance.public({}) == DEFAULTS


def test_a_full_appearance_is_kept_trimmed_with_its_colour_in_lower_case():
    kept = appearance.clean({**FRENCH, "name": "  Chouette ", "prompts": ["  Où est ma commande ?", "Payer mon panier"],
                             "accent": "#0B6E4F"})
    assert kept == {**FRENCH, "accent": "#0b6e4f"}


@pytest.mark.parametrize("accent", ["red", "#fff", "#12345g", "#1234567", "1f5fd1", "rgb(1,2,3)", "#1f5fd1;x:y", 42])
def test_an_accent_not_written_rrggbb_is_refused(accent):
    assert refusal({"accent": accent}) == {"accent": "must be a colour written #rrggbb, like #1f5fd1."}


def test_the_name_greeting_and_each_prompt_have_a_longest_length():
    assert appearance.clean({"name": "n" * 40, "greeting": "g" * 300, "prompts": ["p" * 80]})["name"] == "n" * 40
    assert refusal({"name": "n" * 41}) == {"name": "at most 40 characters (this one has 41)."}
    assert refusal({"greeting": "g" * 301}) == {"greeting": "at most 300 characters (this one has 301)."}
    assert refusal({"prompts": ["ok", "p" * 81]}) == {
        "prompts": "prompt 2: at most 80 characters (this one has 81)."}


def test_at_most_four_prompts_blank_lines_and_repeats_dropped():
    assert appearance.clean({"prompts": "a\n\nb\na\nc\nd\n"})["prompts"] == ["a", "b", "c", "d"]
    assert refusal({"prompts": ["a", "b", "c", "d", "e"]}) == {"prompts": "at most 4 prompts (there are 5)."}
    assert refusal({"prompts": 7}) == {"prompts": "must be a list of short texts."}


def test_the_position_is_right_or_left_and_the_language_english_or_french():
    assert appearance.clean({"position": "left", "language": "fr"})["position"] == "left"
    assert refusal({"position": "top"}) == {"position": "must be right or left."}
    assert refusal({"language": "de"}) == {"language": "must be en or fr."}


def test_the_name_is_one_line_of_plain_text_while_a_greeting_may_hold_line_breaks():
    assert refusal({"name": "two\nlines"}) == {"name": "must be one line of plain text."}
    assert refusal({"greeting": "bell\x07"}) == {"greeting": "must be plain text."}
    assert refusal({"name": 12}) == {"name": "must be text."}
    assert appearance.clean({"greeting": "Hello!\r\nHow can I help?"})["greeting"] == "Hello!\nHow can I help?"


def test_a_field_that_is_not_of_the_appearance_is_refused_and_every_wrong_field_is_named():
    assert refusal({"tenant": "acme", "accent": "blue", "position": "up"}) == {
        "__all__": "not a field of the appearance: tenant",
        "accent": "must be a colour written #rrggbb, like #1f5fd1.",
        "position": "must be right or left.",
    }


def test_a_stored_value_no_longer_valid_is_told_as_its_default():
    stored = {**FRENCH, "accent": "blue", "extra": "never told"}
    assert appearance.public(stored) == {**FRENCH, "accent": ""}


# --- the key service ---------------------------------------------------------------------


@pytest.fixture
def key(db):
    tenant = tenancy.tenant_create(slug="acme", name="Acme Store")
    row, raw = tenancy.key_create(tenant=tenant, name="shop", allowed_origins=["https://shop.example"])
    row.raw = raw
    return row


def test_setting_a_keys_appearance_checks_it_and_records_the_change_through_the_key_service(key):
    with pytest.raises(AppearanceError):
        key_set_appearance(key=key, look={"accent": "red"})
    assert ApiKey.objects.get(pk=key.pk).widget_appearance == {}

    assert key_set_appearance(key=key, look=FRENCH) is True

    assert ApiKey.objects.get(pk=key.pk).widget_appearance == {**FRENCH, "accent": "#0b6e4f"}
    action = OperatorAction.objects.get(action="key_updated")
    assert action.data == {"prefix": key.prefix, "widget_appearance": {**FRENCH, "accent": "#0b6e4f"}}


def test_setting_the_same_appearance_or_the_defaults_on_a_key_without_any_changes_nothing(key):
    assert key_set_appearance(key=key, look={}) is False
    key_set_appearance(key=key, look=FRENCH)
    assert key_set_appearance(key=key, look=FRENCH) is False
    assert OperatorAction.objects.filter(action="key_updated").count() == 1


def test_a_revoked_keys_appearance_is_never_changed(key):
    tenancy.key_revoke(key=key)
    with pytest.raises(ValueError, match="a revoked key cannot be changed"):
        key_set_appearance(key=key, look=FRENCH)
    assert ApiKey.objects.get(pk=key.pk).widget_appearance == {}


# --- GET /widget/appearance ------------------------------------------------------------


def read(client, raw_key: str, **headers):
    return client.get(reverse("widget:appearance"), {"key": raw_key}, **headers)


def test_a_usable_key_gets_its_appearance_and_only_that_for_any_page_for_a_minute(client, key):
    key_set_appearance(key=key, look=FRENCH)

    response = read(client, key.raw, HTTP_ORIGIN="https://elsewhere.example")

    assert reverse("widget:appearance") == "/widget/appearance"
    assert response.status_code == 200
    assert response["Content-Type"] == "application/json"
    assert response["Access-Control-Allow-Origin"] == "*"
    assert response["Cache-Control"] == "public, max-age=60"
    assert json.loads(response.content) == {**FRENCH, "accent": "#0b6e4f"}
    # Nothing of the key or its tenant besides.
    body = response.content.decode()
    for secret in (key.prefix, key.key_hash, "acme", "Acme Store", "shop.example", str(key.max_sessions)):
        assert secret not in body


def test_a_key_without_an_appearance_gets_the_defaults(client, key):
    assert json.loads(read(client, key.raw).content) == DEFAULTS


def test_an_unknown_key_gets_404(client, key):
    assert read(client, key.raw[:-1] + ("x" if key.raw[-1] != "x" else "y")).status_code == 404
    assert read(client, "pk_live_nothing_like_a_key").status_code == 404
    assert client.get(reverse("widget:appearance")).status_code == 404


def test_a_revoked_key_gets_404(client, key):
    tenancy.key_revoke(key=key)
    response = read(client, key.raw)
    assert response.status_code == 404
    assert response["Access-Control-Allow-Origin"] == "*"
    assert json.loads(response.content) == {"error": "not a usable key"}


def test_a_disabled_key_gets_404(client, key):
    tenancy.key_update(key=key, changes={"status": ApiKey.Status.DISABLED})
    assert read(client, key.raw).status_code == 404


def test_an_expired_key_gets_404(client, key):
    ApiKey.objects.filter(pk=key.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert read(client, key.raw).status_code == 404


def test_the_appearance_is_only_read(client, key):
    assert client.post(reverse("widget:appearance") + "?key=" + key.raw).status_code == 405
