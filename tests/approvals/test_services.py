"""Approval services: requests, the parties' decisions, endings and reviews."""
from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from aitp.models import OperatorAction, ToolCall
from aitp.tools import args_hash
from approvals import services
from approvals.audit import verify_chain
from approvals.models import Approval, AuditEvent, ServerTool
from approvals.server_tools import python_tool_def
from approvals.services import ApprovalError
from tests.approvals.conftest import make_call, make_session

pytestmark = pytest.mark.django_db

TIMEOUT = 120.0


def request_client(call, *, args=None, risk="critical", session_id=None, timeout=TIMEOUT):
    return services.approval_request_client(
        tool_call=call, tool_name=call.name, args=call.arguments if args is None else args,
        risk=risk, message="Pay 299.98 USD with the saved card?",
        session_id=session_id or call.session_id, timeout=timeout,
    )


def actions(approval=None) -> list[str]:
    events = AuditEvent.objects.order_by("seq")
    if approval is not None:
        events = events.filter(approval_id=approval.pk)
    return list(events.values_list("action", flat=True))


def make_overdue(approval: Approval) -> None:
    Approval.objects.filter(pk=approval.pk).update(deadline=timezone.now() - timedelta(seconds=1))


def server_approval(session, policy: str, risk: str = "high") -> Approval:
    tool = ServerTool.objects.create(
        tenant=session.tenant, name="refund", description="Refund an order", risk=risk,
        kind=ServerTool.Kind.WEBHOOK, webhook_url="http://127.0.0.1:9/refund",
        approval_policy=policy,
    )
    call = make_call(session, name="refund", args={"order": "A1"}, risk=risk, origin="server")
    return services.approval_request_server(
        tool_call=call, tool=tool, args={"order": "A1"}, session_id=session.id, timeout=TIMEOUT
    )


# --- requests -------------------------------------------------------------------


def test_opens_a_pending_user_approval_for_the_call_the_page_holds(payment_call):
    approval = request_client(payment_call)

    assert approval.status == Approval.Status.PENDING
    assert (approval.policy, approval.needs_user, approval.needs_operator) == ("user", True, False)
    assert approval.args_hash == args_hash("process_payment", {"amount": 299.98})
    assert approval.deadline > timezone.now() + timedelta(seconds=TIMEOUT - 10)
    payment_call.refresh_from_db()
    assert payment_call.status == ToolCall.Status.AWAITING_APPROVAL
    event = AuditEvent.objects.get(approval_id=approval.pk)
    assert (event.action, event.actor_kind, event.actor, event.channel) == (
        "requested", "page", "ses_acme", "page")
    assert event.call_id == payment_call.call_id


def test_keeps_the_declared_risk_when_the_page_claims_a_lower_one(payment_call):
    approval = request_client(payment_call, risk="low")

    assert approval.risk == "critical"


def test_a_second_request_for_the_same_call_extends_the_pending_approval(payment_call):
    first = request_client(payment_call, timeout=5)
    second = request_client(payment_call, timeout=TIMEOUT)

    assert second.pk == first.pk
    assert second.deadline > first.deadline
    assert actions(first) == ["requested", "extended"]


def test_records_and_refuses_a_request_whose_arguments_differ_from_the_call(payment_call):
    with pytest.raises(ApprovalError) as caught:
        request_client(payment_call, args={"amount": 1.0})

    assert caught.value.code == "approval_mismatch"
    assert not Approval.objects.exists()
    mismatch = AuditEvent.objects.get(action="mismatch")
    assert mismatch.args_hash == args_hash("process_payment", {"amount": 1.0})
    assert mismatch.data["expected_args_hash"] == args_hash("process_payment", {"amount": 299.98})
    assert verify_chain().ok


def test_a_whole_number_echoed_back_by_the_page_is_not_a_mismatch(acme_session):
    call = make_call(acme_session, name="add_to_cart", args={"quantity": 2.0, "sku": "pro"})

    approval = request_client(call, args={"sku": "pro", "quantity": 2})

    assert approval.args_hash == args_hash("add_to_cart", {"quantity": 2.0, "sku": "pro"})


