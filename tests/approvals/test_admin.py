"""The operator screens, through the Django test client."""
from __future__ import annotations

import re

import pytest
from django.test import Client
from django.urls import reverse

from aitp.models import ConversationMessage, OperatorAction
from approvals import services
from approvals.models import Approval, AuditEvent, ServerTool
from tests.approvals.conftest import make_call, make_user

pytestmark = pytest.mark.django_db


def operator_approval(session, *, name="refund", args=None, risk="critical") -> Approval:
    tool = ServerTool.objects.create(
        tenant=session.tenant, name=name, description="Refund an order", risk=risk,
        kind="webhook", webhook_url="https://hooks.example/refund", approval_policy="operator",
    )
    args = {"order": "A1001", "amount": 80} if args is None else args
    call = make_call(session, name=name, args=args, risk=risk, origin="server")
    return services.approval_request_server(tool_call=call, tool=tool, args=args,
                                            session_id=session.id, timeout=120)


def webhook_tool(tenant, name="refund") -> ServerTool:
    return ServerTool.objects.create(
        tenant=tenant, name=name, description="Refund an order", risk="high", kind="webhook",
        webhook_url="https://hooks.example/refund", approval_policy="operator",
    )


def logged_in(user, **client_options) -> Client:
    client = Client(**client_options)
    client.force_login(user)
    return client


def url(name: str, *args) -> str:
    return reverse(f"admin:approvals_{name}", args=args)


def test_an_operator_sees_only_the_pending_approvals_of_her_tenant(
    acme_session, globex_session, olivia
):
    mine = operator_approval(acme_session, name="acme_refund")
    operator_approval(globex_session, name="globex_refund")

    page = logged_in(olivia).get(url("pendingapproval_changelist"))

    assert page.status_code == 200
    assert "acme_refund" in page.content.decode()
    assert "globex_refund" not in page.content.decode()
    assert list(page.context["cl"].result_list) == [Approval.objects.get(pk=mine.pk)]


def test_a_superuser_sees_every_tenant(acme_session, globex_session, root):
    operator_approval(acme_session, name="acme_refund")
    operator_approval(globex_session, name="globex_refund")

    page = logged_in(root).get(url("pendingapproval_changelist"))

    assert page.context["cl"].result_count == 2


def test_the_detail_shows_arguments_risk_and_the_conversation(acme_session, olivia):
    ConversationMessage.objects.create(session=acme_session, seq=1, role="user",
                                       content=[{"type": "text", "text": "Refund my last order"}])
    ConversationMessage.objects.create(
        session=acme_session, seq=2, role="assistant",
        content=[{"type": "text", "text": "Let me refund it."},
                 {"type": "tool_use", "id": "toolu_1", "name": "refund",
                  "input": {"order": "A1001", "amount": 80}}],
    )
    approval = operator_approval(acme_session)

    page = logged_in(olivia).get(url("pendingapproval_change", approval.pk))

    html = page.content.decode()
    assert page.status_code == 200
    assert "Refund my last order" in html and "Let me refund it." in html
    assert "&quot;amount&quot;: 80" in html
    assert "Critical" in html
    assert 'value="approve"' in html and 'value="deny"' in html


def test_the_approve_button_records_the_operators_decision(acme_session, olivia):
    approval = operator_approval(acme_session)
    client = logged_in(olivia, enforce_csrf_checks=True)
    detail = client.get(url("pendingapproval_change", approval.pk))

    answer = client.post(
        url("pendingapproval_decide", approval.pk),
        {"decision": "approve", "note": "verified by phone",
         "csrfmiddlewaretoken": detail.context["csrf_token"]},
    )

    assert answer.status_code == 302
    assert "Approved: refund runs now." in client.get(answer["Location"]).content.decode()
    approval.refresh_from_db()
    assert (approval.status, approval.operator, approval.operator_note) == (
        "approved", olivia, "verified by phone")
    event = AuditEvent.objects.filter(approval_id=approval.pk).last()
    assert (event.action, event.actor, event.channel) == ("approved", "olivia", "admin")


