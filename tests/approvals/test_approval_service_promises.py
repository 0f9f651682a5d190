"""What the approval services promise, each pinned by its own test.

- An approval is opened for exactly the call the session holds, as asked by
  its page (or by the agent), at the higher of the two risks, and lasts
  exactly its timeout; every event of it names its session, call and
  arguments. A request for other arguments is recorded, logged and refused.

- Every ending the system writes (expired, cancelled, disconnected) is
  stamped with when it happened, persisted, and audited as the system, with
  the reason it was closed; it ends the approval's call in the same
  transaction, and its event names the status the call moved to.
- A decision on an approval whose page session has ended, or whose
  session's server process is gone, never approves it: the approval is
  closed as disconnected instead (its call too), and the caller is told.
- A decision and what it does to the call (denied, running, disconnected)
  are written with one audit event that names the call's new status.
- A page that answers a risky call without asking its user gets a violation
  on record, once, for that call only, and the answer does not count.
- The sweepers close exactly what they should and say how many.
- Executions and reviews are audited with who acted and what was said, and
  nothing more; an execution ends its call (success with its result, or
  error) in the transaction of its event.
- A failure between a call's end and its event (the audit append raising)
  leaves neither.
- Every refusal carries a stable code and words a person can read.
- The higher of two risks wins, however each is spelled; a policy names
  exactly the parties who must approve.
"""
from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from agent.approvals import NOT_APPROVED_MESSAGE
from aitp.models import Session, ToolCall
from aitp.tools import Risk, args_hash
from approvals import services
from approvals.models import Approval, AuditEvent, higher_risk, policy_parties
from approvals.services import ApprovalError
from tests.approvals.conftest import make_call, make_session

pytestmark = pytest.mark.django_db

TIMEOUT = 120.0


def request_client(call) -> Approval:
    return services.approval_request_client(
        tool_call=call, tool_name=call.name, args=call.arguments, risk=call.risk,
        message="Pay 299.98 USD with the saved card?", session_id=call.session_id,
        timeout=TIMEOUT,
    )


def last_event(approval: Approval) -> AuditEvent:
    return AuditEvent.objects.filter(approval_id=approval.pk).order_by("seq").last()


def end_session(session_id: str) -> None:
    Session.objects.filter(pk=session_id).update(ended_at=timezone.now())


def make_overdue(approval: Approval) -> None:
    Approval.objects.filter(pk=approval.pk).update(deadline=timezone.now() - timedelta(seconds=1))


def assert_closed_by_the_system(approval: Approval, status: str, data=None) -> None:
    """The approval ended as ``status``, stamped and audited by the system,
    with ``data`` as the event's details (none: stored empty)."""
    stored = Approval.objects.get(pk=approval.pk)
    assert stored.status == status
    assert stored.decided_at is not None
    assert abs(timezone.now() - stored.decided_at) < timedelta(minutes=5)
    event = last_event(approval)
    assert (event.action, event.actor_kind, event.actor, event.channel) == (
        status, "system", "system", "system")
    assert event.data == (data or {})


# --- endings written by the system ------------------------------------------------


def call_row(approval: Approval) -> tuple:
    call = ToolCall.objects.get(pk=approval.tool_call_id)
    return call.status, call.error, call.finished_at is not None


def test_an_expired_approval_records_when_it_expired_and_that_the_system_closed_it(payment_call):
    approval = request_client(payment_call)

    services.approval_expire(approval_id=approval.pk)

    assert_closed_by_the_system(approval, "expired", {"call": "expired"})
    assert call_row(approval) == (
        "expired", "The user did not decide in time; the action was not approved.", True)


def test_an_expiry_ends_the_call_with_the_words_the_turn_gives_it(payment_call):
    approval = request_client(payment_call)

    services.approval_expire(approval_id=approval.pk, error="Nobody decided.")

    assert call_row(approval) == ("expired", "Nobody decided.", True)


def test_an_expired_server_approval_tells_that_nobody_approved(acme_session):
    approval = server_approval(acme_session, "operator")

    services.approval_expire(approval_id=approval.pk)

    assert call_row(approval) == (
        "expired", "Nobody approved the action in time; it did not run.", True)


CLOSED_WITH = {
    "cancelled": "The turn was cancelled before the tool answered.",
    "disconnected": "The user left the page before the tool answered.",
}


@pytest.mark.parametrize("status", ["cancelled", "disconnected"])
def test_a_closed_approval_records_when_it_was_closed_and_that_the_system_closed_it(
        payment_call, status):
    approval = request_client(payment_call)

    services.approval_close(approval_id=approval.pk, status=status)

    assert_closed_by_the_system(approval, status, {"call": status})
    assert call_row(approval) == (status, CLOSED_WITH[status], True)


