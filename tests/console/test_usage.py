"""The usage page (30 days, zeros filled, SVG chart) and the session record."""
from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from aitp import services, store
from aitp.models import ConversationMessage, DailyUsage, OperatorAction, Session, ToolCall
from console.usage import PLOT_HEIGHT, bar_chart, daily_usage, day_title
from tests.console.conftest import make_session

pytestmark = pytest.mark.django_db


def test_the_usage_page_shows_thirty_days_ending_today_with_missing_days_as_zero(owner_client, acme, beta):
    today = timezone.localdate()
    DailyUsage.objects.create(
        tenant=acme, date=today, sessions=3, turns=4, input_tokens=100, output_tokens=20
    )
    DailyUsage.objects.create(tenant=acme, date=today - timedelta(days=10), sessions=1, input_tokens=5)
    DailyUsage.objects.create(tenant=acme, date=today - timedelta(days=30), sessions=99)  # too old
    DailyUsage.objects.create(tenant=beta, date=today, sessions=50)  # another tenant

    response = owner_client.get(reverse("console:usage", args=["acme"]))
    days = response.context["days"]
    assert [d.date for d in days] == [today - timedelta(days=29 - i) for i in range(30)]
    by_date = {d.date: d for d in days}
    assert (by_date[today].sessions, by_date[today].tokens, by_date[today].turns) == (3, 120, 4)
    ten_days_ago = by_date[today - timedelta(days=10)]
    assert (ten_days_ago.sessions, ten_days_ago.tokens) == (1, 5)
    assert sum(d.sessions for d in days) == 4
    assert sum(1 for d in days if d.sessions == 0 and d.tokens == 0) == 28

    # The table lists the two days with use, newest first; the empty ones are left out.
    html = response.content.decode()
    table = html.split('data-table="daily"')[1].split("</table>")[0]
    assert table.count("<tr><td>") == 2
    assert table.index(day_title(today)) < table.index(day_title(today - timedelta(days=10)))
    assert day_title(today - timedelta(days=29)) not in table
    assert "2 of the last 30 days had use" in html


def test_a_month_without_use_says_so_instead_of_a_table_of_zeros(owner_client, acme):
    html = owner_client.get(reverse("console:usage", args=["acme"])).content.decode()
    assert 'data-table="daily"' not in html
    assert "No use in the last 30 days." in html


def test_the_chart_labels_a_day_each_week_ending_today(owner_client, acme):
    today = timezone.localdate()
    html = owner_client.get(reverse("console:usage", args=["acme"])).content.decode()
    svg = html.split('data-chart="sessions"')[1].split("</svg>")[0]
    labels = re.findall(r'<text class="tick"[^>]*>([^<]+)</text>', svg)
    expected = [today - timedelta(days=days) for days in (28, 21, 14, 7, 0)]
    assert labels == [f"{day.day} {day:%b}" for day in expected]  # "3 Dec", as settings.MONTH_DAY_FORMAT


def test_the_usage_chart_is_inline_svg_with_a_bar_per_day(owner_client, acme):
    today = timezone.localdate()
    DailyUsage.objects.create(tenant=acme, date=today, sessions=4, input_tokens=10, output_tokens=10)
    DailyUsage.objects.create(tenant=acme, date=today - timedelta(days=1), sessions=2)
    html = owner_client.get(reverse("console:usage", args=["acme"])).content.decode()
    # Everything is in the page: no script, stylesheet or image is fetched.
    assert "<script" not in html and "<link" not in html and "src=" not in html
    for name in ("sessions", "tokens"):
        svg = html.split(f'data-chart="{name}"')[1].split("</svg>")[0]
        assert svg.count('<rect class="bar"') == 30
    sessions_svg = html.split('data-chart="sessions"')[1].split("</svg>")[0]
    heights = [int(h) for h in re.findall(r'height="(\d+)"><title>', sessions_svg)]
    assert heights[-1] == PLOT_HEIGHT and heights[-2] == PLOT_HEIGHT // 2
    assert heights[:-2] == [0] * 28
    assert f"<title>{today.day} {today:%b %Y}: 4 sessions</title>" in sessions_svg


