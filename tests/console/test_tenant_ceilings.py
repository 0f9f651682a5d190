"""A tenant's own ceilings: its live sessions over all its keys, and its
keys. The service's operators (superusers) set them in the admin; a
tenant's owners see them in the console and cannot change them, not even
as staff in the admin. A key past the key ceiling is refused wherever keys
are made: the console, the admin, ``manage.py createapikey``.

Personas: Olivia owns Acme in the console; Otto is staff and owner of Acme
with every model permission on tenants and keys; Root is a superuser.
"""
from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission
from django.core.management import CommandError, call_command
from django.test import Client
from django.urls import reverse

from aitp import tenancy
from aitp.models import ApiKey, OperatorAction
from tenants.models import Tenant
from tests.console.conftest import OWNER, make_session, member
from tests.console.test_quota import change_form_data

pytestmark = pytest.mark.django_db

CEILING_WORDS = "as many as its ceiling allows"


def hold_keys(tenant: Tenant, *, ceiling: int, active: int, revoked: int = 0) -> None:
    Tenant.objects.filter(pk=tenant.pk).update(max_keys=None)
    for n in range(active + revoked):
        key, _ = tenancy.key_create(tenant=tenant, name=f"k{n}")
        if n >= active:
            tenancy.key_revoke(key=key)
    Tenant.objects.filter(pk=tenant.pk).update(max_keys=ceiling)


@pytest.fixture
def root_client(django_user_model) -> Client:
    root = django_user_model.objects.create_superuser(username="root", password=None)
    client = Client()
    client.force_login(root)
    return client


@pytest.fixture
def otto_client(django_user_model, acme) -> Client:
    otto = member(django_user_model, acme, "otto", OWNER, is_staff=True)
    otto.user_permissions.add(*Permission.objects.filter(
        content_type__app_label__in=["aitp", "tenants"], content_type__model__in=["tenant", "apikey"]))
    client = Client()
    client.force_login(otto)
    return client


def new_key_in_the_console(client: Client):
    return client.post(reverse("console:key_create", args=["acme"]), {
        "name": "one more", "allowed_origins": "", "max_sessions": "3", "expires_at": "",
    })


def new_key_in_the_admin(client: Client, tenant: Tenant):
    return client.post(reverse("admin:aitp_apikey_add"), {
        "tenant": tenant.pk, "name": "one more", "status": "active", "allowed_origins": "[]",
        "max_sessions": 3,
    })


# --- the key ceiling, on every path that makes keys --------------------------------------


def test_the_console_refuses_a_key_past_the_tenants_key_ceiling_with_a_form_error(owner_client, acme):
    hold_keys(acme, ceiling=2, active=2)

    response = new_key_in_the_console(owner_client)

    assert response.status_code == 200
    errors = response.context["form"].non_field_errors()
    assert len(errors) == 1 and CEILING_WORDS in errors[0] and "2 keys" in errors[0]
    assert CEILING_WORDS in response.content.decode()
    assert response.context.get("raw_key") is None
    assert ApiKey.objects.filter(tenant=acme).count() == 2
    assert not OperatorAction.objects.filter(action="key_created", data__name="one more").exists()


def test_revoked_keys_leave_room_under_the_key_ceiling(owner_client, acme):
    hold_keys(acme, ceiling=2, active=1, revoked=3)

    response = new_key_in_the_console(owner_client)

    assert response.context["raw_key"]
    assert ApiKey.objects.filter(tenant=acme).exclude(status=ApiKey.Status.REVOKED).count() == 2


def test_a_disabled_key_still_counts_against_the_key_ceiling(acme):
    hold_keys(acme, ceiling=1, active=1)
    tenancy.key_update(key=ApiKey.objects.get(tenant=acme), changes={"status": ApiKey.Status.DISABLED})
    with pytest.raises(tenancy.KeyCeilingReached):
        tenancy.key_create(tenant=acme)


def test_the_admin_refuses_a_key_past_the_tenants_key_ceiling_with_a_form_error(root_client, acme):
    hold_keys(acme, ceiling=1, active=1)

    response = new_key_in_the_admin(root_client, acme)

    assert response.status_code == 200  # the form again, with its error
    errors = response.context["adminform"].form.errors["tenant"]
    assert len(errors) == 1 and CEILING_WORDS in errors[0]
    assert ApiKey.objects.filter(tenant=acme).count() == 1


def test_the_admin_makes_a_key_under_the_ceiling(root_client, acme):
    hold_keys(acme, ceiling=2, active=1)
    response = new_key_in_the_admin(root_client, acme)
    assert response.status_code == 200 and response.context["raw_key"]
    assert ApiKey.objects.filter(tenant=acme).count() == 2


