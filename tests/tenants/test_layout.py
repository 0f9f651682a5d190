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