def test_a_different_tool_name_with_the_same_arguments_is_a_mismatch(payment_call):
    with pytest.raises(ApprovalError) as caught:
        services.approval_request_client(
            tool_call=payment_call, tool_name="refund", args=payment_call.arguments,
            risk="critical", message="Refund?", session_id="ses_acme", timeout=TIMEOUT,
        )

    assert caught.value.code == "approval_mismatch"


def test_refuses_a_request_from_a_session_that_does_not_hold_the_call(payment_call, globex_session):
    with pytest.raises(ApprovalError) as caught:
        request_client(payment_call, session_id=globex_session.id)

    assert caught.value.code == "unknown_call"
    assert not Approval.objects.exists()


def test_refuses_a_request_for_a_call_that_already_finished(payment_call):
    ToolCall.objects.filter(pk=payment_call.pk).update(status=ToolCall.Status.TIMEOUT)

    with pytest.raises(ApprovalError) as caught:
        request_client(payment_call)

    assert caught.value.code == "unknown_call"


def test_refuses_a_new_request_once_the_approval_was_decided(payment_call):
    approval = request_client(payment_call)
    services.approval_decide_user(approval_id=approval.pk, session_id="ses_acme", approved=False)

    with pytest.raises(ApprovalError) as caught:
        request_client(payment_call)

    assert caught.value.code == "already_decided"


def test_a_server_tool_with_operator_policy_waits_for_an_operator_only(acme_session):
    approval = server_approval(acme_session, "operator")

    assert (approval.origin, approval.needs_user, approval.needs_operator) == ("server", False, True)
    event = AuditEvent.objects.get(approval_id=approval.pk)
    assert (event.action, event.actor_kind, event.channel) == ("requested", "system", "system")


def test_a_code_tool_definition_carries_its_policy_into_the_approval(acme_session):
    tool = python_tool_def("cancel_order", policy="user_and_operator")
    call = make_call(acme_session, name="cancel_order", args={"number": "A1"}, risk="high",
                     origin="server")

    approval = services.approval_request_server(
        tool_call=call, tool=tool, args={"number": "A1"}, session_id=acme_session.id,
        timeout=TIMEOUT,
    )

    assert (approval.needs_user, approval.needs_operator, approval.risk) == (True, True, "high")
    assert approval.message


# --- the page user's decision -------------------------------------------------


def test_the_page_user_approves_and_the_approval_is_approved(payment_call):
    approval = request_client(payment_call)

    decided = services.approval_decide_user(approval_id=approval.pk, session_id="ses_acme",
                                            approved=True)

    assert decided.status == Approval.Status.APPROVED
    assert decided.user_decision == "approved" and decided.decided_at is not None
    event = AuditEvent.objects.filter(approval_id=approval.pk).last()
    assert (event.action, event.actor_kind, event.actor) == ("approved", "page", "ses_acme")


def test_a_refusal_denies_and_keeps_the_page_error(payment_call):
    approval = request_client(payment_call)

    decided = services.approval_decide_user(approval_id=approval.pk, session_id="ses_acme",
                                            approved=False, error="Action denied by user")

    assert decided.status == Approval.Status.DENIED
    event = AuditEvent.objects.filter(approval_id=approval.pk).last()
    assert event.action == "denied" and event.data["error"] == "Action denied by user"


def test_a_page_users_refusal_ends_the_call_as_denied_with_the_same_event(payment_call):
    approval = request_client(payment_call)

    services.approval_decide_user(approval_id=approval.pk, session_id="ses_acme", approved=False)

    call = ToolCall.objects.get(pk=payment_call.pk)
    assert (call.status, call.error) == ("denied", "The user declined this action.")
    event = AuditEvent.objects.filter(approval_id=approval.pk).last()
    assert (event.action, event.data) == ("denied", {"party": "user", "status": "denied",
                                                     "call": "denied"})


