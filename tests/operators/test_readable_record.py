"""What operators read: the user's words apart from the page they were on,
one time format per page, actions and decisions told in sentences, the review
queue moving on after a verdict, and a built-in server tool without the
webhook's fields."""
from __future__ import annotations

import json
import re

import pytest
from django.urls import reverse

from aitp import services
from aitp.models import ConversationMessage
from approvals import services as approval_services
from approvals.models import Approval, ServerTool
from demo.order_tools import demo_tools_install
from tests.operators.conftest import make_call, operator_approval

pytestmark = pytest.mark.django_db

PAGE_BLOCK = "[page]\nurl: /cart\ntitle: Your cart\ncontext: " + json.dumps(
    {"cart": {"items": 2}, "secret_marker": "ctx-7"}, sort_keys=True)


def user_message_with_page(session) -> None:
    ConversationMessage.objects.create(session=session, seq=1, turn=1, role="user", content=[
        {"type": "text", "text": PAGE_BLOCK},
        {"type": "text", "text": "where is my order?"},
    ])


def session_page(client, user, session) -> str:
    client.force_login(user)
    return client.get(reverse("operators:live_session", args=[session.pk])).content.decode()


def words_blocks(html: str) -> list[str]:
    """The text of every block that is not a detail one opens."""
    return re.findall(r'<div class="turn-block kind-text">\s*<pre>(.*?)</pre>', html, re.S)


def test_the_session_page_shows_the_users_words_and_the_page_as_a_detail(client, olivia, acme_session):
    user_message_with_page(acme_session)

    html = session_page(client, olivia, acme_session)

    assert words_blocks(html) == ["where is my order?"]
    detail = re.search(r'<details class="turn-block kind-page">(.*?)</details>', html, re.S).group(1)
    assert "on Your cart" in detail and "/cart" in detail and "ctx-7" in detail
    assert "[page]" not in html and "context: {" not in html


def test_the_session_page_shows_a_failed_turns_error_code_under_its_question(client, olivia, acme_session):
    ConversationMessage.objects.create(session=acme_session, seq=1, turn=1, role="user", content=[
        {"type": "text", "text": "where is my order?"},
        {"type": "turn_error", "code": "auth_failed",
         "message": "The assistant is not set up correctly on this server."},
    ])

    html = session_page(client, olivia, acme_session)

    assert words_blocks(html) == ["where is my order?"]
    failed = re.search(r'<div class="turn-block kind-error">(.*?)</div>\s*</div>', html, re.S).group(1)
    assert "turn failed: auth_failed" in failed
    assert "not set up correctly" in failed


def test_the_approval_page_shows_the_users_words_and_the_page_as_a_detail(client, olivia, acme_session):
    user_message_with_page(acme_session)
    approval = operator_approval(acme_session)
    client.force_login(olivia)

    html = client.get(reverse("admin:approvals_approval_change", args=[approval.pk])).content.decode()

    assert words_blocks(html) == ["where is my order?"]
    assert '<details class="turn-block kind-page">' in html and "[page]" not in html


def test_every_time_on_the_session_page_is_one_format_with_the_full_time_on_hover(
    client, olivia, acme_session
):
    user_message_with_page(acme_session)
    operator_approval(acme_session)
    services.session_command(session=acme_session, user=olivia, command="reload")

    html = session_page(client, olivia, acme_session)

    # settings.DATETIME_FORMAT with its zone on hover; shown in full, or as
    # the time of day to the second on a line of the record.
    times = re.findall(r'<time datetime="[^"]+" title="(\d{1,2} [A-Z][a-z]{2} \d{4}, (\d\d:\d\d)) UTC">'
                       r'([^<]+)</time>', html)
    assert len(times) >= 5  # started, last activity, the message, the call, the action...
    assert all(shown in (full, ) or shown.startswith(hour + ":") for full, hour, shown in times), times
    assert any(shown == full for full, _hour, shown in times)  # started
    assert not re.search(r"\b[ap]\.m\.", html), "Django's default date format is not used"


def test_recorded_actions_and_audit_events_are_words_not_codes(client, olivia, acme_session):
    services.session_command(session=acme_session, user=olivia, command="end", message="bye")
    approval = operator_approval(acme_session)
    approval_services.approval_decide_operator(approval_id=approval.pk, user=olivia, approved=False)

    html = session_page(client, olivia, acme_session)

    assert "Session ended" in html and "Denied a tool call" in html
    assert ">session_end<" not in html and ">approval_denied<" not in html
    assert ">Requested<" in html and ">Admin<" in html


@pytest.mark.parametrize("approved, sentence", [
    (True, "Approved: refund runs now."),
    (False, "Denied: refund will not run, and the agent is told an operator declined it."),
])
def test_a_decision_is_told_in_a_sentence(client, olivia, acme_session, approved, sentence):
    approval = operator_approval(acme_session)
    client.force_login(olivia)

    page = client.post(reverse("operators:live_approval_decide", args=[acme_session.pk, approval.pk]),
                       {"decision": "approve" if approved else "deny"}, follow=True)

    assert sentence in page.content.decode()
    assert "the approval is now" not in page.content.decode()