def test_the_deny_button_denies(acme_session, olivia):
    approval = operator_approval(acme_session)

    logged_in(olivia).post(url("pendingapproval_decide", approval.pk), {"decision": "deny"})

    approval.refresh_from_db()
    assert approval.status == "denied"


def test_a_decision_without_the_csrf_token_is_refused(acme_session, olivia):
    approval = operator_approval(acme_session)

    answer = logged_in(olivia, enforce_csrf_checks=True).post(
        url("pendingapproval_decide", approval.pk), {"decision": "approve"}
    )

    assert answer.status_code == 403
    approval.refresh_from_db()
    assert approval.status == "pending"


def test_deciding_needs_a_post(acme_session, olivia):
    approval = operator_approval(acme_session)

    answer = logged_in(olivia).get(url("pendingapproval_decide", approval.pk))

    assert answer.status_code == 405


def test_an_operator_of_another_tenant_can_neither_see_nor_decide(acme_session, mallory):
    approval = operator_approval(acme_session)
    client = logged_in(mallory)

    detail = client.get(url("pendingapproval_change", approval.pk))
    answer = client.post(url("pendingapproval_decide", approval.pk), {"decision": "approve"})

    assert (detail.status_code, answer.status_code) == (404, 404)
    approval.refresh_from_db()
    assert approval.status == "pending"


def test_a_late_decision_is_reported_not_recorded(acme_session, olivia):
    approval = operator_approval(acme_session)
    services.approval_expire(approval_id=approval.pk)

    answer = logged_in(olivia).post(url("approval_decide", approval.pk), {"decision": "approve"},
                                    follow=True)

    assert "Not recorded: approval already decided." in answer.content.decode()
    approval.refresh_from_db()
    assert approval.status == "expired"


def test_an_approval_whose_session_process_is_gone_is_refused_with_the_reason(
        acme_session, olivia):
    from django.utils import timezone

    from aitp.models import ServerProcess

    approval = operator_approval(acme_session)
    ServerProcess.objects.create(id="elsewhere:1", hostname="elsewhere", pid=4242,
                                 stopped_at=timezone.now())
    type(acme_session).objects.filter(pk=acme_session.pk).update(process="elsewhere:1")

    answer = logged_in(olivia).post(url("pendingapproval_decide", approval.pk),
                                    {"decision": "approve"}, follow=True)

    page = answer.content.decode()
    assert ("Not recorded: the server process holding the page&#x27;s session is gone; "
            "the call can no longer run.") in page
    assert "runs now" not in page
    approval.refresh_from_db()
    assert approval.status == "disconnected"


def test_a_signed_in_user_who_is_not_staff_is_sent_to_the_login(acme, acme_session):
    customer = make_user("casey", tenant=acme, staff=False)
    approval = operator_approval(acme_session)

    answer = logged_in(customer).post(url("pendingapproval_decide", approval.pk),
                                      {"decision": "approve"})

    assert answer.status_code == 302 and "login" in answer["Location"]
    approval.refresh_from_db()
    assert approval.status == "pending"


def test_staff_without_a_tenant_see_no_approval_screens(acme_session):
    stranger = make_user("sam")
    operator_approval(acme_session)

    answer = logged_in(stranger).get(url("pendingapproval_changelist"))

    assert answer.status_code == 403


# --- the review queue ----------------------------------------------------------------


def decided(session, name: str, *, risk="critical") -> Approval:
    approval = operator_approval(session, name=name, risk=risk)
    services.approval_expire(approval_id=approval.pk)
    return approval


def test_the_review_queue_lists_unreviewed_risky_decisions_by_default(acme_session, olivia):
    done = decided(acme_session, "reviewed_refund")
    services.approval_review(approval_id=done.pk, user=olivia, verdict="ok")
    waiting = decided(acme_session, "unreviewed_refund")
    operator_approval(acme_session, name="still_pending")

    page = logged_in(olivia).get(url("reviewedapproval_changelist"))
    everything = logged_in(olivia).get(url("reviewedapproval_changelist") + "?review=all")

    assert [a.pk for a in page.context["cl"].result_list] == [waiting.pk]
    assert {a.pk for a in everything.context["cl"].result_list} == {waiting.pk, done.pk}