def test_a_closed_approval_ends_its_call_as_the_turn_says(payment_call):
    approval = request_client(payment_call)

    services.approval_close(approval_id=approval.pk, status="cancelled", call_status="denied",
                            error="The page asked about other arguments.")

    assert_closed_by_the_system(approval, "cancelled", {"call": "denied"})
    assert call_row(approval) == ("denied", "The page asked about other arguments.", True)


@pytest.mark.parametrize("status", ["cancelled", "disconnected"])
def test_an_approved_call_cut_before_it_ended_ends_with_an_event_and_the_decision_stands(
        acme_session, status):
    approval = server_approval(acme_session, "user")
    services.approval_decide_user(approval_id=approval.pk, session_id=acme_session.id,
                                  approved=True)

    services.approval_close(approval_id=approval.pk, status=status)

    assert Approval.objects.get(pk=approval.pk).status == "approved"
    event = last_event(approval)
    assert (event.action, event.actor_kind, event.data) == (status, "system", {"call": status})
    assert call_row(approval) == (status, CLOSED_WITH[status], True)


@pytest.mark.parametrize("status", ["cancelled", "disconnected"])
def test_closing_an_approval_whose_call_had_ended_writes_nothing(payment_call, status):
    approval = approved(payment_call)
    services.approval_record_execution(approval_id=approval.pk, ok=True, result={"paid": True})
    events = AuditEvent.objects.count()

    services.approval_close(approval_id=approval.pk, status=status)

    assert AuditEvent.objects.count() == events
    assert call_row(approval)[0] == "success"


def test_closing_as_a_status_that_is_not_an_ending_is_refused_by_name(payment_call):
    approval = request_client(payment_call)

    with pytest.raises(ValueError, match=r"^cannot close an approval as 'approved'$"):
        services.approval_close(approval_id=approval.pk, status="approved")


def test_a_user_answer_after_the_deadline_expires_the_approval_as_late_from_the_user(payment_call):
    approval = request_client(payment_call)
    make_overdue(approval)

    with pytest.raises(ApprovalError) as caught:
        services.approval_decide_user(approval_id=approval.pk, session_id=approval.session_id,
                                      approved=True)

    assert (caught.value.code, caught.value.message) == ("already_decided", "approval expired")
    assert_closed_by_the_system(approval, "expired", {"late": "user", "call": "expired"})
    assert call_row(approval)[0] == "expired"


def test_an_operator_decision_after_the_deadline_expires_the_approval_as_late_from_an_operator(
        acme_session, olivia):
    approval = server_approval(acme_session, "operator")
    make_overdue(approval)

    with pytest.raises(ApprovalError) as caught:
        services.approval_decide_operator(approval_id=approval.pk, user=olivia, approved=True)

    assert (caught.value.code, caught.value.message) == ("already_decided", "approval expired")
    assert_closed_by_the_system(approval, "expired", {"late": "operator", "call": "expired"})
    assert call_row(approval) == (
        "expired", "Nobody approved the action in time; it did not run.", True)


def test_an_operator_decision_without_a_note_records_none(acme_session, olivia):
    from aitp.models import OperatorAction

    approval = server_approval(acme_session, "operator")

    services.approval_decide_operator(approval_id=approval.pk, user=olivia, approved=True)

    stored = Approval.objects.get(pk=approval.pk)
    assert (stored.operator_decision, stored.operator_note, stored.operator) == (
        "approved", "", olivia)
    event = last_event(approval)
    assert (event.action, event.actor_kind, event.actor, event.channel) == (
        "approved", "operator", olivia.get_username(), "admin")
    # The server tool's call may run now: the approval moved it, with this event.
    assert event.data == {"party": "operator", "status": "approved", "call": "running"}
    assert ToolCall.objects.get(pk=stored.tool_call_id).status == "running"
    action = OperatorAction.objects.get(session_id=acme_session.id)
    assert (action.action, action.data) == (
        "approval_approved", {"approval_id": approval.pk, "tool": "refund", "note": ""})


def test_an_operator_may_not_decide_for_the_page_user_and_is_told_so(payment_call, olivia):
    approval = request_client(payment_call)

    with pytest.raises(ApprovalError) as caught:
        services.approval_decide_operator(approval_id=approval.pk, user=olivia, approved=True)

    assert (caught.value.code, caught.value.message) == (
        "not_allowed", "this approval is for the page user")