def test_a_bar_chart_scales_to_the_largest_value_and_keeps_small_values_visible():
    chart = bar_chart([0, 1, 1000], ["a", "b", "c"], unit="tokens")
    assert [bar.height for bar in chart.bars] == [0, 1, PLOT_HEIGHT]
    assert all(bar.y + bar.height == chart.baseline for bar in chart.bars)
    assert chart.max_value == 1000 and (chart.first_label, chart.last_label) == ("a", "c")


def test_a_bar_chart_of_only_zeros_has_no_bars_drawn():
    chart = bar_chart([0] * 30, [str(i) for i in range(30)], unit="sessions")
    assert {bar.height for bar in chart.bars} == {0}
    assert chart.bars[-1].x + chart.bars[-1].width == chart.width


def test_daily_usage_ignores_other_tenants(acme, beta):
    today = timezone.localdate()
    DailyUsage.objects.create(tenant=beta, date=today, sessions=7)
    assert [d.sessions for d in daily_usage(acme, today=today)] == [0] * 30


def test_the_usage_page_lists_the_fifty_latest_sessions_with_links(owner_client, acme_key):
    start = timezone.now() - timedelta(hours=2)
    sessions = [make_session(acme_key, started_at=start + timedelta(minutes=i)) for i in range(55)]
    response = owner_client.get(reverse("console:usage", args=["acme"]))
    listed = [s.pk for s in response.context["recent_sessions"]]
    assert listed == [s.pk for s in reversed(sessions)][:50]
    assert reverse("console:session", args=["acme", sessions[-1].pk]).encode() in response.content
    assert reverse("console:session", args=["acme", sessions[0].pk]).encode() not in response.content


def test_the_session_page_shows_the_conversation_tool_calls_pages_and_tokens(owner_client, olivia, acme_key):
    session = make_session(
        acme_key, origin="https://shop.example", input_tokens=1200, output_tokens=345,
        page_history=[
            {"url": "https://shop.example/", "title": "Home", "at": "2026-01-01T10:00:00+00:00"},
            {"url": "https://shop.example/cart", "title": "Cart", "at": "2026-01-01T10:01:00+00:00"},
        ],
    )
    # Written out of order: the page shows them by seq.
    store.current().turn_checkpoint(session_id=session.pk, tenant_id=session.tenant_id, turn=1, messages=[
        {"seq": 2, "role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": "out of stock", "is_error": True},
        ]},
    ])
    store.current().turn_checkpoint(session_id=session.pk, tenant_id=session.tenant_id, turn=1, messages=[
        {"seq": 1, "role": "assistant", "content": [
            {"type": "text", "text": "Let me add that."},
            {"type": "tool_use", "id": "toolu_1", "name": "add_to_cart", "input": {"quantity": 2}},
        ]},
    ])
    store.current().turn_checkpoint(session_id=session.pk, tenant_id=session.tenant_id, turn=1, messages=[
        {"seq": 0, "role": "user", "content": [
            {"type": "text", "text": "Add <b>two</b> mugs"},
        ]},
    ])
    store.current().tool_calls_record(session_id=session.pk, turn=1, calls=[
        {"call_id": "call_1", "tool_use_id": "toolu_1", "name": "add_to_cart", "arguments": {"quantity": 2}},
    ])
    store.current().tool_call_finish(call_id="call_1", status=ToolCall.Status.ERROR, error="out of stock")
    services.session_command(session=session, user=olivia, command="reload")

    response = owner_client.get(reverse("console:session", args=["acme", session.pk]))
    assert response.status_code == 200
    assert [item["message"].seq for item in response.context["conversation"]] == [0, 1, 2]
    html = response.content.decode()
    assert "Add &lt;b&gt;two&lt;/b&gt; mugs" in html  # escaped, never markup
    assert html.index("Add &lt;b&gt;two") < html.index("Let me add that.") < html.index("Result for")
    assert "add_to_cart" in html and "&quot;quantity&quot;: 2" in html
    assert "out of stock" in html and 'status status-error">Error<' in html
    assert "https://shop.example/cart" in html and "Cart" in html
    assert "1200 input, 345 output" in html
    assert "Page reloaded" in html
    assert OperatorAction.objects.filter(session=session).count() == 1


