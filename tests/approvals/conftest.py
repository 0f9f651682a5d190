"""Fixtures for approvals: two shops, their sessions, tool calls, and the people involved.

Personas: Olivia operates Acme (staff, member of acme), Mallory operates
Globex (staff, member of globex only), Root is a superuser.
"""
from __future__ import annotations

import itertools

import pytest

_ids = itertools.count(1)


@pytest.fixture
def acme(db):
    from aitp import services

    return services.tenant_create(slug="acme", name="Acme Store")


@pytest.fixture
def globex(db):
    from aitp import services

    return services.tenant_create(slug="globex", name="Globex")


def make_session(tenant, session_id: str | None = None):
    from aitp import services
    from aitp.models import Session

    key, _raw = services.api_key_create(tenant=tenant, name="web")
    return Session.objects.create(id=session_id or f"ses_{next(_ids):06d}", tenant=tenant, api_key=key)


def make_call(session, name="process_payment", args=None, risk="critical", origin="client"):
    from aitp.models import ToolCall

    n = next(_ids)
    return ToolCall.objects.create(
        session=session, call_id=f"tc_{n:08x}", tool_use_id=f"toolu_{n}", name=name,
        arguments={"amount": 299.98} if args is None else args, risk=risk, origin=origin,
        status=ToolCall.Status.SENT,
    )


@pytest.fixture
def acme_session(acme):
    return make_session(acme, "ses_acme")


@pytest.fixture
def globex_session(globex):
    return make_session(globex, "ses_globex")


@pytest.fixture
def payment_call(acme_session):
    return make_call(acme_session)


def make_user(username: str, *, tenant=None, staff=True, superuser=False, role="owner"):
    from django.contrib.auth import get_user_model

    from aitp.models import TenantMembership

    user = get_user_model().objects.create_user(
        username=username, password="pw-" + username, is_staff=staff, is_superuser=superuser
    )
    if tenant is not None:
        TenantMembership.objects.create(tenant=tenant, user=user, role=role)
    return user


@pytest.fixture
def olivia(acme):
    return make_user("olivia", tenant=acme)


@pytest.fixture
def mallory(globex):
    return make_user("mallory", tenant=globex)


@pytest.fixture
def root(db):
    return make_user("root", superuser=True)
