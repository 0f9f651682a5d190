"""The console's Budget page: owners set the monthly budget and the alert
webhook; viewers read them; the month's cost so far is shown."""
from __future__ import annotations

import pytest
from django.urls import reverse
from django.utils import timezone

from aitp.models import OperatorAction, TurnRecord
from tests.console.conftest import make_session

pytestmark = pytest.mark.django_db


def url(tenant) -> str:
    return reverse("console:budget", args=[tenant.slug])


def test_an_owner_sets_a_budget_in_dollars_and_an_alert_webhook(owner_client, acme, olivia):
    response = owner_client.post(url(acme), {"budget_usd": "250.50",
                                             "alert_webhook_url": "https://hooks.acme.example/owl"})

    assert response.status_code == 302
    acme.refresh_from_db()
    assert acme.monthly_budget_micros == 250_500_000
    assert acme.alert_webhook_url == "https://hooks.acme.example/owl"
    action = OperatorAction.objects.get(action="tenant_budget_updated")
    assert action.user == olivia and action.data["fields"] == ["alert_webhook_url", "monthly_budget_micros"]


def test_an_owner_clears_the_budget_with_an_empty_field(owner_client, acme):
    owner_client.post(url(acme), {"budget_usd": "100", "alert_webhook_url": ""})

    owner_client.post(url(acme), {"budget_usd": "", "alert_webhook_url": ""})

    acme.refresh_from_db()
    assert acme.monthly_budget_micros is None


def test_a_budget_of_zero_or_a_webhook_that_is_not_http_is_refused(owner_client, acme):
    response = owner_client.post(url(acme), {"budget_usd": "0", "alert_webhook_url": "ftp://files.example/x"})

    assert response.status_code == 200
    assert set(response.context["form"].errors) == {"budget_usd", "alert_webhook_url"}
    acme.refresh_from_db()
    assert acme.monthly_budget_micros is None and acme.alert_webhook_url == ""


def test_a_viewer_reads_the_budget_page_but_cannot_change_it(viewer_client, owner_client, acme):
    owner_client.post(url(acme), {"budget_usd": "100", "alert_webhook_url": ""})

    page = viewer_client.get(url(acme))
    refused = viewer_client.post(url(acme), {"budget_usd": "", "alert_webhook_url": ""})

    assert page.status_code == 200 and b"US$100.00" in page.content
    assert b'data-form="budget"' not in page.content and b"data-secret" not in page.content
    assert refused.status_code == 403
    acme.refresh_from_db()
    assert acme.monthly_budget_micros == 100_000_000


def test_the_page_shows_the_months_cost_so_far_and_that_the_budget_stops_nothing(owner_client, acme, acme_key):
    owner_client.post(url(acme), {"budget_usd": "10", "alert_webhook_url": ""})
    session = make_session(acme_key)
    now = timezone.now()
    TurnRecord.objects.create(session=session, number=1, started_at=now, ended_at=now, outcome="answered",
                              cost_micros=2_500_000, model="m")

    page = owner_client.get(url(acme))

    text = page.content.decode()
    assert "US$2.50" in text and "US$10.00" in text and "(25% used)" in text
    assert "it does not stop" in text


def test_another_tenants_owner_cannot_see_the_budget_page(bea_client, acme):
    assert bea_client.get(url(acme)).status_code == 404


def test_the_admin_shows_the_budget_read_only_and_never_the_alert_secret(acme, django_user_model):
    from django.test import Client

    root = django_user_model.objects.create_superuser(username="root", password=None, email="root@x.example")
    client = Client()
    client.force_login(root)

    page = client.get(reverse("admin:tenants_tenant_change", args=[acme.pk]))

    assert page.status_code == 200
    form = page.context["adminform"].form
    assert "monthly_budget_micros" not in form.fields and "alert_webhook_url" not in form.fields
    assert acme.alert_webhook_secret not in page.content.decode()