def test_the_session_record_shows_a_failed_turns_error_code_after_its_question(owner_client, acme_key):
    session = make_session(acme_key)
    ConversationMessage.objects.create(session=session, seq=1, turn=1, role="user", content=[
        {"type": "text", "text": "where is my order?"},
        {"type": "turn_error", "code": "auth_failed",
         "message": "The assistant is not set up correctly on this server."},
    ])

    html = owner_client.get(reverse("console:session", args=["acme", session.pk])).content.decode()

    failed = re.search(r'<div class="turn-error">(.*?)</div>', html, re.S).group(1)
    assert html.index("where is my order?") < html.index('<div class="turn-error">')
    assert 'status-error">auth_failed<' in failed and "not set up correctly" in failed


def test_the_session_record_of_a_session_continued_after_a_reload_lists_its_sockets(owner_client, acme_key):
    session = make_session(acme_key)
    start = session.started_at
    Session.objects.filter(pk=session.pk).update(
        resumes=1, socket_opened_at=start + timedelta(minutes=2), ended_at=start + timedelta(minutes=3),
        close_code=1000, close_reason="client disconnected", earlier_sockets=[
            {"opened_at": start.isoformat(), "closed_at": (start + timedelta(minutes=1)).isoformat(),
             "code": 1006, "reason": "client disconnected"}])

    html = owner_client.get(reverse("console:session", args=["acme", session.pk])).content.decode()

    sockets = re.findall(r"<li>(.*?)</li>", html.split('class="sockets"')[1].split("</ol>")[0], re.S)
    assert "continued 1 time after a reload" in html
    assert ["code 1006" in sockets[0], "code 1000" in sockets[1]] == [True, True]


def test_the_session_page_of_an_unknown_id_is_404(owner_client, acme):
    assert owner_client.get(reverse("console:session", args=["acme", "ses_nope"])).status_code == 404


def test_a_conversation_stored_as_plain_strings_is_still_shown(owner_client, acme_key):
    session = make_session(acme_key)
    ConversationMessage.objects.create(session=session, seq=0, role="user", content="just text")
    response = owner_client.get(reverse("console:session", args=["acme", session.pk]))
    assert b"just text" in response.content


def test_the_session_page_shows_the_users_words_with_the_page_as_a_detail_and_one_time_format(
    owner_client, olivia, acme_key
):
    session = make_session(acme_key, page_history=[
        {"url": "https://shop.example/cart", "title": "Cart", "at": "2026-01-01T10:01:00+00:00"},
    ])
    store.current().turn_checkpoint(session_id=session.pk, tenant_id=session.tenant_id, turn=1, messages=[
        {"seq": 0, "role": "user", "content": [
            {"type": "text", "text": "[page]\nurl: /cart\ntitle: Cart\ncontext: {\"items\": 2}"},
            {"type": "text", "text": "is shipping free?"},
        ]},
    ])
    services.session_command(session=session, user=olivia, command="end")

    html = owner_client.get(reverse("console:session", args=["acme", session.pk])).content.decode()

    assert re.findall(r'<div class="text">(.*?)</div>', html, re.S) == ["is shipping free?"]
    detail = html.split('<details class="page-context">')[1].split("</details>")[0]
    assert "on Cart" in detail and "&quot;items&quot;: 2" in detail
    assert "[page]" not in html
    assert 'title="1 Jan 2026, 10:01 UTC">10:01:00</time>' in html  # the page history's time
    assert "Session ended" in html and ">session_end<" not in html
