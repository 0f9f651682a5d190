"""The admin creates and changes tenants, keys and members through the same
functions as the console (``aitp.tenancy``): the same operator actions are
recorded, and a page from an origin just removed is closed at once, with the
same error and close code as from the console."""
from __future__ import annotations

import json

import pytest
from asgiref.sync import sync_to_async
from django.test import AsyncClient
from django.urls import reverse

from aitp import tenancy
from aitp.models import ApiKey, OperatorAction, Session
from tenants.models import Tenant, TenantMembership
from tests.aitp.conftest import ORIGIN, connect, open_page  # noqa: F401 (connect is a fixture)
from tests.console.conftest import OWNER, VIEWER, member, signed_in
from tests.support.pages import patient

OTHER_ORIGIN = "https://other.example"


def grant_admin_rights(user):
    """The model permissions an operator needs to manage keys and members in the admin."""
    from django.contrib.auth.models import Permission

    user.user_permissions.add(*Permission.objects.filter(
        content_type__app_label__in=["aitp", "tenants"],
        codename__in=["view_apikey", "add_apikey", "change_apikey", "view_tenant", "change_tenant",
                      "view_tenantmembership", "add_tenantmembership", "change_tenantmembership",
                      "delete_tenantmembership"],
    ))
    return user


def key_form(key: ApiKey, **changes) -> dict:
    """The admin's change form for a key as it stands, with some fields changed."""
    fields = {
        "name": key.name, "status": key.status, "allowed_origins": json.dumps(key.allowed_origins),
        "max_sessions": key.max_sessions, "expires_at_0": "", "expires_at_1": "",
    }
    return {**fields, **changes}


def members_form(tenant, rows: list[dict]) -> dict:
    """The tenant's change form with its membership inline: each row is
    {"id", "user", "role"} and an optional "DELETE"."""
    prefix = "memberships"
    existing = sum(1 for row in rows if row.get("id"))
    form = {
        "slug": tenant.slug, "name": tenant.name, "system_prompt": tenant.system_prompt,
        "monthly_token_quota": "", "created_at_0": "2026-01-01", "created_at_1": "00:00:00",
        f"{prefix}-TOTAL_FORMS": len(rows), f"{prefix}-INITIAL_FORMS": existing,
        f"{prefix}-MIN_NUM_FORMS": 0, f"{prefix}-MAX_NUM_FORMS": 1000,
    }
    for i, row in enumerate(rows):
        form[f"{prefix}-{i}-id"] = row.get("id", "")
        form[f"{prefix}-{i}-tenant"] = tenant.pk
        form[f"{prefix}-{i}-user"] = row["user"]
        form[f"{prefix}-{i}-role"] = row["role"]
        if row.get("DELETE"):
            form[f"{prefix}-{i}-DELETE"] = "on"
    return form


# --- a removed origin closes the page at once, from either place -------------------------


def _two_origin_key(django_user_model):
    tenant = tenancy.tenant_create(slug="acme", name="Acme Store")
    key, raw = tenancy.key_create(tenant=tenant, name="web", allowed_origins=[ORIGIN, OTHER_ORIGIN])
    key.raw = raw
    owner = django_user_model.objects.create_user(username="olivia", password="x", is_staff=True)
    TenantMembership.objects.create(tenant=tenant, user=owner, role=TenantMembership.Role.OWNER)
    grant_admin_rights(owner)
    return key, owner


async def _remove_origin_in_console(client, key):
    return await client.post(reverse("console:key_edit", args=["acme", key.pk]), {
        "name": key.name, "allowed_origins": OTHER_ORIGIN, "max_sessions": key.max_sessions,
        "confirm_ending": "1",  # the one live session from the removed origin
    })


async def _remove_origin_in_admin(client, key):
    return await client.post(reverse("admin:aitp_apikey_change", args=[key.pk]),
                             key_form(key, allowed_origins=json.dumps([OTHER_ORIGIN])))


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("remove_origin", [_remove_origin_in_console, _remove_origin_in_admin],
                         ids=["console", "admin"])
