"""Revoking the demo store's key in the console: the page says first that the
demo page uses it, and how to get a new one."""
from __future__ import annotations

import io

import pytest
from django.core.management import call_command
from django.test import Client
from django.urls import reverse

from aitp import tenancy
from aitp.store import keys

pytestmark = pytest.mark.django_db


@pytest.fixture
def demo(tmp_path, settings):
    """What `make run` leaves: the demo tenant, its key in the key file, and demo-owner."""
    from django.contrib.auth import get_user_model

    settings.OWLLAYER_DEMO_KEY_FILE = tmp_path / ".demo-key"
    call_command("ensure_demo", "--key-file", str(settings.OWLLAYER_DEMO_KEY_FILE),
                 "--logins-file", str(tmp_path / ".demo-logins"), stdout=io.StringIO())
    key = keys.api_key_lookup(settings.OWLLAYER_DEMO_KEY_FILE.read_text().strip())
    owner = Client()
    owner.force_login(get_user_model().objects.get(username="demo-owner"))
    return key, owner


def revoke_page(owner: Client, key) -> str:
    response = owner.get(reverse("console:key_revoke", args=[key.tenant.slug, key.pk]))
    assert response.status_code == 200
    return response.content.decode()


def test_the_revoke_page_of_the_demo_key_warns_that_the_demo_store_uses_it_and_how_to_get_another(demo):
    key, owner = demo

    page = revoke_page(owner, key)

    assert "data-demo-key" in page
    assert "This is the demo store's key." in page
    assert "<code>.demo-key</code>" in page and "<code>make run</code>" in page


def test_the_revoke_page_of_another_key_of_the_demo_tenant_does_not_warn(demo):
    key, owner = demo
    other, _ = tenancy.key_create(tenant=key.tenant, name="demo")

    assert "data-demo-key" not in revoke_page(owner, other)


def test_the_revoke_page_does_not_warn_once_the_demo_key_file_is_gone(demo, settings):
    key, owner = demo
    settings.OWLLAYER_DEMO_KEY_FILE.unlink()

    assert "data-demo-key" not in revoke_page(owner, key)