def test_createapikey_refuses_a_key_past_the_tenants_key_ceiling(acme, capsys):
    hold_keys(acme, ceiling=1, active=1)

    with pytest.raises(CommandError, match=CEILING_WORDS):
        call_command("createapikey", "--tenant", "acme", "--name", "cli")

    assert ApiKey.objects.filter(tenant=acme).count() == 1
    assert "pk_live_" not in capsys.readouterr().out


def test_a_tenant_without_a_key_ceiling_takes_any_number_of_keys(acme):
    Tenant.objects.filter(pk=acme.pk).update(max_keys=None)
    acme.refresh_from_db()
    for n in range(5):
        tenancy.key_create(tenant=acme, name=f"k{n}")
    assert ApiKey.objects.filter(tenant=acme).count() == 5


# --- who sets the ceilings ------------------------------------------------------------------


def test_new_tenants_get_the_default_ceilings_of_the_settings(settings):
    settings.OWLLAYER_DEFAULT_TENANT_SESSION_CAP = 7
    settings.OWLLAYER_DEFAULT_TENANT_KEY_CAP = 3
    tenant = tenancy.tenant_create(slug="fresh")
    assert (tenant.max_sessions, tenant.max_keys) == (7, 3)
    settings.OWLLAYER_DEFAULT_TENANT_SESSION_CAP = 0
    settings.OWLLAYER_DEFAULT_TENANT_KEY_CAP = 0
    unbounded = tenancy.tenant_create(slug="unbounded")
    assert (unbounded.max_sessions, unbounded.max_keys) == (None, None)


def test_an_operator_changes_a_tenants_ceilings_in_the_admin(root_client, acme):
    url = reverse("admin:tenants_tenant_change", args=[acme.pk])
    data = change_form_data(root_client, url)
    assert {"max_sessions", "max_keys"} <= set(data)

    response = root_client.post(url, {**data, "max_sessions": "12", "max_keys": ""})

    assert response.status_code == 302, response.content.decode()[:2000]
    acme.refresh_from_db()
    assert (acme.max_sessions, acme.max_keys) == (12, None)
    action = OperatorAction.objects.get(action="tenant_updated")
    assert action.data == {"fields": ["max_keys", "max_sessions"], "max_sessions": 12, "max_keys": None}


def test_a_ceiling_below_one_is_refused_in_the_admin(root_client, acme):
    url = reverse("admin:tenants_tenant_change", args=[acme.pk])
    response = root_client.post(url, {**change_form_data(root_client, url), "max_sessions": "0"})
    assert "max_sessions" in response.context["adminform"].form.errors
    acme.refresh_from_db()
    assert acme.max_sessions == 200


def test_a_tenants_own_staff_see_its_ceilings_in_the_admin_but_cannot_raise_them(otto_client, acme):
    Tenant.objects.filter(pk=acme.pk).update(max_sessions=5, max_keys=2)
    url = reverse("admin:tenants_tenant_change", args=[acme.pk])
    page = otto_client.get(url)
    data = change_form_data(otto_client, url)
    assert "max_sessions" not in data and "max_keys" not in data  # shown, not editable
    assert "live session ceiling" in page.content.decode().lower()

    otto_client.post(url, {**data, "max_sessions": "100000", "max_keys": "100000"})

    acme.refresh_from_db()
    assert (acme.max_sessions, acme.max_keys) == (5, 2)


def test_the_console_shows_an_owner_the_ceilings_and_offers_no_way_to_change_them(
        owner_client, acme, acme_key):
    Tenant.objects.filter(pk=acme.pk).update(max_sessions=8, max_keys=4)
    make_session(acme_key)

    html = owner_client.get(reverse("console:keys", args=["acme"])).content.decode()

    section = html.split("data-ceilings")[1].split("</p>")[0]
    assert 'data-keys-held>1<' in section and 'data-key-ceiling>4<' in section
    assert 'data-tenant-live>1<' in section and 'data-session-ceiling>8<' in section
    assert "<form" not in section and "<input" not in section


def test_a_tenant_made_by_an_operator_with_a_blank_ceiling_has_none(root_client):
    response = root_client.post(reverse("admin:tenants_tenant_add"), {
        "slug": "open", "name": "Open", "system_prompt": "", "monthly_token_quota": "",
        "max_sessions": "", "max_keys": "9",
        "memberships-TOTAL_FORMS": 0, "memberships-INITIAL_FORMS": 0,
        "memberships-MIN_NUM_FORMS": 0, "memberships-MAX_NUM_FORMS": 1000,
    })
    assert response.status_code == 302, response.content.decode()[:2000]
    tenant = Tenant.objects.get(slug="open")
    assert (tenant.max_sessions, tenant.max_keys) == (None, 9)


def test_only_known_ceilings_are_set_by_the_tenant_service(django_user_model):
    root = django_user_model.objects.create_superuser(username="root", password=None)
    with pytest.raises(ValueError, match="not a tenant ceiling"):
        tenancy.tenant_create(slug="x", by=root, max_sessionz=3)