def test_the_review_form_records_a_verdict(acme_session, olivia):
    approval = decided(acme_session, "refund")

    logged_in(olivia).post(url("reviewedapproval_review", approval.pk),
                           {"verdict": "concern", "note": "amount unusual"})

    approval.refresh_from_db()
    assert (approval.review_status, approval.review_verdict, approval.review_note) == (
        "reviewed", "concern", "amount unusual")


def test_the_review_action_marks_the_selection_ok(acme_session, olivia):
    first, second = decided(acme_session, "refund_a"), decided(acme_session, "refund_b")

    logged_in(olivia).post(url("reviewedapproval_changelist"), {
        "action": "mark_reviewed_ok", "_selected_action": [first.pk, second.pk],
    })

    assert set(Approval.objects.values_list("review_verdict", flat=True)) == {"ok"}
    assert AuditEvent.objects.filter(action="reviewed").count() == 2


# --- the audit log and server tools ------------------------------------------------------


def test_the_audit_log_is_read_only_even_for_a_superuser(acme_session, root):
    approval = operator_approval(acme_session)
    event = AuditEvent.objects.get(approval_id=approval.pk)
    client = logged_in(root)

    listing = client.get(url("auditevent_changelist"))
    add = client.get(url("auditevent_add"))
    delete = client.post(url("auditevent_delete", event.pk), {"post": "yes"})
    change = client.post(url("auditevent_change", event.pk), {"action": "denied"})

    assert listing.status_code == 200 and event.hash[:12] in listing.content.decode()
    assert (add.status_code, delete.status_code, change.status_code) == (403, 403, 403)
    assert AuditEvent.objects.get(pk=event.pk).action == "requested"


def test_an_operator_sees_only_her_tenants_audit_events(acme_session, globex_session, olivia):
    operator_approval(acme_session, name="acme_refund")
    operator_approval(globex_session, name="globex_refund")

    page = logged_in(olivia).get(url("auditevent_changelist"))

    assert {e.tenant_id for e in page.context["cl"].result_list} == {acme_session.tenant_id}


def tool_form(tenant, **changes) -> dict:
    """The admin's add form for a webhook tool, with some fields changed."""
    fields = {
        "tenant": tenant.pk, "name": "refund", "description": "Refund an order", "kind": "webhook",
        "webhook_url": "https://hooks.example/refund", "timeout_seconds": "5", "python_handler": "",
        "parameters": "", "risk": "high", "approval_policy": "operator", "enabled": "on",
    }
    return {**fields, **changes}


def tool_change_form(tool: ServerTool, **changes) -> dict:
    """The change form of a webhook tool as it stands (its tenant is not on it)."""
    fields = {
        "name": tool.name, "description": tool.description, "kind": tool.kind,
        "webhook_url": tool.webhook_url, "timeout_seconds": str(tool.timeout_seconds),
        "parameters": "", "risk": tool.risk, "approval_policy": tool.approval_policy,
    }
    if tool.enabled:
        fields["enabled"] = "on"
    return {**fields, **changes}


def test_the_webhook_secret_is_shown_once_then_masked(acme, olivia):
    client = logged_in(olivia)

    created = client.post(url("servertool_add"), tool_form(acme))
    tool = ServerTool.objects.get(name="refund")
    later = client.get(url("servertool_change", tool.pk))

    assert created.status_code == 200
    assert tool.webhook_secret in created.content.decode()
    assert tool.webhook_secret not in later.content.decode()
    assert tool.webhook_secret[:10] in later.content.decode()


def test_the_webhook_secret_is_never_put_in_the_message_store(acme, olivia):
    created = logged_in(olivia).post(url("servertool_add"), tool_form(acme))

    # The store keeps messages in a cookie (or the session) until the next page.
    assert "messages" not in created.cookies
    assert ServerTool.objects.get(name="refund").webhook_secret in created.content.decode()