def test_a_page_users_approval_of_a_page_call_leaves_its_end_to_the_pages_answer(payment_call):
    approval = request_client(payment_call)

    services.approval_decide_user(approval_id=approval.pk, session_id="ses_acme", approved=True)

    assert ToolCall.objects.get(pk=payment_call.pk).status == "awaiting_approval"
    event = AuditEvent.objects.filter(approval_id=approval.pk).last()
    assert "call" not in event.data


def test_the_page_users_approval_of_a_server_tool_lets_its_call_run(acme_session):
    approval = server_approval(acme_session, "user")

    services.approval_decide_user(approval_id=approval.pk, session_id=acme_session.id,
                                  approved=True)

    assert ToolCall.objects.get(pk=approval.tool_call_id).status == "running"
    assert AuditEvent.objects.filter(approval_id=approval.pk).last().data["call"] == "running"


def test_a_call_that_moved_on_first_is_not_moved_back_by_a_decision(acme_session, olivia):
    approval = server_approval(acme_session, "operator")
    # The turn was cancelled and wrote the call's end before the operator decided.
    ToolCall.objects.filter(pk=approval.tool_call_id).update(status="cancelled")

    services.approval_decide_operator(approval_id=approval.pk, user=olivia, approved=False)

    assert ToolCall.objects.get(pk=approval.tool_call_id).status == "cancelled"
    assert "call" not in AuditEvent.objects.filter(approval_id=approval.pk).last().data


def test_refuses_an_answer_from_another_session(payment_call, globex_session):
    approval = request_client(payment_call)

    with pytest.raises(ApprovalError) as caught:
        services.approval_decide_user(approval_id=approval.pk, session_id=globex_session.id,
                                      approved=True)

    assert caught.value.code == "not_allowed"
    approval.refresh_from_db()
    assert approval.status == Approval.Status.PENDING


def test_the_first_of_two_answers_wins(payment_call):
    approval = request_client(payment_call)
    services.approval_decide_user(approval_id=approval.pk, session_id="ses_acme", approved=False)

    with pytest.raises(ApprovalError) as caught:
        services.approval_decide_user(approval_id=approval.pk, session_id="ses_acme", approved=True)

    assert caught.value.code == "already_decided"
    approval.refresh_from_db()
    assert approval.status == Approval.Status.DENIED
    assert actions(approval) == ["requested", "denied"]


def test_an_answer_just_after_the_deadline_expires_the_approval(payment_call):
    approval = request_client(payment_call)
    make_overdue(approval)

    with pytest.raises(ApprovalError) as caught:
        services.approval_decide_user(approval_id=approval.pk, session_id="ses_acme", approved=True)

    assert caught.value.code == "already_decided"
    approval.refresh_from_db()
    assert approval.status == Approval.Status.EXPIRED and approval.user_decision is None
    assert actions(approval) == ["requested", "expired"]


def test_the_page_user_cannot_answer_an_operator_only_approval(acme_session):
    approval = server_approval(acme_session, "operator")

    with pytest.raises(ApprovalError) as caught:
        services.approval_decide_user(approval_id=approval.pk, session_id=acme_session.id,
                                      approved=True)

    assert caught.value.code == "not_allowed"


def test_an_unknown_approval_is_an_unknown_call(acme_session):
    for bad_id in (999999, "not-a-number", None):
        with pytest.raises(ApprovalError) as caught:
            services.approval_decide_user(approval_id=bad_id, session_id=acme_session.id,
                                          approved=True)
        assert caught.value.code == "unknown_call"


# --- the operator's decision ------------------------------------------------------


