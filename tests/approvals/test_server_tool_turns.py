"""Risky server-side tools inside a real turn: the page user, an operator, or
both decide, and the tool runs only when approved.

Driven through the real consumer (WebsocketCommunicator) with the offline
backend, which calls the tool named in "/tool <name> {json}".
"""
from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.test import override_settings

from aitp.models import ToolCall
from approvals import services as approvals
from approvals.models import Approval, AuditEvent
from demo.models import DemoOrder
from demo.order_tools import demo_tools_install
from tenants.models import TenantMembership
from tests.aitp.conftest import api_key, connect, in_db, open_page, tenant  # noqa: F401 (fixtures)

pytestmark = [pytest.mark.django_db(transaction=True)]

CANCEL = '/tool cancel_order {"number": "A1003"}'


def install(tenant, policy="user"):
    demo_tools_install(tenant=tenant, policy=policy)


async def order_status(tenant) -> str:
    order = await DemoOrder.objects.aget(tenant=tenant, number="A1003")
    return order.status


async def start_cancel(connect, api_key, tenant, policy):
    await in_db(install)(tenant, policy)
    page = await open_page(connect, api_key)
    await page.send("USER_INPUT", {"modality": "text", "content": CANCEL})
    return page


async def test_server_tools_appear_first_in_tools_effective(connect, api_key, tenant):
    await in_db(install)(tenant)
    page = await connect()
    await page.handshake(api_key.raw)
    effective = await page.context(tools=[{"name": "cancel_order", "description": "page one"}])
    data = effective["payload"]["data"]
    assert [t["name"] for t in data["serverTools"]] == ["cancel_order", "order_status"]
    assert [t["name"] for t in data["ignoredClientTools"]] == ["cancel_order"]
    await page.close()


async def test_a_low_risk_server_tool_runs_without_asking(connect, api_key, tenant):
    await in_db(install)(tenant)
    page = await open_page(connect, api_key)
    await page.send("USER_INPUT", {"modality": "text", "content": '/tool order_status {"number": "A1002"}'})
    done = await page.recv_until("AGENT_RESPONSE", done=True)
    assert "A1002" in done["payload"]["chunk"] and "paid" in done["payload"]["chunk"]
    call = await ToolCall.objects.aget(name="order_status")
    assert call.status == "success" and call.origin == "server"
    await page.close()


async def test_the_user_approves_a_risky_server_tool_and_it_runs(connect, api_key, tenant):
    page = await start_cancel(connect, api_key, tenant, "user")
    notice = await page.recv_until("SYSTEM_EVENT", kind="approval_required")
    request = await page.recv_until("APPROVAL_REQUEST")
    assert request["payload"]["toolName"] == "cancel_order"
    assert request["payload"]["args"] == {"number": "A1003"}
    assert request["payload"]["risk"] == "high"
    assert notice["payload"]["message"]
    assert await order_status(tenant) == "pending"  # nothing ran yet
    await page.send("APPROVAL_RESPONSE", {"callId": request["payload"]["callId"], "approved": True})
    await page.recv_until("AGENT_RESPONSE", done=True)
    assert await order_status(tenant) == "cancelled"
    approval = await Approval.objects.aget(tool_call__call_id=request["payload"]["callId"])
    assert approval.status == "approved" and approval.user_decision == "approved"
    actions = [a async for a in AuditEvent.objects.filter(approval=approval).values_list("action", flat=True)]
    assert actions == ["requested", "approved", "executed"]
    await page.close()


async def test_a_declined_server_tool_never_runs_and_the_model_is_told(connect, api_key, tenant):
    page = await start_cancel(connect, api_key, tenant, "user")
    request = await page.recv_until("APPROVAL_REQUEST")
    call_id = request["payload"]["callId"]
    await page.send("APPROVAL_RESPONSE", {"callId": call_id, "approved": False, "error": "Action denied by user"})
    # A second click sends a second response: the first wins, the rest are refused.
    await page.send("APPROVAL_RESPONSE", {"callId": call_id, "approved": True})
    done = await page.recv_until("AGENT_RESPONSE", done=True)
    assert "declined" in done["payload"]["chunk"]
    assert await order_status(tenant) == "pending"
    call = await ToolCall.objects.aget(call_id=call_id)
    assert call.status == "denied"
    await page.close()


@override_settings(OWLLAYER_APPROVAL_TIMEOUT=0.3)
async def test_an_unanswered_server_tool_approval_expires_and_never_runs(connect, api_key, tenant):
    page = await start_cancel(connect, api_key, tenant, "user")
    request = await page.recv_until("APPROVAL_REQUEST")
    error = await page.recv_until("SYSTEM_EVENT", kind="error")
    assert error["payload"]["data"]["code"] == "approval_expired"
    await page.recv_until("AGENT_RESPONSE", done=True)
    # Too late: the answer finds no pending call.
    await page.send("APPROVAL_RESPONSE", {"callId": request["payload"]["callId"], "approved": True})
    late = await page.recv_until("SYSTEM_EVENT", kind="error")
    assert late["payload"]["data"]["code"] == "unknown_call"
    assert await order_status(tenant) == "pending"
    assert (await ToolCall.objects.aget(call_id=request["payload"]["callId"])).status == "expired"
    await page.close()


