"""The pending approvals' "By tenant" filter names only the tenants the
signed-in user may see: a staff member of one tenant never reads another
tenant's slug off it."""
from __future__ import annotations

import pytest

from aitp import tenancy
from tests.approvals.test_admin import logged_in, operator_approval, url

pytestmark = pytest.mark.django_db


def tenant_choices(page) -> list[str]:
    """The tenants the changelist's tenant filter offers, by slug (none: the
    admin leaves out a filter with a single choice)."""
    specs = [spec for spec in page.context["cl"].filter_specs
             if getattr(spec, "field_path", None) == "tenant"]
    return [name for spec in specs for _pk, name in spec.lookup_choices]


def test_a_staff_member_of_one_tenant_is_offered_only_that_tenant(acme_session, globex_session, olivia):
    operator_approval(acme_session, name="acme_refund")
    operator_approval(globex_session, name="globex_refund")

    page = logged_in(olivia).get(url("pendingapproval_changelist"))

    assert page.status_code == 200
    assert set(tenant_choices(page)) <= {"acme"}
    assert "globex" not in page.content.decode()


def test_a_staff_member_of_two_tenants_is_offered_those_two(acme_session, globex_session, olivia):
    from tenants.models import TenantMembership

    initech = tenancy.tenant_create(slug="initech", name="Initech")
    TenantMembership.objects.create(tenant=initech, user=olivia, role="viewer")
    operator_approval(globex_session, name="globex_refund")

    page = logged_in(olivia).get(url("pendingapproval_changelist"))

    assert tenant_choices(page) == ["acme", "initech"]
    assert "globex" not in page.content.decode()


def test_a_superuser_is_offered_every_tenant(acme_session, globex_session, root):
    operator_approval(acme_session, name="acme_refund")
    tenancy.tenant_create(slug="initech", name="Initech")  # nothing pending there

    page = logged_in(root).get(url("pendingapproval_changelist"))

    assert tenant_choices(page) == ["acme", "globex", "initech"]
    assert 'href="?tenant__id__exact=' in page.content.decode()