async def test_a_page_from_an_origin_removed_is_closed_at_once(connect, django_user_model,
                                                                remove_origin):
    key, owner = await sync_to_async(_two_origin_key)(django_user_model)
    page = await open_page(patient(connect), key)
    client = AsyncClient()
    await client.aforce_login(owner)

    response = await remove_origin(client, key)

    assert response.status_code == 302, response.content.decode()[-3000:]
    # Not at the next heartbeat: the change notice reaches the page first.
    error = await page.recv()
    assert error["payload"]["data"]["code"] == "origin_not_allowed"
    assert (await page.recv())["code"] == 1008
    assert (await ApiKey.objects.aget(pk=key.pk)).allowed_origins == [OTHER_ORIGIN]
    assert await OperatorAction.objects.filter(action="key_updated", user=owner).aexists()
    await page.close()
    assert await Session.objects.filter(api_key_id=key.pk, ended_at__isnull=True).acount() == 0


# --- keys --------------------------------------------------------------------------------


@pytest.fixture
def staff_owner(django_user_model, acme):
    """Olivia, owner of Acme, with the admin's rights on keys and tenants."""
    return grant_admin_rights(member(django_user_model, acme, "olivia", OWNER, is_staff=True))


@pytest.fixture
def admin_client(staff_owner):
    return signed_in(staff_owner)


def test_a_key_made_in_the_admin_is_recorded_as_made_by_its_author(admin_client, staff_owner, acme):
    response = admin_client.post(reverse("admin:aitp_apikey_add"), {
        "tenant": acme.pk, "name": "admin-made", "status": "active",
        "allowed_origins": '["HTTPS://Shop.Example:443/"]', "max_sessions": 3,
    })

    assert response.status_code == 200
    key = ApiKey.objects.get(name="admin-made")
    assert key.allowed_origins == ["https://shop.example"]
    action = OperatorAction.objects.get(action="key_created")
    assert (action.user, action.data["prefix"]) == (staff_owner, key.prefix)


def test_a_key_edited_in_the_admin_records_what_changed(admin_client, staff_owner, acme_key):
    response = admin_client.post(reverse("admin:aitp_apikey_change", args=[acme_key.pk]),
                                 key_form(acme_key, name="renamed", max_sessions=7))

    assert response.status_code == 302
    action = OperatorAction.objects.get(action="key_updated")
    assert action.user == staff_owner
    assert action.data == {"prefix": acme_key.prefix, "name": "renamed", "max_sessions": 7}


def test_an_expiry_cleared_in_the_admin_is_recorded(admin_client, acme_key):
    from datetime import timedelta

    from django.utils import timezone

    ApiKey.objects.filter(pk=acme_key.pk).update(expires_at=timezone.now() + timedelta(days=3))
    acme_key.refresh_from_db()

    response = admin_client.post(reverse("admin:aitp_apikey_change", args=[acme_key.pk]),
                                 key_form(acme_key))  # the expiry's boxes left empty

    assert response.status_code == 302
    acme_key.refresh_from_db()
    assert acme_key.expires_at is None
    assert OperatorAction.objects.get(action="key_updated").data == {
        "prefix": acme_key.prefix, "expires_at": None,
    }


def test_a_key_saved_in_the_admin_with_its_expiry_untouched_keeps_it_to_the_microsecond(admin_client, acme_key):
    from datetime import timedelta

    from django.utils import timezone

    expiry = (timezone.now() + timedelta(days=3)).replace(microsecond=123456)
    ApiKey.objects.filter(pk=acme_key.pk).update(expires_at=expiry)
    acme_key.refresh_from_db()
    shown = timezone.localtime(expiry)  # the form shows whole seconds

    response = admin_client.post(reverse("admin:aitp_apikey_change", args=[acme_key.pk]), key_form(
        acme_key, name="renamed", expires_at_0=shown.date().isoformat(), expires_at_1=shown.strftime("%H:%M:%S")))

    assert response.status_code == 302
    acme_key.refresh_from_db()
    assert (acme_key.name, acme_key.expires_at) == ("renamed", expiry)
    assert OperatorAction.objects.get(action="key_updated").data == {"prefix": acme_key.prefix, "name": "renamed"}


