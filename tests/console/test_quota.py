"""The monthly token quota: tenants see it and this month's use in the
console; the service's operators (superusers) set it in the admin, a
tenant's own staff cannot.

Personas: Olivia owns Acme in the console; Otto is staff and owner of Acme
with every model permission on tenants; Root is a superuser.
"""
from __future__ import annotations

from datetime import timedelta
from html.parser import HTMLParser

import pytest
from django.contrib.auth.models import Permission
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from aitp.models import DailyUsage
from tenants.models import Tenant
from tests.console.conftest import OWNER, member

pytestmark = pytest.mark.django_db


def use_this_month(tenant: Tenant, input_tokens: int, output_tokens: int) -> None:
    today = timezone.localdate()
    DailyUsage.objects.create(tenant=tenant, date=today, input_tokens=input_tokens,
                              output_tokens=output_tokens, cache_read_tokens=777_777)
    # Last month's tokens do not count against this month's quota.
    DailyUsage.objects.create(tenant=tenant, date=today.replace(day=1) - timedelta(days=1),
                              input_tokens=50_000)


def quota_section(html: str) -> str:
    return html.split('id="quota-heading"')[1].split("</section>")[0]


# --- the console ---------------------------------------------------------------------


def test_the_usage_page_shows_the_quota_and_this_months_use(owner_client, acme):
    Tenant.objects.filter(pk=acme.pk).update(monthly_token_quota=10_000)
    use_this_month(acme, 1_500, 1_000)

    response = owner_client.get(reverse("console:usage", args=["acme"]))

    quota = response.context["quota"]
    assert (quota.quota, quota.used, quota.remaining, quota.percent) == (10_000, 2_500, 7_500, 25)
    section = quota_section(response.content.decode())
    assert "<span data-quota-used>2500</span>" in section
    assert "<span data-quota-limit>10000</span>" in section
    assert 'max="10000" value="2500"' in section
    assert "Used up" not in section


def test_a_tenant_without_a_quota_sees_no_limit_but_its_use(owner_client, acme):
    use_this_month(acme, 300, 200)

    section = quota_section(owner_client.get(reverse("console:usage", args=["acme"])).content.decode())

    assert "No quota: 500 tokens" in section
    assert "<meter" not in section


def test_a_used_up_quota_says_what_pages_get(owner_client, acme):
    Tenant.objects.filter(pk=acme.pk).update(monthly_token_quota=2_000)
    use_this_month(acme, 1_500, 1_000)

    section = quota_section(owner_client.get(reverse("console:usage", args=["acme"])).content.decode())

    assert "Used up" in section
    assert "API key usage limit exceeded." in section
    assert "0 left" in section


# --- the admin -----------------------------------------------------------------------


class FormFields(HTMLParser):
    """The values a browser would submit from the admin's change form."""

    def __init__(self) -> None:
        super().__init__()
        self.data: dict[str, str] = {}
        self._textarea: str | None = None
        self._select: str | None = None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        name = attrs.get("name")
        if tag == "input" and name and attrs.get("type") not in ("submit", "checkbox"):
            self.data[name] = attrs.get("value") or ""
        elif tag == "input" and name and "checked" in attrs:
            self.data[name] = "on"
        elif tag == "textarea" and name:
            self._textarea = name
            self.data[name] = ""
        elif tag == "select" and name:
            self._select = name
        elif tag == "option" and self._select and "selected" in attrs:
            self.data[self._select] = attrs.get("value") or ""

    def handle_endtag(self, tag):
        if tag == "textarea":
            self._textarea = None
        elif tag == "select":
            self._select = None

    def handle_data(self, data):
        if self._textarea:
            self.data[self._textarea] += data


def change_form_data(client: Client, url: str) -> dict[str, str]:
    parser = FormFields()
    parser.feed(client.get(url).content.decode())
    return {name: value.lstrip("\n") for name, value in parser.data.items()}


@pytest.fixture
def root_client(django_user_model) -> Client:
    root = django_user_model.objects.create_superuser(username="root", password=None)
    client = Client()
    client.force_login(root)
    return client


@pytest.fixture
def otto_client(django_user_model, acme) -> Client:
    otto = member(django_user_model, acme, "otto", OWNER, is_staff=True)
    otto.user_permissions.add(*Permission.objects.filter(content_type__app_label="aitp",
                                                         content_type__model="tenant"))
    client = Client()
    client.force_login(otto)
    return client


def test_an_operator_sets_a_tenants_quota_in_the_admin(root_client, acme):
    url = reverse("admin:tenants_tenant_change", args=[acme.pk])
    data = change_form_data(root_client, url)
    assert "monthly_token_quota" in data

    response = root_client.post(url, {**data, "monthly_token_quota": "250000"})

    assert response.status_code == 302, response.content.decode()[:2000]
    acme.refresh_from_db()
    assert acme.monthly_token_quota == 250_000


def test_an_empty_quota_in_the_admin_means_unlimited(root_client, acme):
    Tenant.objects.filter(pk=acme.pk).update(monthly_token_quota=10)
    url = reverse("admin:tenants_tenant_change", args=[acme.pk])

    root_client.post(url, {**change_form_data(root_client, url), "monthly_token_quota": ""})

    acme.refresh_from_db()
    assert acme.monthly_token_quota is None
    changelist = root_client.get(reverse("admin:tenants_tenant_changelist")).content.decode()
    assert "unlimited" in changelist


def test_a_tenants_own_staff_cannot_raise_its_quota(otto_client, acme):
    Tenant.objects.filter(pk=acme.pk).update(monthly_token_quota=1_000)
    url = reverse("admin:tenants_tenant_change", args=[acme.pk])
    data = change_form_data(otto_client, url)
    assert "monthly_token_quota" not in data  # shown, not editable

    otto_client.post(url, {**data, "monthly_token_quota": "999999999"})

    acme.refresh_from_db()
    assert acme.monthly_token_quota == 1_000


def test_the_admin_list_shows_each_tenants_quota_and_tokens_this_month(root_client, acme):
    Tenant.objects.filter(pk=acme.pk).update(monthly_token_quota=10_000)
    use_this_month(acme, 1_500, 1_000)

    html = root_client.get(reverse("admin:tenants_tenant_changelist")).content.decode()

    assert "10,000" in html
    assert "2,500 (25% of the quota)" in html
