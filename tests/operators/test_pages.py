"""The live pages in the admin: who sees which sessions, and what a session page shows."""
from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from aitp import services, store
from aitp.models import ConversationMessage, OperatorAction, Session
from tests.operators.conftest import make_call, make_session, operator_approval

pytestmark = pytest.mark.django_db

LIST_URL = "/admin/live/"


def session_url(session) -> str:
    return reverse("operators:live_session", args=[session.pk])


def listed_ids(response) -> list[str]:
    return [row["id"] for row in response.context["rows"]]


def test_the_live_list_is_mounted_under_the_admin():
    assert reverse("operators:live_list") == LIST_URL


def test_an_anonymous_visitor_is_sent_to_the_admin_login(client, acme_session):
    response = client.get(LIST_URL)
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("admin:login"))


def test_a_member_without_staff_status_is_sent_to_the_admin_login(client, carl, acme_session):
    client.force_login(carl)
    response = client.get(session_url(acme_session))
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("admin:login"))


def test_an_operator_sees_only_the_live_sessions_of_her_tenants(
    client, olivia, acme_session, globex_session
):
    client.force_login(olivia)
    response = client.get(LIST_URL)
    assert response.status_code == 200
    assert listed_ids(response) == ["ses_acme"]
    assert b"ses_globex" not in response.content


def test_a_superuser_sees_the_live_sessions_of_every_tenant(client, root, acme_session, globex_session):
    client.force_login(root)
    response = client.get(LIST_URL)
    assert sorted(listed_ids(response)) == ["ses_acme", "ses_globex"]


def test_ended_sessions_and_sessions_of_a_silent_process_are_not_listed(client, olivia, acme):
    live = make_session(acme)
    ended = make_session(acme)
    store.current().session_close(session_id=ended.id, code=1000)
    silent = make_session(acme)
    Session.objects.filter(pk=silent.pk).update(last_seen_at=timezone.now() - timedelta(hours=1))
    client.force_login(olivia)
    assert listed_ids(client.get(LIST_URL)) == [live.id]


def test_a_row_carries_what_the_list_shows(client, olivia, acme_session):
    Session.objects.filter(pk=acme_session.pk).update(
        state=Session.State.WAITING_APPROVAL, turns=3, input_tokens=120, output_tokens=30,
        origin="https://shop.example",
    )
    client.force_login(olivia)
    row = client.get(LIST_URL).context["rows"][0]
    assert row["tenant"] == "acme"
    assert row["key"] == "web"
    assert row["origin"] == "https://shop.example"
    assert (row["url"], row["title"]) == ("/cart", "Your cart")
    assert (row["state"], row["state_label"]) == ("waiting_approval", "Waiting for approval")
    assert (row["turns"], row["total_tokens"]) == (3, 150)
    assert row["live"] is True
    assert row["detail_url"] == "/admin/live/ses_acme/"
    assert row["started_at"] and row["last_activity_at"]


def test_the_list_page_tells_its_script_where_the_watch_socket_is(client, olivia):
    client.force_login(olivia)
    response = client.get(LIST_URL)
    assert response.context["config"]["watchPath"] == "/ws/operators/"
    assert b'id="live-config"' in response.content


def test_the_admin_index_links_to_the_live_sessions(client, olivia):
    client.force_login(olivia)
    entry = reverse("admin:operators_livesession_changelist")
    assert entry.encode() in client.get(reverse("admin:index")).content
    response = client.get(entry)
    assert response.status_code == 302 and response["Location"] == LIST_URL


def test_an_operator_gets_404_for_another_tenants_session(client, olivia, globex_session):
    client.force_login(olivia)
    assert client.get(session_url(globex_session)).status_code == 404
    panel = reverse("operators:live_session_panel", args=[globex_session.pk])
    assert client.get(panel).status_code == 404


def test_an_unknown_session_id_is_a_404(client, root):
    client.force_login(root)
    assert client.get("/admin/live/ses_nope/").status_code == 404


def test_the_session_page_of_a_live_session_offers_the_actions_and_the_live_feed(
    client, olivia, acme_session
):
    client.force_login(olivia)
    response = client.get(session_url(acme_session))
    assert response.status_code == 200
    assert response.context["config"]["live"] is True
    assert response.context["config"]["sessionId"] == "ses_acme"
    content = response.content.decode()
    assert 'id="command-end"' in content and 'id="command-redirect"' in content
    assert 'id="live-feed"' in content


