"""Two shops, their sessions and tool calls, and the people who run them.

Shared by the approvals and the live-page tests; their conftests import the
fixtures from here. Personas: Olivia operates Acme (staff, owner of acme),
Mallory operates Globex (staff, owner of globex only), Root is a superuser.
"""
from __future__ import annotations

import secrets

import pytest


def make_user(username: str, *, tenant=None, staff=True, superuser=False, role="owner"):
    from django.contrib.auth import get_user_model

    from tenants.models import TenantMembership

    # No password: tests sign in with force_login, and hashing one is slow.
    user = get_user_model().objects.create_user(
        username=username, password=None, is_staff=staff, is_superuser=superuser
    )
    if tenant is not None:
        TenantMembership.objects.create(tenant=tenant, user=user, role=role)
    return user


def make_session(tenant, session_id: str | None = None, **fields):
    from aitp import tenancy
    from aitp.models import Session

    key, _raw = tenancy.key_create(tenant=tenant, name="web")
    return Session.objects.create(
        id=session_id or f"ses_{secrets.token_hex(6)}", tenant=tenant, api_key=key, **fields
    )


def make_tool_call(session, *, name: str, arguments: dict, risk: str, origin: str, **fields):
    """A ledger row with fresh ids; the conftests choose their own defaults."""
    from aitp.models import ToolCall

    token = secrets.token_hex(6)
    return ToolCall.objects.create(
        session=session, call_id=f"tc_{token}", tool_use_id=f"toolu_{token}", name=name,
        arguments=arguments, risk=risk, origin=origin, **fields,
    )


@pytest.fixture
def acme(db):
    from aitp import tenancy

    return tenancy.tenant_create(slug="acme", name="Acme Store")


@pytest.fixture
def globex(db):
    from aitp import tenancy

    return tenancy.tenant_create(slug="globex", name="Globex")


@pytest.fixture
def olivia(acme):
    return make_user("olivia", tenant=acme)


@pytest.fixture
def mallory(globex):
    return make_user("mallory", tenant=globex)


@pytest.fixture
def root(db):
    return make_user("root", superuser=True)


async def admin_sign_in(http, username: str, password: str) -> None:
    """Sign in to the admin of a real server through its login form (an
    httpx.AsyncClient keeps the session cookie)."""
    import re

    form = await http.get("/admin/login/")
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form.text).group(1)
    answer = await http.post(
        "/admin/login/?next=/admin/",
        data={"username": username, "password": password, "csrfmiddlewaretoken": token},
    )
    assert answer.status_code == 302, answer.text[:500]
