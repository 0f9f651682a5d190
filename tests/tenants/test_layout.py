"""tenants: the ground floor. Its models keep the tables the protocol app
created, and it imports no other app of the product."""
from __future__ import annotations

import ast
import io
from pathlib import Path

import pytest
from django.core.management import call_command

import tenants

PRODUCT_APPS = {"aitp", "approvals", "console", "demo", "operators", "owllayer_site", "aitp_client"}


def _imported_top_level_packages(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_the_tenants_app_imports_no_other_app_of_the_product():
    package = Path(tenants.__file__).parent
    modules = [p for p in package.rglob("*.py") if "migrations" not in p.parts]
    assert modules
    reached = {str(p.relative_to(package)): _imported_top_level_packages(p) & PRODUCT_APPS for p in modules}
    assert {path: apps for path, apps in reached.items() if apps} == {}


def test_tenants_and_members_keep_the_tables_the_protocol_app_created():
    from tenants.models import Tenant, TenantMembership

    assert (Tenant._meta.db_table, TenantMembership._meta.db_table) == (
        "aitp_tenant", "aitp_tenantmembership",
    )


@pytest.mark.django_db
def test_the_models_and_their_migrations_agree():
    out = io.StringIO()
    # Exits (SystemExit) when a model change has no migration.
    call_command("makemigrations", "--check", "--dry-run", stdout=out, stderr=out)
    assert "No changes detected" in out.getvalue()


@pytest.mark.django_db
def test_permissions_on_tenants_belong_to_the_tenants_app():
    from django.contrib.auth.models import Permission

    labels = set(
        Permission.objects.filter(codename__in=["change_tenant", "change_tenantmembership"])
        .values_list("content_type__app_label", flat=True)
    )
    assert labels == {"tenants"}


@pytest.mark.django_db(transaction=True)
def test_a_database_from_before_the_move_keeps_its_tenants_members_and_permissions(django_user_model):
    from django.contrib.auth.models import Permission
    from django.db import connection
    from django.db.migrations.executor import MigrationExecutor

    from tenants.models import TenantMembership

    # Back to the last state with Tenant in the protocol app (state only:
    # the tables stay), and a staff account given rights on tenants there.
    executor = MigrationExecutor(connection)
    executor.migrate([("tenants", None)])
    old = executor.loader.project_state([("aitp", "0003_tenant_token_quota")]).apps
    tenant = old.get_model("aitp", "Tenant").objects.create(slug="acme", name="Acme")
    user = django_user_model.objects.create_user(username="olivia", is_staff=True)
    old.get_model("aitp", "TenantMembership").objects.create(tenant_id=tenant.pk, user_id=user.pk, role="owner")
    change_tenant = Permission.objects.get(codename="change_tenant")
    assert change_tenant.content_type.app_label == "aitp"
    user.user_permissions.add(change_tenant)

    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())

    membership = TenantMembership.objects.select_related("tenant").get(user=user)
    assert (membership.tenant.slug, membership.role) == ("acme", "owner")
    user = django_user_model.objects.get(pk=user.pk)  # a fresh permission cache
    assert user.has_perm("tenants.change_tenant")