def test_an_operator_denial_is_recorded_as_a_denial_by_that_operator(acme_session, olivia):
    from aitp.models import OperatorAction

    approval = server_approval(acme_session, "operator")
    note = "n" * 600

    services.approval_decide_operator(approval_id=approval.pk, user=olivia, approved=False,
                                      note=note)

    stored = Approval.objects.get(pk=approval.pk)
    assert (stored.status, stored.operator_decision, stored.operator_note) == (
        "denied", "denied", note)
    assert stored.decided_at is not None and stored.operator_decided_at is not None
    event = last_event(approval)
    assert (event.action, event.actor) == ("denied", olivia.get_username())
    # (The audit keeps a shortened copy of a long note.)
    assert {**event.data, "note": None} == {
        "party": "operator", "status": "denied", "note": None, "call": "denied"}
    # The refusal ended the call with the words the model is told, with this event.
    call = ToolCall.objects.get(pk=stored.tool_call_id)
    assert (call.status, call.error) == ("denied", "An operator declined this action.")
    assert call.finished_at is not None
    assert event.data["note"].startswith("n" * 100)
    action = OperatorAction.objects.get(session_id=acme_session.id)
    assert (action.action, action.user, action.tenant_id) == (
        "approval_denied", olivia, acme_session.tenant_id)
    # The operator's record keeps the first 500 characters of the note.
    assert action.data == {"approval_id": approval.pk, "tool": "refund", "note": "n" * 500}


def test_an_operator_cannot_overturn_a_page_users_refusal(acme_session, olivia):
    approval = server_approval(acme_session, "user_and_operator")
    services.approval_decide_user(approval_id=approval.pk, session_id=acme_session.id,
                                  approved=False)

    with pytest.raises(ApprovalError) as caught:
        services.approval_decide_operator(approval_id=approval.pk, user=olivia, approved=True)

    assert (caught.value.code, caught.value.message) == (
        "already_decided", "approval already decided")
    stored = Approval.objects.get(pk=approval.pk)
    assert (stored.status, stored.operator_decision) == ("denied", None)


def test_a_user_cannot_overturn_an_operators_refusal(acme_session, olivia):
    approval = server_approval(acme_session, "user_and_operator")
    services.approval_decide_operator(approval_id=approval.pk, user=olivia, approved=False)

    with pytest.raises(ApprovalError) as caught:
        services.approval_decide_user(approval_id=approval.pk, session_id=acme_session.id,
                                      approved=True)

    assert (caught.value.code, caught.value.message) == (
        "already_decided", "approval already decided")
    stored = Approval.objects.get(pk=approval.pk)
    assert (stored.status, stored.user_decision) == ("denied", None)


def test_the_first_party_to_approve_leaves_the_approval_pending_for_the_other(acme_session, olivia):
    approval = server_approval(acme_session, "user_and_operator")

    services.approval_decide_operator(approval_id=approval.pk, user=olivia, approved=True)

    stored = Approval.objects.get(pk=approval.pk)
    assert (stored.status, stored.decided_at) == ("pending", None)
    assert stored.operator_decided_at is not None
    assert last_event(approval).data == {"party": "operator", "status": "pending"}


def test_a_user_decision_records_when_it_was_made(acme_session):
    approval = server_approval(acme_session, "user_and_operator")
    before = timezone.now()

    services.approval_decide_user(approval_id=approval.pk, session_id=acme_session.id,
                                  approved=True)

    stored = Approval.objects.get(pk=approval.pk)
    assert (stored.status, stored.user_decision, stored.decided_at) == ("pending", "approved", None)
    assert before <= stored.user_decided_at <= timezone.now()
    assert last_event(approval).data == {"party": "user", "status": "pending"}


def operator_log(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "approvals.services" and "operator" in r.getMessage()]


def test_an_operator_decision_is_logged_with_who_decided_what(acme_session, olivia, caplog):
    approving = server_approval(acme_session, "operator")
    denying = server_approval(make_session(acme_session.tenant), "operator")

    services.approval_decide_operator(approval_id=approving.pk, user=olivia, approved=True)
    services.approval_decide_operator(approval_id=denying.pk, user=olivia, approved=False)

    assert operator_log(caplog) == [
        f"session {acme_session.id}: operator olivia approved approval {approving.pk}",
        f"session {denying.session_id}: operator olivia denied approval {denying.pk}",
    ]