def test_a_server_tool_made_in_the_admin_is_recorded_as_made_by_its_author(acme, olivia):
    logged_in(olivia).post(url("servertool_add"), tool_form(acme))

    action = OperatorAction.objects.get(action="server_tool_created")
    assert (action.user, action.tenant) == (olivia, acme)
    assert action.data["tool"] == "refund"
    assert (action.data["risk"], action.data["approval_policy"]) == ("high", "operator")
    assert ServerTool.objects.get(name="refund").webhook_secret not in str(action.data)


def test_a_server_tool_the_model_refuses_is_neither_made_nor_recorded(acme, olivia):
    response = logged_in(olivia).post(url("servertool_add"), tool_form(acme, webhook_url=""))

    assert response.status_code == 200
    assert "a webhook tool needs a url" in str(response.context["adminform"].form.errors)
    assert not ServerTool.objects.exists() and not OperatorAction.objects.exists()


def test_a_server_tool_changed_in_the_admin_records_what_changed(acme, olivia):
    tool = webhook_tool(acme)

    response = logged_in(olivia).post(url("servertool_change", tool.pk),
                                      tool_change_form(tool, name="refund_order", risk="critical"))

    assert response.status_code == 302, response.context and response.context["adminform"].form.errors
    tool.refresh_from_db()
    assert (tool.name, tool.risk) == ("refund_order", "critical")
    action = OperatorAction.objects.get(action="server_tool_updated")
    assert (action.user, action.data) == (olivia, {
        "tool": "refund", "fields": ["name", "risk"], "name": "refund_order", "risk": "critical",
    })


def test_a_server_tool_stays_with_the_tenant_it_was_made_for(acme, globex, olivia):
    from tenants.models import TenantMembership

    TenantMembership.objects.create(tenant=globex, user=olivia, role="owner")
    tool = webhook_tool(acme)

    response = logged_in(olivia).post(url("servertool_change", tool.pk),
                                      {**tool_change_form(tool), "tenant": globex.pk})

    assert response.status_code == 302
    assert ServerTool.objects.get(pk=tool.pk).tenant_id == acme.pk
    assert not OperatorAction.objects.exists()  # nothing changed, nothing recorded


def test_a_server_tool_removed_in_the_admin_is_recorded(acme, olivia):
    tool = webhook_tool(acme)

    response = logged_in(olivia).post(url("servertool_delete", tool.pk), {"post": "yes"})

    assert response.status_code == 302
    assert not ServerTool.objects.filter(pk=tool.pk).exists()
    action = OperatorAction.objects.get(action="server_tool_deleted")
    assert (action.user, action.data) == (olivia, {"tool": "refund", "kind": "webhook"})


def test_server_tools_removed_together_in_the_admin_are_each_recorded(acme, olivia):
    tools = [webhook_tool(acme, name) for name in ("refund", "resend")]

    response = logged_in(olivia).post(url("servertool_changelist"), {
        "action": "delete_selected", "_selected_action": [t.pk for t in tools], "post": "yes",
    })

    assert response.status_code == 302
    assert not ServerTool.objects.exists()
    assert sorted(OperatorAction.objects.values_list("data__tool", flat=True)) == ["refund", "resend"]


def test_a_viewer_member_may_look_at_server_tools_but_not_change_them(acme):
    viewer = make_user("vera", tenant=acme, role="viewer")
    tool = ServerTool.objects.create(tenant=acme, name="refund", description="Refund",
                                     kind="webhook", webhook_url="https://hooks.example/refund")
    client = logged_in(viewer)

    listing = client.get(url("servertool_changelist"))
    change = client.post(url("servertool_change", tool.pk), {"name": "renamed"})

    assert listing.status_code == 200
    assert change.status_code == 403
    assert ServerTool.objects.get(pk=tool.pk).name == "refund"


