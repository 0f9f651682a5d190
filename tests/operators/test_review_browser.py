"""The admin's approval screens in Chromium against a real daphne process:
the review queue moves on after each verdict, the approval page shows the
user's words with the page as a detail, and a built-in server tool's page has
none of a webhook's fields. Screenshots go to test-artifacts/screenshots/."""
from __future__ import annotations

import json

import pytest
from django.urls import reverse

from aitp.models import ConversationMessage
from approvals import services as approval_services
from approvals.models import ServerTool
from demo.order_tools import demo_tools_install
from tests.operators.conftest import make_call, make_session, make_user
from tests.operators.test_live_pages_browser import operator_tab, screenshot

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def expired_approval(session, tool):
    call = make_call(session, name=tool.name, args={"order": "A1"}, risk="high")
    approval = approval_services.approval_request_server(
        tool_call=call, tool=tool, args={"order": "A1"}, session_id=session.id, timeout=120.0)
    approval_services.approval_expire(approval_id=approval.pk)
    return approval


@pytest.fixture
def admin(daphne_factory):
    from aitp import tenancy

    server = daphne_factory()
    tenant = tenancy.tenant_create(slug="acme", name="Acme Store")
    olivia = make_user("olivia", tenant=tenant)
    session = make_session(tenant, "ses_review", current_url="/orders", title="Your orders")
    ConversationMessage.objects.create(session=session, seq=1, turn=1, role="user", content=[
        {"type": "text", "text": "[page]\nurl: /orders\ntitle: Your orders\ncontext: "
                                 + json.dumps({"orders": ["A1"]})},
        {"type": "text", "text": "refund A1 please"},
    ])
    refund = ServerTool.objects.create(tenant=tenant, name="refund", risk="high",
                                       kind=ServerTool.Kind.WEBHOOK, approval_policy="operator",
                                       webhook_url="http://127.0.0.1:9/refund")
    older, newer = expired_approval(session, refund), expired_approval(session, refund)
    demo_tools_install(tenant=tenant)
    yield server, olivia, older, newer
    print(f"--- daphne log ---\n{server.logs()}")


async def test_the_review_queue_moves_on_after_each_verdict(browser, admin, request):
    server, olivia, older, newer = admin
    tab, errors = await operator_tab(browser, server, olivia)

    await tab.goto(server.http_url + reverse("admin:approvals_reviewedapproval_changelist"))
    await tab.click(f"#result_list a[href$='/{newer.pk}/change/']")
    await tab.wait_for_selector(".turn-block.kind-text >> text=refund A1 please")
    assert not await tab.is_visible("details.kind-page pre")
    await tab.click("details.kind-page summary")
    await tab.wait_for_selector("details.kind-page pre >> text=A1")

    await tab.select_option("select[name=verdict]", "ok")
    await tab.click("button >> text=Record review")
    await tab.wait_for_selector(f".messagelist >> text=Review of #{newer.pk} (refund) recorded: OK.")
    assert tab.url.endswith(f"/{older.pk}/change/")
    await screenshot(tab, request, "01-next-in-the-queue")

    await tab.select_option("select[name=verdict]", "concern")
    await tab.click("button >> text=Record review")
    await tab.wait_for_selector(".messagelist >> text=Nothing else waits for a review.")
    assert tab.url.endswith(reverse("admin:approvals_reviewedapproval_changelist"))
    assert not errors, f"page script errors: {errors}"


async def test_a_built_in_server_tool_shows_no_webhook_fields(browser, admin, request):
    server, olivia, _older, _newer = admin
    tool = await ServerTool.objects.aget(name="order_status")
    tab, errors = await operator_tab(browser, server, olivia)

    await tab.goto(server.http_url + reverse("admin:approvals_servertool_change", args=[tool.pk]))
    await tab.wait_for_selector("text=Handler's parameters")
    assert await tab.locator("input[name=webhook_url]").count() == 0
    assert await tab.locator("text=Webhook secret").count() == 0
    assert await tab.input_value("textarea[name=parameters]") == ""
    await screenshot(tab, request, "01-built-in-tool")
    assert not errors, f"page script errors: {errors}"