def test_an_operator_decision_stands_when_the_session_cannot_be_told(
        acme_session, olivia, monkeypatch, django_capture_on_commit_callbacks):
    def channel_layer_away(*args, **kwargs):
        raise ConnectionError("the channel layer is away")

    # The notice after commit fails as it would with the channel layer away.
    monkeypatch.setattr("aitp.notify.session_command", channel_layer_away)
    approval = server_approval(acme_session, "operator")

    with django_capture_on_commit_callbacks(execute=True) as notices:
        decided = services.approval_decide_operator(approval_id=approval.pk, user=olivia,
                                                    approved=True)

    assert len(notices) == 1
    assert decided.status == "approved"
    assert Approval.objects.get(pk=approval.pk).status == "approved"


# --- a session that ended -----------------------------------------------------------------


def server_approval(session, policy: str) -> Approval:
    from approvals.models import ServerTool

    tool, _ = ServerTool.objects.get_or_create(
        tenant=session.tenant, name="refund", defaults={
            "description": "Refund an order", "risk": "high", "kind": ServerTool.Kind.WEBHOOK,
            "webhook_url": "http://127.0.0.1:9/refund", "approval_policy": policy},
    )
    call = make_call(session, name="refund", args={"order": "A1"}, risk="high", origin="server")
    return services.approval_request_server(
        tool_call=call, tool=tool, args={"order": "A1"}, session_id=session.id, timeout=TIMEOUT
    )


def test_a_user_approval_after_the_session_ended_closes_it_as_disconnected(payment_call):
    approval = request_client(payment_call)
    end_session(approval.session_id)

    with pytest.raises(ApprovalError) as caught:
        services.approval_decide_user(approval_id=approval.pk, session_id=approval.session_id,
                                      approved=True)

    assert caught.value.code == "session_ended"
    assert caught.value.message == "the page's session has ended; the call can no longer run"
    assert_closed_by_the_system(approval, "disconnected",
                                {"reason": "session ended", "call": "disconnected"})
    assert ToolCall.objects.get(pk=payment_call.pk).status == "disconnected"


def test_an_operator_approval_after_the_session_ended_closes_it_as_disconnected(
        acme_session, olivia):
    approval = server_approval(acme_session, "operator")
    end_session(acme_session.id)

    with pytest.raises(ApprovalError) as caught:
        services.approval_decide_operator(approval_id=approval.pk, user=olivia, approved=True)

    assert caught.value.code == "session_ended"
    assert_closed_by_the_system(approval, "disconnected",
                                {"reason": "session ended", "call": "disconnected"})


def test_a_session_that_ended_is_not_mistaken_for_another_that_ended(acme_session):
    other = make_session(acme_session.tenant)
    approval = request_client(make_call(acme_session))
    end_session(other.id)

    decided = services.approval_decide_user(approval_id=approval.pk, session_id=acme_session.id,
                                            approved=True)

    assert decided.status == "approved"


def test_the_sweeper_closes_only_pending_approvals_of_ended_sessions_and_counts_them(acme_session):
    ended = make_session(acme_session.tenant)
    stranded = [request_client(make_call(ended)) for _ in range(2)]
    decided = request_client(make_call(ended))
    services.approval_decide_user(approval_id=decided.pk, session_id=ended.id, approved=True)
    live = request_client(make_call(acme_session))
    end_session(ended.id)

    assert services.approvals_close_of_ended_sessions() == 2

    for approval in stranded:
        assert_closed_by_the_system(approval, "disconnected",
                                    {"reason": "session ended", "call": "disconnected"})
    # Approved, its call never recorded an end: the call ends with an
    # event, the decision stands (and no approval was closed).
    assert Approval.objects.get(pk=decided.pk).status == "approved"
    assert last_event(decided).data == {"reason": "session ended", "call": "disconnected"}
    assert call_row(decided)[0] == "disconnected"
    assert Approval.objects.get(pk=live.pk).status == "pending"
    assert services.approvals_close_of_ended_sessions() == 0


def test_the_deadline_sweeper_expires_every_overdue_approval_and_counts_them(acme_session):
    overdue = [request_client(make_call(acme_session)) for _ in range(3)]
    fresh = request_client(make_call(acme_session))
    for approval in overdue:
        make_overdue(approval)

    assert services.approval_expire_overdue() == 3

    for approval in overdue:
        assert_closed_by_the_system(approval, "expired", {"call": "expired"})
        assert call_row(approval)[0] == "expired"
    assert Approval.objects.get(pk=fresh.pk).status == "pending"
    assert services.approval_expire_overdue() == 0


# --- violations ------------------------------------------------------------------------------