def test_an_operator_of_the_tenant_approves_and_the_session_is_told(
    acme_session, olivia, monkeypatch, django_capture_on_commit_callbacks
):
    told = []
    monkeypatch.setattr("aitp.notify.session_command",
                        lambda session_id, command, **fields: told.append((session_id, command, fields)))
    approval = server_approval(acme_session, "operator")

    with django_capture_on_commit_callbacks(execute=True):
        decided = services.approval_decide_operator(approval_id=approval.pk, user=olivia,
                                                    approved=True, note="known customer")

    assert decided.status == Approval.Status.APPROVED
    assert (decided.operator, decided.operator_note) == (olivia, "known customer")
    assert told == [("ses_acme", "approval_decided", {"approval_id": approval.pk})]
    event = AuditEvent.objects.filter(approval_id=approval.pk).last()
    assert (event.actor_kind, event.actor, event.channel) == ("operator", "olivia", "admin")
    assert event.data["note"] == "known customer"
    assert OperatorAction.objects.get(session_id="ses_acme").action == "approval_approved"


def test_refuses_an_operator_of_another_tenant(acme_session, mallory):
    approval = server_approval(acme_session, "operator")

    with pytest.raises(ApprovalError) as caught:
        services.approval_decide_operator(approval_id=approval.pk, user=mallory, approved=True)

    assert caught.value.code == "not_allowed"
    approval.refresh_from_db()
    assert approval.status == Approval.Status.PENDING and approval.operator_decision is None


def test_a_superuser_may_decide_for_any_tenant(acme_session, root):
    approval = server_approval(acme_session, "operator")

    decided = services.approval_decide_operator(approval_id=approval.pk, user=root, approved=False,
                                                channel="console")

    assert decided.status == Approval.Status.DENIED
    assert AuditEvent.objects.filter(approval_id=approval.pk).last().channel == "console"


def test_an_operator_cannot_decide_an_approval_that_is_the_page_users(payment_call, olivia):
    approval = request_client(payment_call)

    with pytest.raises(ApprovalError) as caught:
        services.approval_decide_operator(approval_id=approval.pk, user=olivia, approved=True)

    assert caught.value.code == "not_allowed"


def test_both_parties_must_approve_when_the_policy_needs_both(acme_session, olivia):
    approval = server_approval(acme_session, "user_and_operator")

    after_user = services.approval_decide_user(approval_id=approval.pk,
                                               session_id=acme_session.id, approved=True)
    assert after_user.status == Approval.Status.PENDING
    after_operator = services.approval_decide_operator(approval_id=approval.pk, user=olivia,
                                                       approved=True)

    assert after_operator.status == Approval.Status.APPROVED


def test_one_refusal_denies_when_the_policy_needs_both(acme_session, olivia):
    approval = server_approval(acme_session, "user_and_operator")

    services.approval_decide_user(approval_id=approval.pk, session_id=acme_session.id,
                                  approved=True)
    decided = services.approval_decide_operator(approval_id=approval.pk, user=olivia,
                                                approved=False)

    assert decided.status == Approval.Status.DENIED


def test_an_operator_decision_after_the_deadline_expires_the_approval(acme_session, olivia):
    approval = server_approval(acme_session, "operator")
    make_overdue(approval)

    with pytest.raises(ApprovalError) as caught:
        services.approval_decide_operator(approval_id=approval.pk, user=olivia, approved=True)

    assert caught.value.code == "already_decided"
    approval.refresh_from_db()
    assert approval.status == Approval.Status.EXPIRED


def test_an_inactive_operator_is_refused(acme_session, olivia):
    approval = server_approval(acme_session, "operator")
    olivia.is_active = False
    olivia.save()

    with pytest.raises(ApprovalError) as caught:
        services.approval_decide_operator(approval_id=approval.pk, user=olivia, approved=True)

    assert caught.value.code == "not_allowed"


# --- endings ------------------------------------------------------------------------


def test_expiring_is_idempotent(payment_call):
    approval = request_client(payment_call)

    services.approval_expire(approval_id=approval.pk)
    again = services.approval_expire(approval_id=approval.pk)

    assert again.status == Approval.Status.EXPIRED
    assert actions(approval) == ["requested", "expired"]


def test_expiring_leaves_a_decided_approval_alone(payment_call):
    approval = request_client(payment_call)
    services.approval_decide_user(approval_id=approval.pk, session_id="ses_acme", approved=True)

    kept = services.approval_expire(approval_id=approval.pk)

    assert kept.status == Approval.Status.APPROVED


