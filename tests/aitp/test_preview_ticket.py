"""The console's preview tickets (aitp.preview): what a ticket is good for,
and a socket offering one on the real application."""
from __future__ import annotations

import time
from urllib.parse import urlencode

import pytest
from django.core import signing

from aitp import preview, tenancy
from aitp.models import ApiKey, Session
from tests.aitp.conftest import in_db
from tests.support.pages import patient

CONSOLE = "https://owllayer.example"


def ticket(key_id: int = 7, origin: str = CONSOLE, user_id: int = 3) -> str:
    return preview.issue(key_id=key_id, origin=origin, user_id=user_id)


def test_a_ticket_names_its_key_origin_and_member_for_a_page_of_that_origin():
    assert preview.read(ticket(), origin=CONSOLE) == preview.Ticket(key_id=7, origin=CONSOLE, user_id=3)


def test_a_ticket_offered_from_another_origin_is_not_good():
    assert preview.read(ticket(), origin="https://shop.example") is None


def test_a_ticket_older_than_its_lifetime_is_not_good(monkeypatch):
    made = ticket()
    later = time.time() + preview.TICKET_LIFETIME + 1
    monkeypatch.setattr(signing.time, "time", lambda: later)
    assert preview.read(made, origin=CONSOLE) is None


def test_a_ticket_with_a_changed_signature_or_body_is_not_good():
    made = ticket()
    body, _, signature = made.rpartition(":")
    assert preview.read(body + ":" + signature[::-1], origin=CONSOLE) is None
    assert preview.read(ticket(key_id=8).rpartition(":")[0] + ":" + signature, origin=CONSOLE) is None


def test_a_value_signed_for_something_else_is_not_a_ticket():
    other = signing.dumps({"k": 7, "o": CONSOLE, "u": 3})  # the default salt
    assert preview.read(other, origin=CONSOLE) is None


@pytest.mark.parametrize("data", [
    [7, CONSOLE, 3], {"k": "7", "o": CONSOLE, "u": 3}, {"k": 7, "o": CONSOLE}, {"o": CONSOLE, "u": 3},
], ids=["a list", "a key id as text", "no member", "no key"])
def test_a_signed_ticket_of_another_shape_is_not_good(data):
    assert preview.read(signing.dumps(data, salt=preview.SALT), origin=CONSOLE) is None


def test_an_empty_or_oversized_ticket_is_not_good():
    assert preview.read("", origin=CONSOLE) is None
    assert preview.read("a" * (preview.LONGEST_TICKET + 1), origin=CONSOLE) is None


# --- a socket offering a ticket ---------------------------------------------------


@pytest.fixture
def connect(connect):
    return patient(connect)


@pytest.fixture
def member(tenant):
    """A viewer of the key's tenant: any member sees the console's preview."""
    from django.contrib.auth import get_user_model

    from tenants.models import TenantMembership

    user = get_user_model().objects.create_user("vera", password="pw-vera-123")
    TenantMembership.objects.create(tenant=tenant, user=user, role=TenantMembership.Role.VIEWER)
    return user


def preview_query(key: ApiKey, ticket_text: str) -> str:
    return urlencode({"apiKey": key.raw, "previewTicket": ticket_text})


@pytest.mark.django_db(transaction=True)
async def test_a_socket_from_the_console_with_a_good_ticket_opens_a_session_of_the_key(connect, api_key, member):
    page = await connect(query=preview_query(api_key, ticket(api_key.pk, user_id=member.pk)), origin=CONSOLE)

    ack = await page.handshake(api_key.raw)

    assert ack["type"] == "HANDSHAKE_ACK", ack
    row = await Session.objects.aget(pk=ack["payload"]["sessionId"])
    assert (row.api_key_id, row.origin) == (api_key.pk, CONSOLE)
    await page.close()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("offered", [
    lambda key: ticket(key.pk, origin="https://elsewhere.example"),
    lambda key: ticket(key.pk)[:-2] + "zz",
    lambda key: "not-a-ticket",
], ids=["made for another origin", "forged", "not a ticket"])
async def test_a_socket_offering_a_ticket_that_is_not_good_is_refused_with_preview_ticket_invalid(
        connect, api_key, offered):
    page = await connect(query=preview_query(api_key, offered(api_key)), origin=CONSOLE)

    error = await page.handshake(api_key.raw)

    assert error["payload"]["data"]["code"] == "preview_ticket_invalid"
    assert (await page.recv())["code"] == 1008
    assert not await Session.objects.aexists()


@pytest.mark.django_db(transaction=True)
async def test_a_socket_offering_a_ticket_that_is_not_good_is_refused_even_from_an_allowed_origin(
        connect, api_key):
    page = await connect(query=preview_query(api_key, "not-a-ticket"))  # the shop's own origin

    error = await page.handshake(api_key.raw)

    assert error["payload"]["data"]["code"] == "preview_ticket_invalid"


@pytest.mark.django_db(transaction=True)
async def test_a_good_ticket_of_another_key_does_not_open_this_one_from_the_console(
        connect, api_key, tenant, member):
    other, _ = await in_db(tenancy.key_create)(tenant=tenant, allowed_origins=["https://shop.example"])
    page = await connect(query=preview_query(api_key, ticket(other.pk, user_id=member.pk)), origin=CONSOLE)

    error = await page.handshake(api_key.raw)

    assert error["payload"]["data"]["code"] == "origin_not_allowed"


@pytest.mark.django_db(transaction=True)
async def test_a_good_ticket_of_a_disabled_key_is_refused_as_the_key_is(connect, api_key, member):
    await ApiKey.objects.filter(pk=api_key.pk).aupdate(status=ApiKey.Status.DISABLED)
    page = await connect(query=preview_query(api_key, ticket(api_key.pk, user_id=member.pk)), origin=CONSOLE)

    error = await page.handshake(api_key.raw)

    assert error["payload"]["data"]["code"] == "api_key_disabled"


def _removed(member, tenant) -> None:
    member.tenant_memberships.filter(tenant=tenant).delete()


def _deactivated(member, tenant) -> None:
    member.is_active = False
    member.save(update_fields=["is_active"])


def _moved_to_another_tenant(member, tenant) -> None:
    from aitp import tenancy as tenants

    other = tenants.tenant_create(slug="other", name="Other Store")
    member.tenant_memberships.filter(tenant=tenant).update(tenant=other)


def _deleted(member, tenant) -> None:
    member.delete()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("since", [_removed, _deactivated, _moved_to_another_tenant, _deleted],
                         ids=["removed from the tenant", "deactivated", "a member of another tenant only",
                              "deleted"])
async def test_a_ticket_whose_member_may_no_longer_see_the_key_is_refused_with_preview_ticket_invalid(
        connect, api_key, tenant, member, since):
    made = ticket(api_key.pk, user_id=member.pk)
    await in_db(since)(member, tenant)
    page = await connect(query=preview_query(api_key, made), origin=CONSOLE)

    error = await page.handshake(api_key.raw)

    assert error["payload"]["data"]["code"] == "preview_ticket_invalid"
    assert "no longer yours" in error["payload"]["message"]
    assert (await page.recv())["code"] == 1008
    assert not await Session.objects.aexists()