def test_an_ended_session_is_a_replay_of_its_record(client, olivia, acme_session, django_user_model):
    ConversationMessage.objects.create(session=acme_session, seq=1, turn=1, role="user",
                                       content=[{"type": "text", "text": "refund order A1"}])
    ConversationMessage.objects.create(session=acme_session, seq=2, turn=1, role="assistant", content=[
        {"type": "text", "text": "Let me check."},
        {"type": "tool_use", "id": "toolu_1", "name": "refund", "input": {"order": "A1"}},
    ])
    ConversationMessage.objects.create(session=acme_session, seq=3, turn=1, role="user", content=[
        {"type": "tool_result", "tool_use_id": "toolu_1", "content": "refunded", "is_error": False},
    ])
    make_call(acme_session, name="refund", status="success", result={"refunded": True},
              duration_ms=412)
    store.current().session_write_live(
        session_id=acme_session.id,
        snapshot={"url": "/orders/A1", "title": "Order A1", "context": {}, "tools": []},
    )
    services.session_command(session=acme_session, user=olivia, command="reload")
    store.current().session_close(session_id=acme_session.id, code=1000)

    client.force_login(olivia)
    response = client.get(session_url(acme_session))
    assert response.context["config"]["live"] is False
    content = response.content.decode()
    assert 'id="command-end"' not in content and 'id="live-feed"' not in content
    # The conversation in order, each kind of block shown.
    assert content.index("refund order A1") < content.index("Let me check.") < content.index("refunded")
    assert "calls refund" in content
    # The ledger, the navigation, and what operators did.
    assert "412 ms" in content and "&quot;refunded&quot;: true" in content
    assert "/orders/A1" in content
    assert "Page reloaded" in content and "session_reload" not in content


def test_the_session_page_shows_each_approval_and_who_decided_it(client, olivia, acme_session):
    from approvals import services as approval_services

    approval = operator_approval(acme_session)
    approval_services.approval_decide_operator(
        approval_id=approval.pk, user=olivia, approved=False, note="customer disputes it"
    )
    client.force_login(olivia)
    content = client.get(session_url(acme_session)).content.decode()
    assert f'id="approval-{approval.pk}"' in content
    assert "Denied by olivia" in content
    assert "customer disputes it" in content
    # Its audit trail: requested, then denied by an operator through the admin.
    assert "Requested" in content and "Operator: olivia" in content
    # Decided: no decision form any more.
    assert f'id="pending-approval-{approval.pk}"' not in content


def test_a_pending_operator_approval_gets_a_decision_form(client, olivia, acme_session):
    approval = operator_approval(acme_session)
    client.force_login(olivia)
    content = client.get(session_url(acme_session)).content.decode()
    decide = reverse("operators:live_approval_decide", args=[acme_session.pk, approval.pk])
    assert f'id="pending-approval-{approval.pk}"' in content
    assert f'action="{decide}"' in content
    assert 'name="csrfmiddlewaretoken"' in content


def test_the_panel_is_the_record_alone(client, olivia, acme_session):
    client.force_login(olivia)
    response = client.get(reverse("operators:live_session_panel", args=[acme_session.pk]))
    assert response.status_code == 200
    content = response.content.decode()
    assert 'id="session-facts"' in content and 'data-live="true"' in content
    assert "<html" not in content


def test_a_session_continued_on_new_sockets_lists_each_socket_on_its_panel(client, olivia, acme_session):
    start = acme_session.started_at
    Session.objects.filter(pk=acme_session.pk).update(
        resumes=1, socket_opened_at=start + timedelta(minutes=2), earlier_sockets=[
            {"opened_at": start.isoformat(), "closed_at": (start + timedelta(minutes=1)).isoformat(),
             "code": 1001, "reason": "client disconnected"}])
    client.force_login(olivia)

    content = client.get(reverse("operators:live_session_panel", args=[acme_session.pk])).content.decode()

    assert "continued 1 time after a reload or a dropped connection" in content
    sockets = re.findall(r"<li>(.*?)</li>", content.split('class="sockets"')[1], re.S)
    assert len(sockets) == 2
    assert "(code 1001: client disconnected)" in sockets[0] and sockets[1].endswith("open")


def test_a_session_never_continued_shows_no_sockets(client, olivia, acme_session):
    client.force_login(olivia)
    content = client.get(reverse("operators:live_session_panel", args=[acme_session.pk])).content.decode()
    assert 'class="sockets"' not in content


def test_operator_actions_are_listed_with_their_author(client, olivia, root, acme_session):
    services.session_command(session=acme_session, user=root, command="redirect", url="/help",
                             message="see this")
    client.force_login(olivia)
    content = client.get(session_url(acme_session)).content.decode()
    assert "Page sent elsewhere" in content and "session_redirect" not in content
    assert "channel: admin; message: see this; url: /help" in content
    assert OperatorAction.objects.filter(session=acme_session).count() == 1
