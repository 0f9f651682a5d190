"""Fixtures for approvals: two shops, their sessions, tool calls, and the people involved.

Personas: Olivia operates Acme (staff, member of acme), Mallory operates
Globex (staff, member of globex only), Root is a superuser.
"""
from __future__ import annotations

import secrets

import pytest

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
    return Session.objects.create(id=session_id or f"ses_{secrets.token_hex(6)}", tenant=tenant,
                                  api_key=key)


def make_call(session, name="process_payment", args=None, risk="critical", origin="client"):
    from aitp.models import ToolCall

    token = secrets.token_hex(6)
    return ToolCall.objects.create(
        session=session, call_id=f"tc_{token}", tool_use_id=f"toolu_{token}", name=name,
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

    # No password: tests sign in with force_login, and hashing one is slow.
    user = get_user_model().objects.create_user(
        username=username, password=None, is_staff=staff, is_superuser=superuser
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


@pytest.fixture
def receiver():
    """Base URL of a webhook endpoint checking signatures under webhook_receiver.SECRET."""
    from tests.approvals.webhook_receiver import start_receiver, stop_receiver

    server, thread = start_receiver()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        stop_receiver(server, thread)
