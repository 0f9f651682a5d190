"""Personas for the console: an owner and a viewer of Acme, and Bea, who owns Beta.

Each ``*_client`` is a Django test client already signed in as that person.
"""
from __future__ import annotations

import pytest
from django.test import Client

from aitp import tenancy
from aitp.models import Session
from tenants.models import TenantMembership

OWNER = TenantMembership.Role.OWNER
VIEWER = TenantMembership.Role.VIEWER


@pytest.fixture
def acme(db):
    return tenancy.tenant_create(slug="acme", name="Acme Store")


@pytest.fixture
def beta(db):
    return tenancy.tenant_create(slug="beta", name="Beta Shop")


def member(django_user_model, tenant, username: str, role: str, **fields):
    user = django_user_model.objects.filter(username=username).first()
    if user is None:
        user = django_user_model.objects.create_user(username=username, password="pw-" + username, **fields)
    TenantMembership.objects.create(tenant=tenant, user=user, role=role)
    return user


@pytest.fixture
def olivia(django_user_model, acme):
    """Owner of Acme."""
    return member(django_user_model, acme, "olivia", OWNER, email="olivia@acme.example")


@pytest.fixture
def victor(django_user_model, acme):
    """Viewer of Acme."""
    return member(django_user_model, acme, "victor", VIEWER, email="victor@acme.example")


@pytest.fixture
def bea(django_user_model, beta):
    """Owner of Beta, no access to Acme."""
    return member(django_user_model, beta, "bea", OWNER)


def signed_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def owner_client(olivia):
    return signed_in(olivia)


@pytest.fixture
def viewer_client(victor):
    return signed_in(victor)


@pytest.fixture
def bea_client(bea):
    return signed_in(bea)


@pytest.fixture
def acme_key(acme):
    key, raw = tenancy.key_create(
        tenant=acme, name="shop", allowed_origins=["https://shop.example"], max_sessions=5
    )
    key.raw = raw
    return key


@pytest.fixture
def beta_key(beta):
    key, _ = tenancy.key_create(tenant=beta, name="beta web", allowed_origins=["https://beta.example"])
    return key


_session_counter = iter(range(1, 1_000_000))


def make_session(key, **fields) -> Session:
    return Session.objects.create(
        id=f"ses_test{next(_session_counter):06d}", tenant_id=key.tenant_id, api_key=key, **fields
    )


@pytest.fixture
def beta_session(beta_key):
    return make_session(beta_key, origin="https://beta.example")