def test_an_origin_that_is_not_an_origin_is_refused_in_the_admin(admin_client, acme_key):
    response = admin_client.post(reverse("admin:aitp_apikey_change", args=[acme_key.pk]),
                                 key_form(acme_key, allowed_origins='["https://x.example/path"]'))

    assert response.status_code == 200
    assert "an origin has no path" in str(response.context["adminform"].form.errors["allowed_origins"])
    acme_key.refresh_from_db()
    assert acme_key.allowed_origins == ["https://shop.example"]
    assert not OperatorAction.objects.exists()


def test_a_revoked_key_cannot_be_reactivated_in_the_admin(admin_client, staff_owner, acme_key):
    tenancy.key_revoke(key=acme_key, by=staff_owner)
    acme_key.refresh_from_db()

    response = admin_client.post(reverse("admin:aitp_apikey_change", args=[acme_key.pk]),
                                 key_form(acme_key, status="active"))

    assert response.status_code == 200
    assert "cannot be re-activated" in str(response.context["adminform"].form.errors["status"])
    acme_key.refresh_from_db()
    assert acme_key.status == ApiKey.Status.REVOKED


def test_a_key_disabled_in_the_admin_is_recorded_once(admin_client, staff_owner, acme_key):
    response = admin_client.post(reverse("admin:aitp_apikey_change", args=[acme_key.pk]),
                                 key_form(acme_key, status="disabled"))

    assert response.status_code == 302
    acme_key.refresh_from_db()
    assert acme_key.status == ApiKey.Status.DISABLED
    assert list(OperatorAction.objects.values_list("action", flat=True)) == ["key_disabled"]


def new_key_form(acme, **changes) -> dict:
    """The admin's add form for a key, with some fields changed or added."""
    return {"tenant": acme.pk, "name": "admin-made", "allowed_origins": '["https://shop.example"]',
            "max_sessions": 3, "expires_at_0": "", "expires_at_1": "", **changes}


def test_the_admin_add_form_for_a_key_has_no_status_and_no_revocation(admin_client):
    form = admin_client.get(reverse("admin:aitp_apikey_add")).context["adminform"].form

    assert set(form.fields) == {"tenant", "name", "allowed_origins", "max_sessions", "expires_at", "handoff"}
    html = admin_client.get(reverse("admin:aitp_apikey_add")).content.decode()
    assert 'name="status"' not in html and "Revoked at" not in html


@pytest.mark.parametrize("status", ["revoked", "disabled"])
def test_a_key_added_in_the_admin_is_active_whatever_status_is_posted(admin_client, acme, status):
    response = admin_client.post(reverse("admin:aitp_apikey_add"),
                                 new_key_form(acme, status=status, revoked_at_0="2026-01-01", revoked_at_1="00:00"))

    assert response.status_code == 200  # the page that shows the new key once
    key = ApiKey.objects.get(name="admin-made")
    assert (key.status, key.revoked_at) == (ApiKey.Status.ACTIVE, None)
    assert list(OperatorAction.objects.values_list("action", flat=True)) == ["key_created"]


def test_a_key_made_in_the_admin_has_the_cap_and_expiry_it_was_given(admin_client, acme):
    from datetime import timedelta

    from django.utils import timezone

    expiry = timezone.localtime(timezone.now() + timedelta(days=30)).replace(microsecond=0)
    response = admin_client.post(reverse("admin:aitp_apikey_add"), new_key_form(
        acme, max_sessions=7, expires_at_0=expiry.date().isoformat(), expires_at_1=expiry.strftime("%H:%M:%S")))

    assert response.status_code == 200
    key = ApiKey.objects.get(name="admin-made")
    assert (key.max_sessions, key.expires_at) == (7, expiry)


def test_a_key_added_in_the_admin_cannot_be_already_expired(admin_client, acme):
    response = admin_client.post(reverse("admin:aitp_apikey_add"),
                                 new_key_form(acme, expires_at_0="2020-01-01", expires_at_1="00:00"))

    assert response.status_code == 200
    assert "the expiry must be in the future" in str(response.context["adminform"].form.errors["expires_at"])
    assert not ApiKey.objects.filter(name="admin-made").exists()


