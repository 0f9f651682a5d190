"""What waits for a person, counted in every admin page's header: live
sessions whose agent asked for a person that nobody has taken over yet, and
approvals waiting for an operator's decision, each in the tenants the user
may see."""
from __future__ import annotations

from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from aitp import store
from aitp.models import Session
from operators import handover
from operators.selectors import alert_counts, session_row, visible_sessions
from tests.operators.conftest import make_call, make_user

pytestmark = pytest.mark.django_db

ALERTS_URL = "/admin/live/alerts/"
NOTHING = {"waiting": 0, "approvals": 0}


def waiting_for_a_person(session, reason="wants a refund"):
    Session.objects.filter(pk=session.pk).update(handoff_requested_at=timezone.now(), handoff_reason=reason)
    session.refresh_from_db()
    return session


def server_approval(session, *, policy="operator", name="refund"):
    """A pending approval of a server tool with this approval policy."""
    from approvals import services
    from approvals.models import ServerTool

    tool = ServerTool.objects.create(
        tenant=session.tenant, name=name, risk="high", kind=ServerTool.Kind.WEBHOOK,
        webhook_url="http://127.0.0.1:9/refund", approval_policy=policy,
    )
    call = make_call(session, name=name, args={"order": "A1"})
    return services.approval_request_server(
        tool_call=call, tool=tool, args={"order": "A1"}, session_id=session.id, timeout=120.0)


# --- the counts ------------------------------------------------------------------


def test_a_session_waiting_for_a_person_is_counted_for_its_tenant_only(olivia, mallory, acme_session, globex):
    waiting_for_a_person(acme_session)
    assert alert_counts(olivia) == {"waiting": 1, "approvals": 0}
    assert alert_counts(mallory) == NOTHING


def test_a_superuser_counts_every_tenants_sessions_and_approvals(root, acme_session, globex_session):
    waiting_for_a_person(acme_session)
    waiting_for_a_person(globex_session)
    server_approval(globex_session)
    assert alert_counts(root) == {"waiting": 2, "approvals": 1}


def test_a_viewer_sees_the_counts_of_her_tenant(acme, acme_session):
    viewer = make_user("vera", tenant=acme, role="viewer")
    waiting_for_a_person(acme_session)
    server_approval(acme_session)
    assert alert_counts(viewer) == {"waiting": 1, "approvals": 1}


def test_a_session_nobody_asked_a_person_for_is_not_counted(olivia, acme_session):
    assert alert_counts(olivia) == NOTHING


def test_an_ended_session_is_not_counted(olivia, acme_session):
    waiting_for_a_person(acme_session)
    store.current().session_close(session_id=acme_session.id, code=1000)
    assert alert_counts(olivia) == NOTHING


def test_a_session_of_a_silent_process_is_not_counted(olivia, acme_session):
    waiting_for_a_person(acme_session)
    Session.objects.filter(pk=acme_session.pk).update(last_seen_at=timezone.now() - timedelta(hours=1))
    assert alert_counts(olivia) == NOTHING


def test_a_session_an_operator_took_over_is_not_counted(olivia, acme_session):
    waiting_for_a_person(acme_session)
    assert handover.session_take_over(session=acme_session, user=olivia).taken
    assert alert_counts(olivia) == NOTHING


def test_an_approval_an_operator_must_decide_is_counted_for_its_tenant_only(olivia, mallory, acme_session):
    server_approval(acme_session)
    assert alert_counts(olivia) == {"waiting": 0, "approvals": 1}
    assert alert_counts(mallory) == NOTHING


def test_an_approval_the_page_user_and_an_operator_decide_is_counted(olivia, acme_session):
    server_approval(acme_session, policy="user_and_operator")
    assert alert_counts(olivia)["approvals"] == 1


def test_an_approval_only_the_page_user_decides_is_not_counted(olivia, acme_session):
    server_approval(acme_session, policy="user")
    assert alert_counts(olivia) == NOTHING


def test_a_decided_approval_is_not_counted(olivia, acme_session):
    from approvals import services

    approval = server_approval(acme_session)
    services.approval_decide_operator(approval_id=approval.pk, user=olivia, approved=True)
    assert alert_counts(olivia) == NOTHING


