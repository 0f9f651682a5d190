"""The admin names its apps, models and fields as a person writes them:
"API keys", "Daily usage", "Approvals to review", never "Api keys", "Aitp"
or "Daily usages"."""
from __future__ import annotations

import re

import pytest
from django.contrib.admin.utils import quote
from django.test import Client
from django.urls import reverse

from tests.support.people import acme, make_session, make_user, root  # noqa: F401 (fixtures)

pytestmark = pytest.mark.django_db

EXPECTED = {
    "Sessions and keys": ["API keys", "Alert deliveries", "Conversation messages", "Daily usage",
                          "Operator actions", "Sessions", "Tool calls"],
    "Approvals and tools": ["Approvals", "Approvals to review", "Audit events", "Pending approvals",
                            "Server tools"],
    "Tenants": ["Tenants"],
    "Operators": ["Live sessions"],
    "Demo store": ["Orders"],
}


def signed_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_the_admin_index_names_the_products_apps_and_models_in_words(root):
    page = signed_in(root).get(reverse("admin:index"))

    shown = {app["name"]: [model["name"] for model in app["models"]] for app in page.context["app_list"]}
    assert {name: shown.get(name) for name in EXPECTED} == EXPECTED
    html = page.content.decode()
    for written_by_a_machine in ("Aitp", "Api key", "Daily usages", "Review queue", "(operator)", "Demo orders"):
        assert written_by_a_machine not in html


def test_a_sessions_page_names_its_fields_in_words(acme, root):
    session = make_session(acme, "ses_named", current_url="https://shop.example/cart", sdk_version="0.4.0")

    html = signed_in(root).get(reverse("admin:aitp_session_change", args=[quote(session.pk)])).content.decode()

    for label in ("Session ID", "API key", "Current URL", "SDK version", "Speech heard (ms)"):
        assert f"<label>{label}:</label>" in html, label
    for label in ("Id:", "Api key", "Current url", "Sdk version", "Audio heard ms"):
        assert label not in html, label


def test_a_tenants_members_are_headed_members(acme, root):
    make_user("olivia", tenant=acme)

    html = signed_in(root).get(reverse("admin:tenants_tenant_change", args=[acme.pk])).content.decode()

    assert re.search(r'<h2 id="memberships-heading" class="inline-heading">\s*Members\s*</h2>', html)
    assert "Tenant memberships" not in html