@pytest.mark.parametrize("status", ["revoked", "disabled"])
def test_the_key_service_makes_no_key_that_is_not_active(acme, staff_owner, status):
    with pytest.raises(TypeError):
        tenancy.key_create(tenant=acme, by=staff_owner, name="x", allowed_origins=[],
                           max_sessions=1, status=status)
    with pytest.raises(TypeError):
        tenancy.key_create(tenant=acme, name="x", status=status)
    assert not ApiKey.objects.filter(name="x").exists()


def test_a_key_is_revoked_in_the_admin_never_deleted(django_user_model, acme_key):
    root = django_user_model.objects.create_superuser(username="root", password="x")
    client = signed_in(root)

    page = client.get(reverse("admin:aitp_apikey_delete", args=[acme_key.pk]))
    bulk = client.post(reverse("admin:aitp_apikey_changelist"),
                       {"action": "delete_selected", "_selected_action": [acme_key.pk]})

    assert page.status_code == 403
    assert bulk.status_code == 302  # back to the list: no such action
    listing = client.get(reverse("admin:aitp_apikey_changelist")).content.decode()
    assert "delete_selected" not in listing and "revoke_keys" in listing
    assert ApiKey.objects.filter(pk=acme_key.pk).exists()


# --- members -------------------------------------------------------------------------------


def test_a_tenant_changed_in_the_admin_is_recorded(django_user_model, acme):
    root = django_user_model.objects.create_superuser(username="root", password="x")
    form = {**members_form(acme, []), "name": "Acme Shop", "monthly_token_quota": "5000",
            "system_prompt": "Be brief."}

    response = signed_in(root).post(reverse("admin:tenants_tenant_change", args=[acme.pk]), form)

    assert response.status_code == 302
    acme.refresh_from_db()
    assert (acme.name, acme.monthly_token_quota, acme.system_prompt) == ("Acme Shop", 5000, "Be brief.")
    action = OperatorAction.objects.get(action="tenant_updated")
    assert (action.user, action.data) == (root, {
        "fields": ["monthly_token_quota", "name", "system_prompt"], "name": "Acme Shop",
        "monthly_token_quota": 5000,
    })


def test_a_member_added_in_the_admin_is_recorded(admin_client, staff_owner, acme, django_user_model):
    mia = django_user_model.objects.create_user(username="mia", password="x")
    olivia_row = TenantMembership.objects.get(user=staff_owner)

    response = admin_client.post(reverse("admin:tenants_tenant_change", args=[acme.pk]), members_form(acme, [
        {"id": olivia_row.pk, "user": staff_owner.pk, "role": OWNER},
        {"user": mia.pk, "role": VIEWER},
    ]))

    assert response.status_code == 302, response.context and response.context["inline_admin_formsets"]
    assert TenantMembership.objects.get(tenant=acme, user=mia).role == VIEWER
    action = OperatorAction.objects.get(action="member_added")
    assert (action.user, action.data) == (staff_owner, {"member": "mia", "role": VIEWER})


def test_ownership_handed_over_in_one_admin_save_is_recorded_in_order(admin_client, staff_owner, acme,
                                                                        django_user_model):
    mia = member(django_user_model, acme, "mia", VIEWER)
    olivia_row = TenantMembership.objects.get(user=staff_owner)
    mia_row = TenantMembership.objects.get(user=mia)

    response = admin_client.post(reverse("admin:tenants_tenant_change", args=[acme.pk]), members_form(acme, [
        {"id": olivia_row.pk, "user": staff_owner.pk, "role": VIEWER},
        {"id": mia_row.pk, "user": mia.pk, "role": OWNER},
    ]))

    assert response.status_code == 302
    roles = dict(TenantMembership.objects.filter(tenant=acme).values_list("user__username", "role"))
    assert roles == {"olivia": VIEWER, "mia": OWNER}
    assert list(OperatorAction.objects.order_by("pk").values_list("action", "data__member")) == [
        ("member_role_changed", "mia"), ("member_role_changed", "olivia"),
    ]


def test_the_admin_refuses_to_leave_a_tenant_without_an_owner(admin_client, staff_owner, acme):
    olivia_row = TenantMembership.objects.get(user=staff_owner)

    response = admin_client.post(reverse("admin:tenants_tenant_change", args=[acme.pk]), members_form(acme, [
        {"id": olivia_row.pk, "user": staff_owner.pk, "role": OWNER, "DELETE": True},
    ]))

    assert response.status_code == 200
    assert b"a tenant needs at least one owner" in response.content
    assert TenantMembership.objects.filter(pk=olivia_row.pk, role=OWNER).exists()
    assert not OperatorAction.objects.exists()