def test_an_answer_without_asking_the_user_is_recorded_as_a_violation(payment_call, caplog):
    before = timezone.now()

    approval = services.approval_record_violation(
        tool_call=payment_call, session_id=payment_call.session_id, risk="high",
        reason="tool_result without approval")

    stored = Approval.objects.get(pk=approval.pk)
    assert stored.tool_call_id == payment_call.pk
    assert (stored.tenant_id, stored.session_id) == (payment_call.session.tenant_id,
                                                     payment_call.session_id)
    assert (stored.tool_name, stored.arguments) == ("process_payment", {"amount": 299.98})
    assert stored.args_hash == last_event(approval).args_hash == args_hash(
        "process_payment", {"amount": 299.98})
    assert (stored.status, stored.origin, stored.policy, stored.message) == (
        "violation", "client", "user", "")
    # The call's own risk counts when the page claims a lower one.
    assert stored.risk == "critical"
    assert before <= stored.created_at == stored.deadline == stored.decided_at <= timezone.now()
    event = last_event(approval)
    assert (event.action, event.actor_kind, event.actor, event.channel) == (
        "violation", "page", payment_call.session_id, "page")
    assert event.data == {"reason": "tool_result without approval", "risk": "critical",
                          "call": "denied"}
    call = ToolCall.objects.get(pk=payment_call.pk)
    assert (call.status, call.error) == ("denied", NOT_APPROVED_MESSAGE)
    assert event.call_id == payment_call.call_id
    assert [r.getMessage() for r in caplog.records if r.name == "approvals.services"] == [
        f"session {payment_call.session_id}: call {payment_call.call_id} answered without "
        "approval (tool_result without approval)"]


def test_a_violation_keeps_the_higher_risk_the_page_claims(acme_session):
    call = make_call(acme_session, risk="low")

    approval = services.approval_record_violation(
        tool_call=call, session_id=acme_session.id, risk="high", reason="no request")

    assert approval.risk == "high"


def test_a_violation_is_recorded_only_for_the_session_holding_the_call(payment_call,
                                                                        globex_session):
    with pytest.raises(ApprovalError) as caught:
        services.approval_record_violation(
            tool_call=payment_call, session_id=globex_session.id, risk="high", reason="x")

    assert caught.value.code == "unknown_call"
    assert not Approval.objects.exists()


def test_a_violation_is_never_recorded_for_a_server_call(acme_session):
    call = make_call(acme_session, name="refund", args={"order": "A1"}, origin="server")

    with pytest.raises(ApprovalError) as caught:
        services.approval_record_violation(
            tool_call=call, session_id=acme_session.id, risk="high", reason="x")

    assert caught.value.code == "unknown_call"
    assert not Approval.objects.exists()


def test_a_call_whose_user_was_asked_is_no_violation(payment_call):
    approval = request_client(payment_call)

    with pytest.raises(ApprovalError) as caught:
        services.approval_record_violation(
            tool_call=payment_call, session_id=payment_call.session_id, risk="high", reason="x")

    assert caught.value.code == "already_decided"
    assert list(Approval.objects.values_list("pk", "status")) == [(approval.pk, "pending")]


def test_a_violation_is_recorded_for_a_call_deleted_meanwhile_as_unknown(payment_call):
    ToolCall.objects.filter(pk=payment_call.pk).delete()

    with pytest.raises(ApprovalError) as caught:
        services.approval_record_violation(
            tool_call=payment_call, session_id=payment_call.session_id, risk="high", reason="x")

    assert caught.value.code == "unknown_call"


# --- requests: what an opened, extended or refused request records ---------------------------


def request_with(call, *, tool_name=None, args=None, risk=None):
    return services.approval_request_client(
        tool_call=call, tool_name=tool_name or call.name,
        args=call.arguments if args is None else args, risk=risk or call.risk,
        message="Pay?", session_id=call.session_id, timeout=TIMEOUT,
    )


def test_a_page_request_opens_an_approval_for_exactly_that_call_as_asked_by_the_page(payment_call):
    approval = request_client(payment_call)

    stored = Approval.objects.get(pk=approval.pk)
    assert (stored.tool_name, stored.arguments, stored.policy, stored.origin) == (
        "process_payment", {"amount": 299.98}, "user", "client")
    assert stored.deadline - stored.created_at == timedelta(seconds=TIMEOUT)
    assert ToolCall.objects.get(pk=payment_call.pk).status == "awaiting_approval"
    event = last_event(approval)
    assert (event.action, event.actor_kind, event.actor, event.channel) == (
        "requested", "page", payment_call.session_id, "page")
    assert event.data == {"policy": "user", "risk": "critical"}


def test_a_request_keeps_the_higher_risk_the_page_claims(acme_session):
    call = make_call(acme_session, risk="low")

    approval = request_with(call, risk="high")

    assert approval.risk == "high"
    assert last_event(approval).data == {"policy": "user", "risk": "high"}


