"""The key changelist's bulk actions change only keys of tenants the user
owns. Olivia owns Acme and only views Beta: the changelist lists both
tenants' keys, and selecting Beta's in a bulk action changes nothing there
and says so."""
from __future__ import annotations

import pytest
from django.urls import reverse

from aitp import tenancy
from aitp.models import ApiKey, OperatorAction
from tenants.selectors import changeable_tenant_ids
from tests.console.conftest import OWNER, VIEWER, member, signed_in
from tests.console.test_admin_writes import grant_admin_rights

pytestmark = pytest.mark.django_db

CHANGED = {"revoke_keys": ApiKey.Status.REVOKED, "disable_keys": ApiKey.Status.DISABLED}
ACTIONS = pytest.mark.parametrize("action", sorted(CHANGED))


@pytest.fixture
def olivia(django_user_model, acme, beta):
    """Staff with the admin's rights on keys; owner of Acme, viewer of Beta."""
    user = member(django_user_model, acme, "olivia", OWNER, is_staff=True)
    member(django_user_model, beta, "olivia", VIEWER)
    return grant_admin_rights(user)


@pytest.fixture
def beta_key(beta):
    key, _raw = tenancy.key_create(tenant=beta, name="beta web")
    return key


def run_action(user, action: str, *keys: ApiKey):
    """Post the changelist's action form for the selected keys; the page it lands on."""
    return signed_in(user).post(reverse("admin:aitp_apikey_changelist"), {
        "action": action, "_selected_action": [key.pk for key in keys], "index": 0,
    }, follow=True)


def told(page) -> list[str]:
    return [str(message) for message in page.context["messages"]]


def status_of(key: ApiKey) -> str:
    return ApiKey.objects.get(pk=key.pk).status


@ACTIONS
def test_a_viewer_selecting_only_a_viewed_tenants_key_changes_nothing_and_is_told_so(
    olivia, beta_key, action
):
    page = run_action(olivia, action, beta_key)

    assert page.status_code == 200
    assert status_of(beta_key) == ApiKey.Status.ACTIVE
    assert not OperatorAction.objects.filter(tenant=beta_key.tenant).exists()
    assert told(page) == ["1 key left unchanged: you only view its tenant."]


@ACTIONS
def test_a_bulk_action_over_owned_and_viewed_keys_changes_only_the_owned_ones(
    olivia, acme_key, beta_key, action
):
    page = run_action(olivia, action, acme_key, beta_key)

    assert status_of(acme_key) == CHANGED[action]
    assert status_of(beta_key) == ApiKey.Status.ACTIVE
    assert OperatorAction.objects.filter(tenant=acme_key.tenant, user=olivia,
                                         action=f"key_{CHANGED[action]}").count() == 1
    assert not OperatorAction.objects.filter(tenant=beta_key.tenant).exists()
    verb = "revoked" if action == "revoke_keys" else "disabled"
    assert sorted(told(page)) == sorted([
        "1 key left unchanged: you only view its tenant.",
        f"1 key {verb}; their live sessions are closing.",
    ])


@ACTIONS
def test_keys_left_unchanged_are_counted_and_told_as_an_error(olivia, beta_key, action):
    second, _raw = tenancy.key_create(tenant=beta_key.tenant, name="beta app")

    page = run_action(olivia, action, beta_key, second)

    assert [(str(m), m.level_tag) for m in page.context["messages"]] == [
        ("2 keys left unchanged: you only view their tenants.", "error")]
    assert {status_of(beta_key), status_of(second)} == {ApiKey.Status.ACTIVE}


@ACTIONS
def test_a_viewed_tenant_that_someone_else_owns_is_still_left_unchanged(
    django_user_model, olivia, beta_key, action
):
    member(django_user_model, beta_key.tenant, "bob", OWNER)

    page = run_action(olivia, action, beta_key)

    assert status_of(beta_key) == ApiKey.Status.ACTIVE
    assert told(page) == ["1 key left unchanged: you only view its tenant."]


def test_the_tenants_a_user_may_change_are_exactly_the_ids_of_those_it_owns(
    django_user_model, acme, beta
):
    # Others' memberships first, so that no membership shares its number with its tenant.
    for name in ("amy", "ann", "abe"):
        member(django_user_model, beta, name, VIEWER)
    olivia = member(django_user_model, acme, "olivia", OWNER, is_staff=True)
    member(django_user_model, beta, "olivia", VIEWER)

    assert changeable_tenant_ids(olivia) == {acme.pk}


def test_the_key_lists_tenant_filter_names_only_tenants_the_user_sees(olivia, acme_key, beta_key):
    from aitp.tenancy import tenant_create

    hidden = tenant_create(slug="gamma-hidden", name="Gamma")
    tenancy.key_create(tenant=hidden, name="gamma web")

    page = signed_in(olivia).get(reverse("admin:aitp_apikey_changelist"))

    assert page.status_code == 200
    assert "gamma-hidden" not in page.content.decode()
    assert "beta" in page.content.decode()
