"""The demo shop's orders: its server tools (order_status, cancel_order) on
the orders of the calling tenant, and an order paid in the store being one of
them, for the tools and for the admin's demo orders."""
from __future__ import annotations

import json

import pytest
from asgiref.sync import sync_to_async

from aitp import tenancy
from approvals.models import ServerTool
from approvals.server_tools import ToolRunError, python_tool_def
from demo.models import DemoOrder
from demo.order_tools import demo_tools_install
from tests.support.people import acme, globex, olivia  # noqa: F401 (fixtures)

# --- the tools ------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
async def test_order_status_looks_up_an_order_of_the_calling_tenant_only(acme, globex):
    await DemoOrder.objects.acreate(tenant=acme, number="A1001", status="shipped", total="149.99",
                                    items=[{"sku": "pro-headphones", "qty": 1}])
    tool = python_tool_def("order_status")

    found = await tool.run({"number": "A1001"}, session_id="ses_acme", tenant_id=acme.pk)
    with pytest.raises(ToolRunError) as caught:
        await tool.run({"number": "A1001"}, session_id="ses_globex", tenant_id=globex.pk)

    assert found == {"number": "A1001", "status": "shipped", "total": "149.99",
                     "items": [{"sku": "pro-headphones", "qty": 1}]}
    assert caught.value.message == "no order with that number"


@pytest.mark.django_db(transaction=True)
async def test_cancel_order_cancels_an_unshipped_order_and_refuses_a_shipped_one(acme):
    await DemoOrder.objects.acreate(tenant=acme, number="A1", status="paid")
    await DemoOrder.objects.acreate(tenant=acme, number="A2", status="shipped")
    tool = python_tool_def("cancel_order")

    result = await tool.run({"number": "A1"}, session_id="ses_acme", tenant_id=acme.pk)
    with pytest.raises(ToolRunError) as caught:
        await tool.run({"number": "A2"}, session_id="ses_acme", tenant_id=acme.pk)

    assert result["status"] == "cancelled"
    assert (await DemoOrder.objects.aget(number="A1")).status == "cancelled"
    assert caught.value.message == "order is already shipped"
    assert (await DemoOrder.objects.aget(number="A2")).status == "shipped"


def test_installing_the_demo_twice_keeps_one_set(acme):
    demo_tools_install(tenant=acme)
    DemoOrder.objects.filter(number="A1003").update(status="cancelled")
    demo_tools_install(tenant=acme)

    assert ServerTool.objects.filter(tenant=acme).count() == 2
    assert DemoOrder.objects.filter(tenant=acme).count() == 3
    assert DemoOrder.objects.get(number="A1003").status == "cancelled"


# --- an order paid in the store -----------------------------------------------------------


def pay_in_the_store(client, raw_key: str) -> dict:
    client.get("/demo/", {"apiKey": raw_key})
    for action, body in [("add", {"productId": "pro-headphones", "quantity": 2}),
                         ("pay", {"amount": 299.98})]:
        response = client.post(f"/demo/api/cart/{action}", json.dumps(body),
                               content_type="application/json")
        assert response.status_code == 200, response.content
    return response.json()


@pytest.fixture
def acme_key(acme) -> str:
    _, raw_key = tenancy.key_create(tenant=acme, name="store",
                                    allowed_origins=["http://testserver"])
    return raw_key


@pytest.mark.django_db(transaction=True)
async def test_a_paid_order_is_known_to_order_status(client, acme, acme_key):
    paid = await sync_to_async(pay_in_the_store)(client, acme_key)

    found = await python_tool_def("order_status").run(
        {"number": paid["orderId"]}, session_id="ses_acme", tenant_id=acme.pk)

    assert found == {"number": paid["orderId"], "status": "paid", "total": "299.98",
                     "items": [{"sku": "pro-headphones", "name": "Pro Headphones", "qty": 2}]}


def test_a_paid_order_is_listed_in_the_admins_demo_orders(client, acme, acme_key, olivia):
    paid = pay_in_the_store(client, acme_key)

    client.force_login(olivia)
    listing = client.get("/admin/demo/demoorder/")

    assert listing.status_code == 200
    assert paid["orderId"].encode() in listing.content
    assert b"Paid" in listing.content


def test_a_page_without_a_usable_key_still_pays_but_records_no_order(client, acme):
    _, raw_key = tenancy.key_create(tenant=acme, name="elsewhere",
                                    allowed_origins=["https://shop.example"])

    paid = pay_in_the_store(client, raw_key)

    assert paid["paid"] is True and paid["orderId"].startswith("A")
    assert not DemoOrder.objects.exists()