def test_a_server_request_is_made_by_the_agent_with_the_tools_own_words(acme_session):
    approval = server_approval(acme_session, "operator")

    assert approval.message == "Allow refund to run? (risk: high)"
    assert Approval.objects.get(pk=approval.pk).policy == "operator"
    event = last_event(approval)
    assert (event.actor_kind, event.actor, event.channel) == ("system", "agent", "system")
    assert event.data == {"policy": "operator", "risk": "high"}


def test_a_code_tool_whose_risk_is_plain_text_keeps_that_risk(acme_session):
    from aitp.tools import ToolSpec
    from approvals.server_tools import ServerToolDef

    spec = ToolSpec(name="wipe", description="Wipe", parameters=None, risk="critical",
                    origin="server")
    tool = ServerToolDef(spec=spec, policy="operator", runner=None)
    call = make_call(acme_session, name="wipe", args={}, risk="low", origin="server")

    approval = services.approval_request_server(tool_call=call, tool=tool, args={},
                                                session_id=acme_session.id, timeout=TIMEOUT)

    assert approval.risk == "critical"


def test_every_event_of_an_approval_names_its_session_call_and_arguments(payment_call):
    approval = approved(payment_call)
    services.approval_record_execution(approval_id=approval.pk, ok=True)

    events = list(AuditEvent.objects.filter(approval_id=approval.pk).order_by("seq"))
    assert [e.action for e in events] == ["requested", "approved", "executed"]
    for event in events:
        assert (event.session_id, event.call_id, event.args_hash, event.tenant_id) == (
            payment_call.session_id, payment_call.call_id, approval.args_hash,
            payment_call.session.tenant_id)


def test_a_second_request_records_the_extended_deadline_as_asked_by_the_page(payment_call):
    first = request_client(payment_call)

    again = request_client(payment_call)

    stored = Approval.objects.get(pk=first.pk)
    assert again.pk == first.pk and stored.deadline >= first.deadline
    event = last_event(first)
    assert (event.action, event.actor_kind, event.actor, event.channel) == (
        "extended", "page", payment_call.session_id, "page")
    assert event.data == {"deadline": stored.deadline.isoformat()}


def test_a_request_for_other_arguments_is_recorded_against_the_open_approval(payment_call, caplog):
    approval = request_client(payment_call)

    with pytest.raises(ApprovalError) as caught:
        request_with(payment_call, args={"amount": 1.0})

    assert (caught.value.code, caught.value.message) == (
        "approval_mismatch", "approval does not match the call's arguments")
    event = last_event(approval)
    assert event.action == "mismatch"
    assert (event.session_id, event.call_id) == (payment_call.session_id, payment_call.call_id)
    assert (event.actor_kind, event.actor, event.channel) == ("page", payment_call.session_id,
                                                              "page")
    assert event.data == {"expected_args_hash": approval.args_hash, "tool": "process_payment"}
    assert [r.getMessage() for r in caplog.records if r.name == "approvals.services"] == [
        f"session {payment_call.session_id}: approval arguments differ from call "
        f"{payment_call.call_id}"]


def test_a_mismatch_before_any_approval_is_recorded_for_the_call_alone(payment_call):
    with pytest.raises(ApprovalError):
        request_with(payment_call, args={"amount": 1.0})

    event = AuditEvent.objects.get(action="mismatch")
    assert event.approval_id is None
    assert (event.session_id, event.call_id) == (payment_call.session_id, payment_call.call_id)


def test_a_mismatch_quotes_at_most_64_characters_of_the_tool_name(payment_call):
    name = "t" * 80

    with pytest.raises(ApprovalError):
        request_with(payment_call, tool_name=name)

    assert AuditEvent.objects.get(action="mismatch").data["tool"] == "t" * 64


@pytest.mark.parametrize(("declared", "echoed"), [
    ({"n": 1000}, {"n": 1000.0}),
    ({"n": 2 ** 53}, {"n": float(2 ** 53)}),
    ({"n": [1, 2]}, {"n": [1.0, 2.0]}),
])
def test_a_whole_number_echoed_by_javascript_is_the_same_argument(acme_session, declared, echoed):
    call = make_call(acme_session, name="add_to_cart", args=declared)

    approval = request_with(call, args=echoed)

    assert approval.status == "pending"


@pytest.mark.parametrize(("declared", "echoed"), [
    ({"n": 2 ** 54}, {"n": float(2 ** 54)}),
    ({"n": ["a"]}, {"n": ["b"]}),
])
def test_a_value_javascript_cannot_echo_exactly_is_a_different_argument(acme_session, declared,
                                                                         echoed):
    call = make_call(acme_session, name="add_to_cart", args=declared)

    with pytest.raises(ApprovalError) as caught:
        request_with(call, args=echoed)

    assert caught.value.code == "approval_mismatch"