def test_the_sweeper_expires_only_overdue_approvals(acme_session):
    overdue = request_client(make_call(acme_session))
    fresh = request_client(make_call(acme_session))
    make_overdue(overdue)

    assert services.approval_expire_overdue() == 1

    overdue.refresh_from_db()
    fresh.refresh_from_db()
    assert (overdue.status, fresh.status) == ("expired", "pending")


@pytest.mark.parametrize("status", ["cancelled", "disconnected"])
def test_closing_ends_a_pending_approval_with_the_reason(payment_call, status):
    approval = request_client(payment_call)

    closed = services.approval_close(approval_id=approval.pk, status=status)

    assert closed.status == status
    assert actions(approval) == ["requested", status]


def test_closing_refuses_a_status_that_is_not_an_ending(payment_call):
    approval = request_client(payment_call)

    with pytest.raises(ValueError):
        services.approval_close(approval_id=approval.pk, status="approved")


def test_records_the_execution_of_an_approved_tool(payment_call):
    approval = request_client(payment_call)
    services.approval_decide_user(approval_id=approval.pk, session_id="ses_acme", approved=True)

    services.approval_record_execution(approval_id=approval.pk, ok=False, error="card declined")

    event = AuditEvent.objects.filter(approval_id=approval.pk).last()
    assert (event.action, event.data) == ("failed", {"error": "card declined", "call": "error"})


def test_refuses_to_record_an_execution_that_was_never_approved(payment_call):
    approval = request_client(payment_call)

    with pytest.raises(ApprovalError) as caught:
        services.approval_record_execution(approval_id=approval.pk, ok=True)

    assert caught.value.code == "not_allowed"
    assert "executed" not in actions(approval)


# --- review -----------------------------------------------------------------------------


def test_an_operator_reviews_a_decided_approval(payment_call, olivia):
    approval = request_client(payment_call)
    services.approval_decide_user(approval_id=approval.pk, session_id="ses_acme", approved=True)

    reviewed = services.approval_review(approval_id=approval.pk, user=olivia, verdict="concern",
                                        note="amount unusual")

    assert (reviewed.review_status, reviewed.review_verdict, reviewed.reviewed_by) == (
        "reviewed", "concern", olivia)
    event = AuditEvent.objects.filter(approval_id=approval.pk).last()
    assert (event.action, event.data) == ("reviewed", {"verdict": "concern", "note": "amount unusual"})


def test_a_pending_approval_cannot_be_reviewed(payment_call, olivia):
    approval = request_client(payment_call)

    with pytest.raises(ApprovalError) as caught:
        services.approval_review(approval_id=approval.pk, user=olivia, verdict="ok")

    assert caught.value.code == "not_allowed"


def test_an_operator_of_another_tenant_cannot_review(payment_call, mallory):
    approval = request_client(payment_call)
    services.approval_expire(approval_id=approval.pk)

    with pytest.raises(ApprovalError) as caught:
        services.approval_review(approval_id=approval.pk, user=mallory, verdict="ok")

    assert caught.value.code == "not_allowed"


def test_every_path_leaves_a_chain_that_verifies(acme_session, olivia):
    for index in range(3):
        session = make_session(acme_session.tenant)
        approval = request_client(make_call(session))
        services.approval_decide_user(approval_id=approval.pk, session_id=session.id,
                                      approved=index != 1)
    operator_approval = server_approval(acme_session, "operator")
    services.approval_decide_operator(approval_id=operator_approval.pk, user=olivia, approved=True)
    services.approval_record_execution(approval_id=operator_approval.pk, ok=True)

    result = verify_chain()

    assert result.ok, result.problem
    assert result.count == AuditEvent.objects.count() == 9


# --- a session whose server process is gone -------------------------------------------
# The sweep has not closed its rows yet: nothing would run the call, so no
# decision may say it will. The liveness rules are aitp.liveness's.