def test_a_command_is_told_in_a_sentence(client, olivia, acme_session):
    client.force_login(olivia)

    page = client.post(reverse("operators:live_session_command", args=[acme_session.pk]),
                       {"command": "reload"}, follow=True)

    assert "The page user&#x27;s page is reloading." in page.content.decode()
    assert "Sent reload" not in page.content.decode()


# --- the review queue ---------------------------------------------------------------


def decided(session) -> Approval:
    """A risky call's approval that ran out: it waits in the review queue."""
    tool, _ = ServerTool.objects.get_or_create(
        tenant=session.tenant, name="refund",
        defaults={"risk": "high", "kind": ServerTool.Kind.WEBHOOK,
                  "webhook_url": "http://127.0.0.1:9/refund", "approval_policy": "operator"},
    )
    call = make_call(session, name="refund", args={"order": "A1"}, risk="high")
    approval = approval_services.approval_request_server(
        tool_call=call, tool=tool, args={"order": "A1"}, session_id=session.id, timeout=120.0)
    approval_services.approval_expire(approval_id=approval.pk)
    return approval


def review_url(approval) -> str:
    return reverse("admin:approvals_reviewedapproval_review", args=[approval.pk])


def test_a_verdict_in_the_review_queue_goes_on_to_the_next_unreviewed_item(client, olivia, acme_session):
    older, newer = decided(acme_session), decided(acme_session)
    client.force_login(olivia)

    answer = client.post(review_url(newer), {"verdict": "ok"})

    assert answer.status_code == 302
    assert answer["Location"] == reverse("admin:approvals_reviewedapproval_change", args=[older.pk])
    page = client.get(answer["Location"]).content.decode()
    assert f"Review of #{newer.pk} (refund) recorded: OK." in page


def test_the_last_verdict_returns_to_the_queue(client, olivia, acme_session):
    only = decided(acme_session)
    client.force_login(olivia)

    answer = client.post(review_url(only), {"verdict": "concern", "note": "odd amount"})

    assert answer["Location"] == reverse("admin:approvals_reviewedapproval_changelist")
    assert "Nothing else waits for a review." in client.get(answer["Location"]).content.decode()
    only.refresh_from_db()
    assert (only.review_status, only.review_verdict) == ("reviewed", "concern")


# --- server tools -------------------------------------------------------------------


def test_a_built_in_tool_shows_its_handlers_parameters_and_no_webhook_fields(client, olivia, acme):
    tool = next(t for t in demo_tools_install(tenant=acme) if t.name == "order_status")
    client.force_login(olivia)

    html = client.get(reverse("admin:approvals_servertool_change", args=[tool.pk])).content.decode()

    assert "handler&#x27;s parameters" in html.lower() or "handler's parameters" in html.lower()
    assert "&quot;number&quot;" in html  # the handler's own schema, shown
    assert 'name="webhook_url"' not in html and "webhook secret" not in html.lower()
    assert ">null</textarea>" not in html


def test_a_webhook_tool_keeps_its_webhook_fields_and_no_handler(client, olivia, acme):
    tool = ServerTool.objects.create(tenant=acme, name="refund", kind=ServerTool.Kind.WEBHOOK,
                                     webhook_url="https://hooks.example/refund")
    client.force_login(olivia)

    html = client.get(reverse("admin:approvals_servertool_change", args=[tool.pk])).content.decode()

    assert 'name="webhook_url"' in html and "webhook secret" in html.lower()
    assert 'name="python_handler"' not in html
    assert ">null</textarea>" not in html


# --- reading the page block (pure) ------------------------------------------------


def test_a_page_block_is_read_whatever_line_breaks_its_title_holds():
    from aitp.transcript import content_block

    block = content_block({"type": "text", "text": "[page]\nurl: /a\ntitle: two\nlines\ncontext: {\"k\": 1}"})

    assert (block.kind, block.ref, block.name) == ("page", "/a", "two\nlines")
    assert json.loads(block.text) == {"k": 1}


@pytest.mark.parametrize("text", [
    "[page] where is my order?",  # the user's own words that merely start alike
    "[page]\nurl: /a\nno title line\ncontext: {}",
    "[page]\nurl: /a\ntitle: no context line",
])
def test_text_that_is_not_a_whole_page_block_stays_the_users_words(text):
    from aitp.transcript import content_block

    block = content_block({"type": "text", "text": text})

    assert (block.kind, block.text) == ("text", text)


def test_a_page_without_context_has_an_empty_detail():
    from aitp.transcript import content_block

    assert content_block({"type": "text", "text": "[page]\nurl: /a\ntitle: A\ncontext: {}"}).text == ""


def test_the_admins_list_of_operator_actions_names_them_in_words(client, root, acme_session):
    services.session_command(session=acme_session, user=root, command="redirect", url="/help")
    client.force_login(root)

    html = client.get(reverse("admin:aitp_operatoraction_changelist")).content.decode()

    assert "Page sent elsewhere" in html and ">session_redirect<" not in html
