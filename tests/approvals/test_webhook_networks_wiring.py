"""A tool's webhook networks on the product's own paths: the agent's server
tools, the admin form and the server tool services."""
from __future__ import annotations

import ipaddress

import pytest
from django.core.exceptions import PermissionDenied
from django.test import Client
from django.urls import reverse

from aitp.models import OperatorAction
from approvals import services
from approvals.models import ServerTool
from approvals.server_tools import load_server_tools
from approvals.webhooks import NOT_ALLOWED, ToolRunError
from tests.approvals.webhook_receiver import SECRET, Receiver

LOOPBACK_ONLY = (ipaddress.ip_network("127.0.0.1/32"),)


@pytest.mark.django_db(transaction=True)
async def test_the_agents_server_tools_reach_only_what_each_tool_opens(settings, acme, receiver):
    settings.OWLLAYER_WEBHOOK_ALLOWED_NETWORKS = LOOPBACK_ONLY
    port = receiver.rsplit(":", 1)[1]
    await ServerTool.objects.acreate(
        tenant=acme, name="refund", description="Refund an order", kind="webhook",
        webhook_url=receiver + "/echo", webhook_secret=SECRET, webhook_networks=f"127.0.0.1/32:{port}")
    await ServerTool.objects.acreate(
        tenant=acme, name="order_status", description="Where an order is", kind="webhook",
        webhook_url=receiver + "/echo", webhook_secret=SECRET)
    tools = {tool.name: tool for tool in await load_server_tools(acme.pk)}

    answer = await tools["refund"].run({}, session_id="ses_acme", tenant_id=acme.pk, call_id="tc_1")
    with pytest.raises(ToolRunError) as caught:
        await tools["order_status"].run({}, session_id="ses_acme", tenant_id=acme.pk,
                                        call_id="tc_2")

    assert answer["ok"] is True
    assert caught.value.message == NOT_ALLOWED
    assert [r["body"]["callId"] for r in Receiver.received] == ["tc_1"]


def _form(tenant, **fields) -> dict:
    return {
        "tenant": str(tenant.pk), "name": "refund", "description": "Refund an order",
        "kind": "webhook", "webhook_url": "http://10.20.0.7:8443/refund", "timeout_seconds": "5",
        "python_handler": "", "parameters": "", "risk": "high", "approval_policy": "operator",
        "enabled": "on", **fields,
    }


@pytest.mark.django_db
def test_a_superuser_sets_a_tools_networks_in_the_admin_and_the_change_is_recorded(
    settings, acme, root
):
    settings.OWLLAYER_WEBHOOK_ALLOWED_NETWORKS = (ipaddress.ip_network("10.20.0.0/16"),)
    client = Client()
    client.force_login(root)

    client.post(reverse("admin:approvals_servertool_add"),
                _form(acme, webhook_networks="10.20.0.0/24:8443"))

    tool = ServerTool.objects.get(tenant=acme, name="refund")
    assert tool.webhook_networks == "10.20.0.0/24:8443"
    created = OperatorAction.objects.get(action="server_tool_created")
    assert created.data["webhook_networks"] == "10.20.0.0/24:8443"


@pytest.mark.django_db
def test_the_services_refuse_a_tools_networks_from_a_tenant_owner(settings, acme, olivia):
    settings.OWLLAYER_WEBHOOK_ALLOWED_NETWORKS = (ipaddress.ip_network("10.20.0.0/16"),)
    fields = {"name": "refund", "description": "Refund an order", "kind": "webhook",
              "webhook_url": "http://10.20.0.7/refund"}

    with pytest.raises(PermissionDenied):
        services.server_tool_create(tenant=acme, by=olivia,
                                    fields={**fields, "webhook_networks": "10.20.0.0/16"})
    tool = services.server_tool_create(tenant=acme, by=olivia, fields=fields)
    with pytest.raises(PermissionDenied):
        services.server_tool_update(tool=tool, by=olivia,
                                    changes={"webhook_networks": "10.20.0.0/16"})

    tool.refresh_from_db()
    assert tool.webhook_networks == ""