# --- executions and reviews ----------------------------------------------------------------------


def approved(call) -> Approval:
    approval = request_client(call)
    return services.approval_decide_user(approval_id=approval.pk, session_id=call.session_id,
                                         approved=True)


def test_a_successful_execution_is_audited_as_the_system_without_an_error(payment_call):
    approval = approved(payment_call)

    services.approval_record_execution(approval_id=approval.pk, ok=True, result={"paid": 299.98})

    event = last_event(approval)
    assert (event.action, event.actor_kind, event.actor, event.channel) == (
        "executed", "system", "system", "system")
    assert event.data == {"call": "success"}
    call = ToolCall.objects.get(pk=payment_call.pk)
    assert (call.status, call.result, call.error) == ("success", {"paid": 299.98}, "")
    assert call.finished_at is not None and call.duration_ms >= 0


def test_a_failed_execution_is_audited_as_the_system_with_its_error(payment_call):
    approval = approved(payment_call)

    services.approval_record_execution(approval_id=approval.pk, ok=False, error="card declined")

    event = last_event(approval)
    assert (event.action, event.actor, event.data) == ("failed", "system",
                                                       {"error": "card declined", "call": "error"})
    assert call_row(approval) == ("error", "card declined", True)


def test_an_execution_that_was_never_approved_is_refused_in_words(payment_call):
    approval = request_client(payment_call)

    with pytest.raises(ApprovalError) as caught:
        services.approval_record_execution(approval_id=approval.pk, ok=True)

    assert (caught.value.code, caught.value.message) == ("not_allowed", "approval was not approved")


def test_a_review_records_who_reviewed_and_when(payment_call, olivia):
    approval = approved(payment_call)
    before = timezone.now()

    services.approval_review(approval_id=approval.pk, user=olivia, verdict="ok")

    stored = Approval.objects.get(pk=approval.pk)
    assert (stored.review_status, stored.review_verdict, stored.review_note) == (
        "reviewed", "ok", "")
    assert stored.reviewed_by == olivia
    assert before <= stored.reviewed_at <= timezone.now()
    event = last_event(approval)
    assert (event.action, event.actor_kind, event.actor, event.channel) == (
        "reviewed", "operator", olivia.get_username(), "admin")
    assert event.data == {"verdict": "ok"}


def test_a_review_from_the_console_is_audited_on_the_console(payment_call, olivia):
    approval = approved(payment_call)

    services.approval_review(approval_id=approval.pk, user=olivia, verdict="concern",
                             note="odd", channel="console")

    event = last_event(approval)
    assert (event.channel, event.data) == ("console", {"verdict": "concern", "note": "odd"})


def test_a_review_with_an_unknown_verdict_is_refused_by_name(payment_call, olivia):
    approval = approved(payment_call)

    with pytest.raises(ValueError, match=r"^unknown review verdict 'great'$"):
        services.approval_review(approval_id=approval.pk, user=olivia, verdict="great")


def test_a_pending_approval_cannot_be_reviewed_and_says_so(payment_call, olivia):
    approval = request_client(payment_call)

    with pytest.raises(ApprovalError) as caught:
        services.approval_review(approval_id=approval.pk, user=olivia, verdict="ok")

    assert caught.value.message == "a pending approval cannot be reviewed"


# --- refusals -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("code", "words"), sorted(ApprovalError.MESSAGES.items()))
def test_each_refusal_code_carries_its_words(code, words):
    error = ApprovalError(code)

    assert (error.code, error.message, str(error)) == (code, words, words)


def test_a_refusal_with_its_own_words_keeps_them():
    error = ApprovalError("not_allowed", "this approval is for the page user")

    assert (error.code, error.message, str(error)) == (
        "not_allowed", "this approval is for the page user", "this approval is for the page user")


def test_a_refusal_code_without_words_is_its_own_words():
    error = ApprovalError("teapot")

    assert (error.message, str(error)) == ("teapot", "teapot")


# --- risk and policy ----------------------------------------------------------------------------


@pytest.mark.parametrize(("risks", "higher"), [
    (("low", "high"), "high"),
    (("critical", "high"), "critical"),
    (("none", "low"), "low"),
    ((Risk.HIGH, "low"), "high"),
    (("none", Risk.CRITICAL), "critical"),
    ((Risk.LOW, Risk.NONE), "low"),
])
def test_the_higher_of_two_risks_is_kept_whichever_way_it_is_spelled(risks, higher):
    assert higher_risk(*risks) == higher