def test_a_member_removed_in_the_admin_is_recorded(admin_client, staff_owner, acme, django_user_model):
    mia = member(django_user_model, acme, "mia", VIEWER)
    olivia_row = TenantMembership.objects.get(user=staff_owner)
    mia_row = TenantMembership.objects.get(user=mia)

    response = admin_client.post(reverse("admin:tenants_tenant_change", args=[acme.pk]), members_form(acme, [
        {"id": olivia_row.pk, "user": staff_owner.pk, "role": OWNER},
        {"id": mia_row.pk, "user": mia.pk, "role": VIEWER, "DELETE": True},
    ]))

    assert response.status_code == 302
    assert not TenantMembership.objects.filter(pk=mia_row.pk).exists()
    assert OperatorAction.objects.get(action="member_removed").data == {"member": "mia", "role": VIEWER}


# --- tenants -------------------------------------------------------------------------------


def new_tenant_form(**fields) -> dict:
    """The admin's add form for a tenant, with its first members as rows of the inline."""
    members = fields.pop("members", [])
    prefix = "memberships"
    form = {
        "slug": "delta", "name": "Delta Goods", "system_prompt": "Be kind.", "monthly_token_quota": "",
        # The ceilings as the form shows them (the defaults for new tenants).
        "max_sessions": "200", "max_keys": "50",
        f"{prefix}-TOTAL_FORMS": len(members), f"{prefix}-INITIAL_FORMS": 0,
        f"{prefix}-MIN_NUM_FORMS": 0, f"{prefix}-MAX_NUM_FORMS": 1000, **fields,
    }
    for i, row in enumerate(members):
        form[f"{prefix}-{i}-user"] = row["user"]
        form[f"{prefix}-{i}-role"] = row["role"]
    return form


def test_a_tenant_made_in_the_admin_is_recorded_as_made_by_its_author(django_user_model):
    root = django_user_model.objects.create_superuser(username="root", password="x")

    response = signed_in(root).post(reverse("admin:tenants_tenant_add"),
                                    new_tenant_form(monthly_token_quota="9000"))

    assert response.status_code == 302
    tenant = Tenant.objects.get(slug="delta")
    assert (tenant.name, tenant.system_prompt, tenant.monthly_token_quota) == ("Delta Goods", "Be kind.", 9000)
    action = OperatorAction.objects.get(action="tenant_created")
    assert (action.user, action.tenant, action.data) == (root, tenant, {
        "fields": ["max_keys", "max_sessions", "monthly_token_quota", "name", "slug", "system_prompt"],
        "slug": "delta", "name": "Delta Goods", "monthly_token_quota": 9000, "max_sessions": 200,
        "max_keys": 50,
    })


def test_a_tenant_made_in_the_admin_with_its_first_owner_records_both(django_user_model):
    root = django_user_model.objects.create_superuser(username="root", password="x")
    dora = django_user_model.objects.create_user(username="dora", password="x")

    response = signed_in(root).post(reverse("admin:tenants_tenant_add"),
                                    new_tenant_form(members=[{"user": dora.pk, "role": OWNER}]))

    assert response.status_code == 302
    tenant = Tenant.objects.get(slug="delta")
    assert TenantMembership.objects.get(tenant=tenant).user == dora
    assert list(OperatorAction.objects.order_by("pk").values_list("action", "data__member")) == [
        ("tenant_created", None), ("member_added", "dora"),
    ]


def test_a_tenants_own_staff_create_no_tenant_in_the_admin(staff_owner):
    from django.contrib.auth.models import Permission

    staff_owner.user_permissions.add(Permission.objects.get(codename="add_tenant"))
    client = signed_in(staff_owner)

    page = client.get(reverse("admin:tenants_tenant_add"))
    post = client.post(reverse("admin:tenants_tenant_add"), new_tenant_form())

    assert (page.status_code, post.status_code) == (403, 403)
    assert not Tenant.objects.filter(slug="delta").exists()
