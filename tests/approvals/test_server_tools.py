"""Server tools: loading a tenant's tools, running Python and webhook tools, validation."""
from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError

from aitp.tools import Risk
from approvals.models import ServerTool
from approvals.server_tools import (
    ToolRunError,
    load_server_tools,
    python_tool_def,
    register_python_tool,
)
from demo.order_tools import demo_tools_install
from tests.approvals.webhook_receiver import SECRET, Receiver

ORDER_PARAMS = {"type": "OBJECT", "properties": {"number": {"type": "STRING"}}, "required": ["number"]}


def webhook_tool(tenant, name="refund", url="http://127.0.0.1:9/refund", **fields) -> ServerTool:
    fields = {"parameters": ORDER_PARAMS, **fields}
    return ServerTool.objects.create(
        tenant=tenant, name=name, description="Refund an order", kind=ServerTool.Kind.WEBHOOK,
        webhook_url=url, **fields,
    )


# --- loading ---------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
async def test_loads_only_the_enabled_tools_of_the_tenant(acme, globex):
    from asgiref.sync import sync_to_async

    @sync_to_async
    def arrange():
        demo_tools_install(tenant=acme)
        webhook_tool(acme, name="refund", risk="critical", approval_policy="operator")
        webhook_tool(acme, name="old_refund", enabled=False)
        webhook_tool(globex, name="globex_only")
        ServerTool.objects.create(tenant=acme, name="ghost", description="gone",
                                  kind=ServerTool.Kind.PYTHON, python_handler="no_such_handler")
        webhook_tool(acme, name="broken", parameters={"type": "WHATEVER"})

    await arrange()

    tools = {t.name: t for t in await load_server_tools(acme.pk)}

    assert sorted(tools) == ["cancel_order", "order_status", "refund"]
    refund = tools["refund"]
    assert (refund.spec.origin, refund.spec.risk, refund.policy) == ("server", Risk.CRITICAL, "operator")
    assert tools["cancel_order"].spec.risk == Risk.HIGH
    assert tools["order_status"].spec.parameters["required"] == ["number"]


@pytest.mark.django_db(transaction=True)
async def test_a_python_row_can_raise_the_risk_of_a_code_tool_but_not_lower_it(acme):
    await ServerTool.objects.acreate(tenant=acme, name="order_status", kind="python",
                                     python_handler="order_status", risk="critical")
    await ServerTool.objects.acreate(tenant=acme, name="cancel", kind="python",
                                     python_handler="cancel_order", risk="none")

    tools = {t.name: t for t in await load_server_tools(acme.pk)}

    assert tools["order_status"].spec.risk == Risk.CRITICAL
    assert tools["cancel"].spec.risk == Risk.HIGH
    assert tools["cancel"].spec.description  # the handler's own description


# --- running --------------------------------------------------------------------------


async def test_a_failing_handler_gives_the_model_a_plain_error(monkeypatch):
    from approvals import tool_specs

    monkeypatch.setattr(tool_specs, "_registry", dict(tool_specs._registry))

    @register_python_tool("explodes_for_test", description="Always fails", parameters=None)
    async def explodes(args, *, session_id, tenant_id):
        raise KeyError("internal detail")

    with pytest.raises(ToolRunError) as caught:
        await python_tool_def("explodes_for_test").run({}, session_id="ses_x", tenant_id=1)

    assert caught.value.message == "tool failed"


def test_a_tool_name_cannot_be_registered_twice():
    with pytest.raises(ValueError):
        @register_python_tool("order_status", description="Another", parameters=None)
        def impostor(args, *, session_id, tenant_id):
            return None


@pytest.mark.django_db(transaction=True)
async def test_a_webhook_tool_row_posts_to_its_url_with_its_own_secret(acme, receiver):
    await ServerTool.objects.acreate(
        tenant=acme, name="refund", description="Refund an order", kind="webhook",
        webhook_url=receiver + "/echo", webhook_secret=SECRET, parameters=ORDER_PARAMS,
        webhook_networks="127.0.0.1/32",
    )
    (tool,) = await load_server_tools(acme.pk)

    answer = await tool.run({"number": "A1"}, session_id="ses_acme", tenant_id=acme.pk,
                            call_id="tc_9")

    assert answer["got"]["callId"] == "tc_9"
    assert Receiver.received[0]["signed"] is True


# --- validation and the demo --------------------------------------------------------


@pytest.mark.parametrize(
    "fields, bad_field",
    [
        ({"name": "has space"}, "name"),
        ({"parameters": {"type": "OBJECT", "properties": {"n": {"type": "DATE"}}}}, "parameters"),
        ({"webhook_url": ""}, "webhook_url"),
        ({"webhook_url": "ftp://files.example/x"}, "webhook_url"),
        ({"kind": "python", "python_handler": "no_such_handler"}, "python_handler"),
        ({"description": ""}, "description"),
    ],
)
def test_an_invalid_server_tool_is_refused(acme, fields, bad_field):
    tool = ServerTool(tenant=acme, **{
        "name": "refund", "description": "Refund an order", "kind": "webhook",
        "webhook_url": "https://hooks.example/refund", "parameters": ORDER_PARAMS, **fields,
    })

    with pytest.raises(ValidationError) as caught:
        tool.full_clean()

    assert bad_field in caught.value.message_dict


def test_a_valid_server_tool_passes_and_gets_its_own_secret(acme):
    first = ServerTool(tenant=acme, name="refund", description="Refund an order", kind="webhook",
                       webhook_url="https://hooks.example/refund", parameters=ORDER_PARAMS)
    second = ServerTool(tenant=acme, name="refund2", description="Refund", kind="python",
                        python_handler="cancel_order")

    first.full_clean()
    second.full_clean()

    assert first.webhook_secret.startswith("whsec_") and first.webhook_secret != second.webhook_secret