def test_an_approval_past_its_deadline_leaves_the_operators_queue(acme_session, olivia):
    from datetime import timedelta

    from django.utils import timezone

    stale = operator_approval(acme_session, name="stale_refund")
    Approval.objects.filter(pk=stale.pk).update(deadline=timezone.now() - timedelta(seconds=1))
    operator_approval(acme_session, name="fresh_refund")

    page = logged_in(olivia).get(url("pendingapproval_changelist"))

    assert "fresh_refund" in page.content.decode()
    assert "stale_refund" not in page.content.decode()


# --- names and titles ---------------------------------------------------------------


def test_the_operators_queue_is_titled_and_counted_in_words(acme_session, olivia):
    operator_approval(acme_session, name="refund_a")
    operator_approval(acme_session, name="refund_b")

    html = logged_in(olivia).get(url("pendingapproval_changelist")).content.decode()

    assert "<h1>Approvals waiting for an operator</h1>" in html
    assert re.search(r"\s2 pending approvals\s", html)
    assert "Select pending approval" not in html and "(operator)" not in html


def test_the_review_queue_is_titled_and_counted_in_words(acme_session, olivia):
    decided(acme_session, "refund_a")
    decided(acme_session, "refund_b")

    html = logged_in(olivia).get(url("reviewedapproval_changelist")).content.decode()

    assert "<h1>Approvals to review</h1>" in html
    assert re.search(r"\s2 approvals to review\s", html)
    assert "to review to view" not in html and "review queue" not in html


@pytest.mark.parametrize("review, title", [
    ("reviewed", "Reviewed approvals"),
    ("all", "Decided approvals of high and critical risk"),
])
def test_the_review_queues_title_follows_its_review_filter(acme_session, olivia, review, title):
    decided(acme_session, "refund")

    html = logged_in(olivia).get(url("reviewedapproval_changelist") + f"?review={review}").content.decode()

    assert f"<h1>{title}</h1>" in html


def test_one_approval_to_review_is_counted_in_the_singular(acme_session, olivia):
    decided(acme_session, "refund")

    html = logged_in(olivia).get(url("reviewedapproval_changelist")).content.decode()

    assert re.search(r"\s1 approval to review\s", html)


# --- the audit list names the tool ------------------------------------------------------


def audit_rows(page) -> list[tuple[str, str]]:
    """(action, tool) of each row of the audit list, as shown."""
    rows = re.findall(r'<td class="field-action">(.*?)</td><td class="field-tool">(.*?)</td>',
                      page.content.decode())
    return [(action, re.sub(r"<[^>]+>", "", tool)) for action, tool in rows]


def test_the_audit_list_names_the_tool_of_each_approvals_events(acme_session, olivia):
    approval = operator_approval(acme_session, name="refund_order")
    services.approval_expire(approval_id=approval.pk)

    page = logged_in(olivia).get(url("auditevent_changelist"))

    assert audit_rows(page) == [("Expired", "refund_order"), ("Requested", "refund_order")]


def test_the_audit_list_names_the_tool_of_an_event_of_a_call_without_an_approval(acme_session, olivia):
    from django.db import transaction

    from approvals.audit import append_event

    call = make_call(acme_session, name="order_status", risk="none", origin="server")
    with transaction.atomic():
        append_event(tenant_id=acme_session.tenant_id, action="executed", actor_kind="system",
                     actor="agent", channel="system", session_id=acme_session.id, call_id=call.call_id)

    page = logged_in(olivia).get(url("auditevent_changelist"))

    assert audit_rows(page) == [("Executed", "order_status")]


def test_the_audit_list_reads_its_tools_in_as_many_queries_for_many_rows_as_for_one(acme_session, olivia):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    client = logged_in(olivia)
    operator_approval(acme_session, name="refund_0")
    client.get(url("auditevent_changelist"))  # the session's first reads
    with CaptureQueriesContext(connection) as one:
        client.get(url("auditevent_changelist"))
    for index in range(1, 6):
        operator_approval(acme_session, name=f"refund_{index}")
    with CaptureQueriesContext(connection) as six:
        page = client.get(url("auditevent_changelist"))

    assert len(audit_rows(page)) == 6
    assert len(six.captured_queries) == len(one.captured_queries)
