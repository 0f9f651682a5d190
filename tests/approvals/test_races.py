"""Racing answers on separate connections: the chain lock makes the first one win."""
from __future__ import annotations

import threading

import pytest
from django.db import connection

from approvals import services
from approvals.audit import verify_chain
from approvals.models import Approval, AuditEvent
from approvals.services import ApprovalError

pytestmark = pytest.mark.django_db(transaction=True)


def race(*calls) -> list:
    """Run each call on its own thread and connection, released together; returns
    each call's result or the exception it raised."""
    barrier = threading.Barrier(len(calls))
    outcomes: list = [None] * len(calls)

    def run(index, call) -> None:
        try:
            barrier.wait()
            outcomes[index] = call()
        except Exception as exc:  # the outcome under test
            outcomes[index] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(i, c)) for i, c in enumerate(calls)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return outcomes


def test_of_two_simultaneous_answers_exactly_one_is_recorded(payment_call):
    approval = services.approval_request_client(
        tool_call=payment_call, tool_name=payment_call.name, args=payment_call.arguments,
        risk="critical", message="Pay?", session_id="ses_acme", timeout=120,
    )

    outcomes = race(
        lambda: services.approval_decide_user(approval_id=approval.pk, session_id="ses_acme",
                                              approved=True),
        lambda: services.approval_decide_user(approval_id=approval.pk, session_id="ses_acme",
                                              approved=False),
    )

    winners = [o for o in outcomes if isinstance(o, Approval)]
    losers = [o for o in outcomes if isinstance(o, ApprovalError)]
    assert len(winners) == 1 and [e.code for e in losers] == ["already_decided"]
    approval.refresh_from_db()
    assert approval.status == winners[0].status
    decisions = AuditEvent.objects.filter(approval_id=approval.pk, action__in=["approved", "denied"])
    assert decisions.count() == 1
    assert verify_chain().ok


def test_an_answer_racing_the_expiry_either_wins_or_is_refused(payment_call):
    approval = services.approval_request_client(
        tool_call=payment_call, tool_name=payment_call.name, args=payment_call.arguments,
        risk="critical", message="Pay?", session_id="ses_acme", timeout=120,
    )

    outcomes = race(
        lambda: services.approval_decide_user(approval_id=approval.pk, session_id="ses_acme",
                                              approved=True),
        lambda: services.approval_expire(approval_id=approval.pk),
    )

    approval.refresh_from_db()
    answer = outcomes[0]
    if isinstance(answer, ApprovalError):
        assert answer.code == "already_decided" and approval.status == "expired"
    else:
        assert approval.status == "approved"
    assert outcomes[1].status == approval.status
    assert verify_chain().ok