@pytest.mark.parametrize(("policy", "parties"), [
    ("user", (True, False)),
    ("operator", (False, True)),
    ("user_and_operator", (True, True)),
])
def test_a_policy_names_exactly_the_parties_who_must_approve(policy, parties):
    assert policy_parties(policy) == parties


def test_an_unknown_policy_names_no_parties():
    with pytest.raises(ValueError):
        policy_parties("anyone")


# --- a call that has an approval ends with the approval's event -----------------------------


def test_a_session_closed_for_its_gone_process_ends_its_approvals_calls_with_their_events(
        acme_session):
    from aitp import services as aitp_services

    Session.objects.filter(pk=acme_session.pk).update(process="test:gone")
    waiting = request_client(make_call(acme_session))
    running = server_approval(acme_session, "user")
    services.approval_decide_user(approval_id=running.pk, session_id=acme_session.id,
                                  approved=True)
    plain = make_call(acme_session, name="add_to_cart", args={}, risk="low")

    aitp_services.sessions_close_of_processes(process_ids=["test:gone"], code=1006,
                                              reason="server process lost")

    reason = {"reason": "server process lost", "call": "disconnected"}
    assert_closed_by_the_system(waiting, "disconnected", reason)
    assert call_row(waiting)[0] == "disconnected"
    # Approved and running when its process went: the decision stands.
    assert Approval.objects.get(pk=running.pk).status == "approved"
    assert (last_event(running).action, last_event(running).data) == ("disconnected", reason)
    assert call_row(running)[0] == "disconnected"
    # A call without an approval ends with the session, as before.
    plain.refresh_from_db()
    assert plain.status == "disconnected"
    assert Session.objects.get(pk=acme_session.pk).ended_at is not None


def audit_append_fails(monkeypatch) -> None:
    def append_event(**fields):
        raise RuntimeError("the audit append failed")

    monkeypatch.setattr("approvals.services.append_event", append_event)


def record_of(approval: Approval) -> tuple:
    """The call's row, the approval's status and its events, as they stand."""
    return (call_row(approval), Approval.objects.get(pk=approval.pk).status,
            list(AuditEvent.objects.filter(approval_id=approval.pk).values_list("action", "data")))


ENDINGS_OF_APPROVED = {
    "executed": lambda a: services.approval_record_execution(approval_id=a.pk, ok=True,
                                                             result={"paid": True}),
    "failed": lambda a: services.approval_record_execution(approval_id=a.pk, ok=False,
                                                           error="card declined"),
}
ENDINGS_OF_PENDING = {
    "expired": lambda a: services.approval_expire(approval_id=a.pk),
    "cancelled": lambda a: services.approval_close(approval_id=a.pk, status="cancelled"),
    "disconnected": lambda a: services.approval_close(approval_id=a.pk, status="disconnected"),
}


@pytest.mark.parametrize("ending", sorted(ENDINGS_OF_APPROVED))
def test_a_run_whose_audit_cannot_be_written_leaves_the_call_open_too(payment_call, monkeypatch,
                                                                      ending):
    approval = approved(payment_call)
    before = record_of(approval)
    audit_append_fails(monkeypatch)

    with pytest.raises(RuntimeError, match="the audit append failed"):
        ENDINGS_OF_APPROVED[ending](approval)

    assert record_of(approval) == before
    assert before[0][0] == "awaiting_approval"


@pytest.mark.parametrize("ending", sorted(ENDINGS_OF_PENDING))
def test_an_ending_whose_audit_cannot_be_written_leaves_the_call_open_too(payment_call,
                                                                          monkeypatch, ending):
    approval = request_client(payment_call)
    before = record_of(approval)
    audit_append_fails(monkeypatch)

    with pytest.raises(RuntimeError, match="the audit append failed"):
        ENDINGS_OF_PENDING[ending](approval)

    assert record_of(approval) == before
    assert before[0][0] == "awaiting_approval" and before[1] == "pending"


def test_a_sweep_whose_audit_cannot_be_written_closes_neither_session_nor_call(acme_session,
                                                                               monkeypatch):
    from aitp import services as aitp_services

    Session.objects.filter(pk=acme_session.pk).update(process="test:gone")
    approval = request_client(make_call(acme_session))
    before = record_of(approval)
    audit_append_fails(monkeypatch)

    with pytest.raises(RuntimeError, match="the audit append failed"):
        aitp_services.sessions_close_of_processes(process_ids=["test:gone"], code=1006,
                                                  reason="server process lost")

    assert record_of(approval) == before
    assert Session.objects.get(pk=acme_session.pk).ended_at is None