def held_by(session, **process_fields):
    """Put the session on a server process of another host (so only its row's
    facts count: stopped, or when it was last refreshed)."""
    from aitp.models import ServerProcess

    now = timezone.now()
    process = ServerProcess.objects.create(**{
        "id": f"elsewhere:{session.id}", "hostname": "elsewhere", "pid": 4242,
        "started_at": now - timedelta(hours=1), "last_seen_at": now, **process_fields,
    })
    session.process = process.id
    session.save(update_fields=["process"])
    return process


GONE = {
    "stopped": {"stopped_at": timezone.now},
    "silent for three heartbeats": {"last_seen_at": lambda: timezone.now() - timedelta(seconds=46)},
}


def gone_fields(how: str) -> dict:
    return {name: make() for name, make in GONE[how].items()}


def assert_closed_as_lost(approval: Approval) -> None:
    approval.refresh_from_db()
    assert approval.status == Approval.Status.DISCONNECTED
    assert (approval.operator_decision, approval.user_decision) == (None, None)
    event = AuditEvent.objects.filter(approval_id=approval.pk).last()
    assert (event.action, event.actor_kind, event.data) == (
        "disconnected", "system", {"reason": "server process gone", "call": "disconnected"})
    call = approval.tool_call
    call.refresh_from_db()
    assert (call.status, call.error) == (
        "disconnected", "The connection to the page ended before the tool finished.")
    assert verify_chain().ok


@pytest.mark.parametrize("how", sorted(GONE))
def test_an_operator_cannot_approve_a_call_whose_session_process_is_gone(
        acme_session, olivia, settings, how):
    settings.OWLLAYER_HEARTBEAT_INTERVAL = 15
    approval = server_approval(acme_session, "operator")
    held_by(acme_session, **gone_fields(how))

    with pytest.raises(ApprovalError) as refused:
        services.approval_decide_operator(approval_id=approval.pk, user=olivia, approved=True)

    assert (refused.value.code, refused.value.message) == (
        "session_lost",
        "the server process holding the page's session is gone; the call can no longer run")
    assert_closed_as_lost(approval)
    assert not OperatorAction.objects.filter(action="approval_approved").exists()


@pytest.mark.parametrize("how", sorted(GONE))
def test_a_page_users_answer_for_a_session_whose_process_is_gone_is_refused(
        payment_call, settings, how):
    settings.OWLLAYER_HEARTBEAT_INTERVAL = 15
    approval = request_client(payment_call)
    held_by(payment_call.session, **gone_fields(how))

    with pytest.raises(ApprovalError) as refused:
        services.approval_decide_user(approval_id=approval.pk, session_id=payment_call.session_id,
                                      approved=True)

    assert refused.value.code == "session_lost"
    assert_closed_as_lost(approval)


def test_a_session_not_refreshed_for_three_heartbeats_refuses_decisions_too(
        acme_session, olivia, settings):
    # A session served without a registered process: only its own row's
    # heartbeat says whether it lives.
    settings.OWLLAYER_HEARTBEAT_INTERVAL = 15
    approval = server_approval(acme_session, "operator")
    type(acme_session).objects.filter(pk=acme_session.pk).update(
        last_seen_at=timezone.now() - timedelta(seconds=46))

    with pytest.raises(ApprovalError) as refused:
        services.approval_decide_operator(approval_id=approval.pk, user=olivia, approved=True)

    assert refused.value.code == "session_lost"
    assert_closed_as_lost(approval)


def test_an_operator_approves_a_call_whose_session_process_lives(acme_session, olivia, settings):
    settings.OWLLAYER_HEARTBEAT_INTERVAL = 15
    approval = server_approval(acme_session, "operator")
    held_by(acme_session, last_seen_at=timezone.now() - timedelta(seconds=44))

    decided = services.approval_decide_operator(approval_id=approval.pk, user=olivia, approved=True)

    assert decided.status == Approval.Status.APPROVED
    assert ToolCall.objects.get(pk=decided.tool_call_id).status == "running"
