"""Operator actions from the session page: each recorded, each scoped to the operator's tenants."""
from __future__ import annotations

import pytest
from django.test import Client
from django.urls import reverse

from aitp import store
from aitp.models import OperatorAction
from approvals.models import Approval, AuditEvent
from operators.forms import redirect_target_error
from tests.operators.conftest import operator_approval

pytestmark = pytest.mark.django_db


def command_url(session) -> str:
    return reverse("operators:live_session_command", args=[session.pk])


def decide_url(session, approval) -> str:
    return reverse("operators:live_approval_decide", args=[session.pk, approval.pk])


def test_ending_a_session_records_an_operator_action_and_notifies_its_process(
    client, olivia, acme_session, sent, django_capture_on_commit_callbacks
):
    client.force_login(olivia)
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(command_url(acme_session), {"command": "end", "message": "bye"})
    assert response.status_code == 302 and response["Location"] == "/admin/live/ses_acme/"
    action = OperatorAction.objects.get(session=acme_session)
    assert (action.action, action.user, action.tenant_id) == ("session_end", olivia, acme_session.tenant_id)
    assert action.data["message"] == "bye" and action.data["channel"] == "admin"
    assert sent == [("ses_acme", "end", {"url": "", "message": "bye"})]


def test_a_redirect_carries_its_url_to_the_page(
    client, olivia, acme_session, sent, django_capture_on_commit_callbacks
):
    client.force_login(olivia)
    with django_capture_on_commit_callbacks(execute=True):
        client.post(command_url(acme_session), {"command": "redirect", "url": "/checkout"})
    assert sent == [("ses_acme", "redirect", {"url": "/checkout", "message": ""})]
    assert OperatorAction.objects.get(session=acme_session).data["url"] == "/checkout"


def test_a_reload_is_recorded_without_a_url(client, olivia, acme_session, sent,
                                            django_capture_on_commit_callbacks):
    client.force_login(olivia)
    with django_capture_on_commit_callbacks(execute=True):
        client.post(command_url(acme_session), {"command": "reload", "url": "/ignored"})
    assert sent == [("ses_acme", "reload", {"url": "", "message": ""})]
    assert OperatorAction.objects.get(session=acme_session).action == "session_reload"


@pytest.mark.parametrize("url", ["", "javascript:alert(1)", "//evil.example/x", "data:text/html,hi"])
def test_a_redirect_to_an_unusable_url_is_refused_and_not_recorded(client, olivia, acme_session,
                                                                  sent, url):
    client.force_login(olivia)
    response = client.post(command_url(acme_session), {"command": "redirect", "url": url},
                           follow=True)
    assert "Not sent" in response.content.decode()
    assert not OperatorAction.objects.exists()
    assert sent == []


def test_an_unknown_command_is_refused(client, olivia, acme_session, sent):
    client.force_login(olivia)
    client.post(command_url(acme_session), {"command": "approval_decided"})
    assert not OperatorAction.objects.exists()
    assert sent == []


def test_an_operator_cannot_act_on_another_tenants_session(client, olivia, globex_session, sent):
    client.force_login(olivia)
    response = client.post(command_url(globex_session), {"command": "end"})
    assert response.status_code == 404
    assert not OperatorAction.objects.exists()
    assert sent == []


def test_an_ended_session_takes_no_more_commands(client, olivia, acme_session, sent):
    store.current().session_close(session_id=acme_session.id, code=1000)
    client.force_login(olivia)
    response = client.post(command_url(acme_session), {"command": "end"}, follow=True)
    assert "already ended" in response.content.decode()
    assert not OperatorAction.objects.exists()


def test_commands_are_posts_only(client, olivia, acme_session):
    client.force_login(olivia)
    assert client.get(command_url(acme_session)).status_code == 405


def test_a_command_without_the_csrf_token_is_refused(olivia, acme_session, sent):
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(olivia)
    response = browser.post(command_url(acme_session), {"command": "end"})
    assert response.status_code == 403
    assert not OperatorAction.objects.exists()


# --- approvals ---------------------------------------------------------------------


def test_an_operator_approves_from_the_session_page_with_a_note(
    client, olivia, acme_session, sent, django_capture_on_commit_callbacks
):
    approval = operator_approval(acme_session)
    client.force_login(olivia)
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(decide_url(acme_session, approval),
                               {"decision": "approve", "note": "checked the order"})
    assert response.status_code == 302 and response["Location"] == "/admin/live/ses_acme/"
    approval.refresh_from_db()
    assert approval.status == Approval.Status.APPROVED
    assert (approval.operator, approval.operator_note) == (olivia, "checked the order")
    event = AuditEvent.objects.filter(approval_id=approval.pk).order_by("-seq").first()
    assert (event.action, event.actor, event.channel) == ("approved", "olivia", "admin")
    assert OperatorAction.objects.get(session=acme_session).action == "approval_approved"
    # The process holding the session is told to read the decision.
    assert sent == [("ses_acme", "approval_decided", {"approval_id": approval.pk})]


def test_an_operator_denies_from_the_session_page(client, olivia, acme_session, sent):
    approval = operator_approval(acme_session)
    client.force_login(olivia)
    client.post(decide_url(acme_session, approval), {"decision": "deny"})
    approval.refresh_from_db()
    assert approval.status == Approval.Status.DENIED and approval.operator == olivia


def test_a_second_decision_is_refused_with_a_message(client, olivia, root, acme_session, sent):
    from approvals import services as approval_services

    approval = operator_approval(acme_session)
    approval_services.approval_decide_operator(approval_id=approval.pk, user=root, approved=False)
    client.force_login(olivia)
    response = client.post(decide_url(acme_session, approval), {"decision": "approve"}, follow=True)
    assert "Not recorded: approval already decided." in response.content.decode()
    approval.refresh_from_db()
    assert approval.status == Approval.Status.DENIED and approval.operator == root


def test_an_approval_of_another_tenant_cannot_be_decided_through_an_own_session(
    client, olivia, acme_session, globex_session, sent
):
    foreign = operator_approval(globex_session)
    client.force_login(olivia)
    assert client.post(decide_url(acme_session, foreign), {"decision": "approve"}).status_code == 404
    assert client.post(decide_url(globex_session, foreign), {"decision": "approve"}).status_code == 404
    foreign.refresh_from_db()
    assert foreign.status == Approval.Status.PENDING and foreign.operator_decision is None


# --- the redirect target rule (pure) ---------------------------------------------


@pytest.mark.parametrize("url", ["/checkout", "/search?q=a%20b", "https://shop.example/cart",
                                 "http://127.0.0.1:8000/"])
def test_paths_and_web_addresses_are_usable_redirect_targets(url):
    assert redirect_target_error(url) is None


@pytest.mark.parametrize("url", ["javascript:alert(1)", "//evil.example", "cart", "https://",
                                 "/a b", "/a\nb", "ftp://files.example/x"])
def test_other_redirect_targets_are_refused(url):
    assert redirect_target_error(url) is not None