def test_an_approval_past_its_deadline_is_not_counted(olivia, acme_session):
    from approvals.models import Approval

    approval = server_approval(acme_session)
    Approval.objects.filter(pk=approval.pk).update(deadline=timezone.now() - timedelta(seconds=1))
    assert alert_counts(olivia) == NOTHING


def test_the_counts_take_two_queries_at_most(olivia, root, acme_session, django_assert_max_num_queries):
    waiting_for_a_person(acme_session)
    server_approval(acme_session)
    with django_assert_max_num_queries(2):
        assert alert_counts(olivia) == {"waiting": 1, "approvals": 1}
    with django_assert_max_num_queries(1):
        assert alert_counts(root) == {"waiting": 1, "approvals": 1}


def test_a_staff_member_of_no_tenant_counts_nothing(acme_session):
    waiting_for_a_person(acme_session)
    assert alert_counts(make_user("nobody")) == NOTHING


# --- the live list's rows --------------------------------------------------------------


def test_a_row_says_the_session_waits_for_a_person_and_why(olivia, acme_session):
    waiting_for_a_person(acme_session, reason="wants a refund")
    row = session_row(visible_sessions(olivia).get(pk=acme_session.pk))
    assert row["handoff_reason"] == "wants a refund"
    assert row["handoff_requested_at"] == acme_session.handoff_requested_at.isoformat()


def test_a_row_of_a_session_nobody_waits_for_says_none(olivia, acme_session):
    row = session_row(visible_sessions(olivia).get(pk=acme_session.pk))
    assert (row["handoff_requested_at"], row["handoff_reason"]) == (None, "")


# --- the endpoint ----------------------------------------------------------------


def test_the_counts_are_at_alerts_not_taken_for_a_session_id():
    assert reverse("operators:live_alerts") == ALERTS_URL


def test_the_endpoint_answers_the_counts_and_where_each_is_dealt_with(client, olivia, acme_session, globex_session):
    waiting_for_a_person(acme_session)
    waiting_for_a_person(globex_session)
    server_approval(acme_session)
    client.force_login(olivia)
    answer = client.get(ALERTS_URL)
    assert answer.status_code == 200
    assert answer.json() == {
        "waiting": 1, "approvals": 1, "live_url": "/admin/live/",
        "approvals_url": reverse("admin:approvals_pendingapproval_changelist"),
    }
    # Read every few seconds: never an answer kept from before.
    assert "no-cache" in answer["Cache-Control"]


def test_the_endpoint_sends_an_anonymous_visitor_to_the_admin_login(client):
    answer = client.get(ALERTS_URL)
    assert answer.status_code == 302
    assert answer["Location"].startswith(reverse("admin:login"))


def test_the_endpoint_sends_a_member_without_staff_status_to_the_admin_login(client, carl, acme_session):
    waiting_for_a_person(acme_session)
    client.force_login(carl)
    answer = client.get(ALERTS_URL)
    assert answer.status_code == 302
    assert answer["Location"].startswith(reverse("admin:login"))


# --- the badge -------------------------------------------------------------------


def test_every_admin_page_carries_the_badge_that_reads_the_endpoint(client, olivia):
    client.force_login(olivia)
    for url in (reverse("admin:index"), "/admin/live/", reverse("admin:approvals_pendingapproval_changelist")):
        content = client.get(url).content.decode()
        assert 'id="alert-counts"' in content, url
        assert f'data-url="{ALERTS_URL}"' in content and 'data-every-seconds="5"' in content
        assert 'src="/static/owllayer/admin-alerts.js"' in content
        assert f'href="{reverse("admin:approvals_pendingapproval_changelist")}"' in content


def test_the_login_page_has_no_badge(client):
    assert 'id="alert-counts"' not in client.get(reverse("admin:login")).content.decode()


def test_the_badges_script_is_served(client):
    answer = client.get("/static/owllayer/admin-alerts.js")
    assert answer.status_code == 200
    body = b"".join(answer.streaming_content if answer.streaming else [answer.content])
    assert b"alert-counts" in body