def operator_of(tenant, name="op"):
    user = get_user_model().objects.create_user(name, password="x", is_staff=True)
    TenantMembership.objects.create(tenant=tenant, user=user, role="owner")
    return user


async def test_an_operator_approval_reaches_the_waiting_turn(connect, api_key, tenant):
    operator = await in_db(operator_of)(tenant)
    page = await start_cancel(connect, api_key, tenant, "operator")
    waiting = await page.recv_until("SYSTEM_EVENT", kind="waiting")
    assert "operator" in waiting["payload"]["message"]
    approval = await Approval.objects.aget(tool_name="cancel_order")
    assert approval.needs_operator and not approval.needs_user
    await in_db(approvals.approval_decide_operator)(approval_id=approval.id, user=operator, approved=True)
    await page.recv_until("AGENT_RESPONSE", done=True)
    assert await order_status(tenant) == "cancelled"
    await page.close()


async def test_four_eyes_need_both_the_user_and_an_operator(connect, api_key, tenant):
    operator = await in_db(operator_of)(tenant)
    page = await start_cancel(connect, api_key, tenant, "user_and_operator")
    request = await page.recv_until("APPROVAL_REQUEST")
    await page.recv_until("SYSTEM_EVENT", kind="waiting")
    await page.send("APPROVAL_RESPONSE", {"callId": request["payload"]["callId"], "approved": True})
    approval = await Approval.objects.aget(tool_name="cancel_order")
    await approval.arefresh_from_db()
    assert approval.status == "pending"
    assert await order_status(tenant) == "pending"  # the user alone is not enough
    await in_db(approvals.approval_decide_operator)(approval_id=approval.id, user=operator, approved=True)
    await page.recv_until("AGENT_RESPONSE", done=True)
    assert await order_status(tenant) == "cancelled"
    await page.close()


async def test_an_operator_denial_stops_a_four_eyes_action(connect, api_key, tenant):
    operator = await in_db(operator_of)(tenant)
    page = await start_cancel(connect, api_key, tenant, "user_and_operator")
    await page.recv_until("APPROVAL_REQUEST")
    approval = await Approval.objects.aget(tool_name="cancel_order")
    await in_db(approvals.approval_decide_operator)(
        approval_id=approval.id, user=operator, approved=False, note="looks wrong")
    done = await page.recv_until("AGENT_RESPONSE", done=True)
    assert "declined" in done["payload"]["chunk"]
    assert await order_status(tenant) == "pending"
    await page.close()


async def test_a_disconnect_while_waiting_closes_the_approval(connect, api_key, tenant):
    page = await start_cancel(connect, api_key, tenant, "user")
    request = await page.recv_until("APPROVAL_REQUEST")
    await page.close()
    approval = await Approval.objects.aget(tool_call__call_id=request["payload"]["callId"])
    assert approval.status == "disconnected"
    call = await ToolCall.objects.aget(call_id=request["payload"]["callId"])
    assert call.status == "disconnected"
    assert await order_status(tenant) == "pending"


async def test_a_lost_operator_notification_only_delays_the_turn(connect, api_key, tenant, monkeypatch):
    import agent.server_tools
    import aitp.notify

    monkeypatch.setattr(agent.server_tools, "DECISION_RECHECK_SECONDS", 0.1)
    operator = await in_db(operator_of)(tenant)
    page = await start_cancel(connect, api_key, tenant, "operator")
    await page.recv_until("SYSTEM_EVENT", kind="waiting")
    approval = await Approval.objects.aget(tool_name="cancel_order")
    # The decision is written, but its notification never arrives.
    monkeypatch.setattr(aitp.notify, "session_command", lambda *args, **kwargs: None)
    await in_db(approvals.approval_decide_operator)(approval_id=approval.id, user=operator, approved=True)
    await page.recv_until("AGENT_RESPONSE", done=True)
    assert await order_status(tenant) == "cancelled"
    await page.close()


@pytest.mark.parametrize("frame", ["APPROVAL_REQUEST", "TOOL_RESULT"])
async def test_a_page_cannot_ask_about_or_answer_a_server_tools_call(connect, api_key, tenant, frame):
    page = await start_cancel(connect, api_key, tenant, "user")
    request = await page.recv_until("APPROVAL_REQUEST")
    call_id = request["payload"]["callId"]

    await page.send(frame, {
        "APPROVAL_REQUEST": {"callId": call_id, "toolName": "cancel_order", "risk": "high",
                             "args": {"number": "A1003"}, "message": "Cancel A1003?"},
        "TOOL_RESULT": {"callId": call_id, "status": "success", "result": {"cancelled": True}},
    }[frame])
    refused = await page.recv_until("SYSTEM_EVENT", kind="error")

    assert refused["payload"]["data"] == {"code": "unknown_call", "callId": call_id}
    assert await Approval.objects.filter(tool_call__call_id=call_id).acount() == 1
    await page.send("APPROVAL_RESPONSE", {"callId": call_id, "approved": False})
    await page.recv_until("AGENT_RESPONSE", done=True)
    assert await order_status(tenant) == "pending"
    await page.close()
