"""A few rows of every model the admin lists, with values as long as real
ones get (session and call ids, URLs with query strings, browser user
agents), for the tests that look at the admin's pages."""
from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

# A moment every page of these tests shows: 3 Dec 2026, 14:05 UTC.
MOMENT = datetime(2026, 12, 3, 14, 5, 12, tzinfo=UTC)
USER_AGENT = ("Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) "
              "Chrome/131.0.6778.139 Safari/537.36")
LONG_URL = ("https://shop.example.com/products/pro-headphones-wireless-noise-cancelling"
            "?ref=newsletter&utm_source=email&utm_campaign=winter-sale-2026")
# The id a tenant's backend gives its visitor (a visitor token's sub): every
# session of these rows is this visitor's.
VISITOR_ID = "crm/customers/0048213-eu-west"


@dataclass
class Rows:
    tenants: list
    sessions: list
    approvals: list
    root: object


def _session(tenant, key, index: int):
    """The first of a key's sessions is open (seen now, so the live list
    shows it); the others ended."""
    from django.utils import timezone

    from aitp.models import Session

    live = index == 0
    return Session.objects.create(
        # What a list shows of the id (its first characters) in its widest hex digits, every run.
        id="ses_dbdbdbdbdb" + secrets.token_hex(7), tenant=tenant, api_key=key,
        origin="https://shop.example.com", user_agent=USER_AGENT, viewport="1280x800", visitor_id=VISITOR_ID,
        sdk_version="0.4.0", protocol_version="1.0.0", started_at=MOMENT,
        last_seen_at=timezone.now() if live else MOMENT, last_activity_at=MOMENT,
        ended_at=None if live else MOMENT + timedelta(minutes=index), close_code=None if live else 1000,
        state="waiting_approval" if live else "ended", current_url=LONG_URL,
        title="Pro Headphones - Wireless, noise cancelling",
        turns=12, input_tokens=123_456, output_tokens=7_890, cache_read_tokens=45_678,
        cache_write_tokens=12_345, audio_heard_ms=61_500, audio_spoken_ms=98_250,
    )


def admin_rows() -> Rows:
    """Two tenants, each with keys, sessions, calls, messages, usage, actions,
    alert deliveries, approvals (pending, decided, reviewed), audit events, server tools and
    orders; users and groups; login attempts of every kind the admin lists."""
    from axes.models import AccessAttempt, AccessFailureLog, AccessLog
    from django.contrib.auth.models import Group
    from django.utils import timezone

    from aitp import tenancy
    from aitp.models import AlertDelivery, ConversationMessage, DailyUsage, OperatorAction, ToolCall
    from approvals import services as approval_services
    from approvals.models import ServerTool
    from demo.models import DemoOrder
    from tenants.models import TenantMembership
    from tests.support.people import make_user

    root = make_user("root", superuser=True)
    tenants, sessions, approvals = [], [], []
    for slug, name in (("acme-outdoor-supplies", "Acme Outdoor Supplies International"),
                       ("globex-corporation", "Globex Corporation (Europe)")):
        tenant = tenancy.tenant_create(slug=slug, name=name)
        tenant.monthly_token_quota = 25_000_000
        tenant.save(update_fields=["monthly_token_quota"])
        tenants.append(tenant)
        owner = make_user(f"{slug}-owner", tenant=tenant)
        owner.email = f"owner@{slug}.example.com"
        owner.first_name, owner.last_name = "Olivia", "Operator-Longname"
        owner.save()
        key, _raw = tenancy.key_create(
            tenant=tenant, name="storefront production (EU)",
            allowed_origins=["https://shop.example.com", "https://www.shop.example.com",
                             "http://localhost:8000"],
            expires_at=MOMENT + timedelta(days=365),
        )
        for index in range(3):
            session = _session(tenant, key, index)
            sessions.append(session)
            # The widest letters an id may hold: a list must fit the worst case, every run.
            token = "WMWMWMWMWMWMWMWM" + secrets.token_hex(3)
            call = ToolCall.objects.create(
                session=session, call_id="tc_" + token, tool_use_id="toolu_01" + token, turn=1,
                name="process_payment_with_saved_card", arguments={"amount": 299.98, "currency": "USD"},
                risk="critical", origin="server", status="sent", created_at=MOMENT, duration_ms=1234,
            )
            ConversationMessage.objects.create(
                session=session, seq=1, turn=1, role="user", created_at=MOMENT,
                content=[{"type": "text", "text": "Two travel speakers, please"}],
            )
            OperatorAction.objects.create(tenant=tenant, session=session, user=owner,
                                          action="session_redirect", created_at=MOMENT,
                                          data={"url": LONG_URL})
            tool = ServerTool.objects.filter(tenant=tenant, name=call.name).first() or ServerTool.objects.create(
                tenant=tenant, name=call.name, description="Charge the card on file",
                risk="critical", kind="webhook", webhook_url=LONG_URL, approval_policy="operator",
                created_at=MOMENT,
            )
            approval = approval_services.approval_request_server(
                tool_call=call, tool=tool, args=call.arguments, session_id=session.id, timeout=3600,
            )
            if index == 1:
                approval_services.approval_expire(approval_id=approval.pk)
            if index == 2:
                approval_services.approval_expire(approval_id=approval.pk)
                approval_services.approval_review(approval_id=approval.pk, user=owner, verdict="concern",
                                                  note="amount unusual for this customer")
            approvals.append(approval)
        for day in range(3):
            DailyUsage.objects.create(
                tenant=tenant, date=date(2026, 12, 1 + day), sessions=1_234, turns=5_678,
                input_tokens=12_345_678, output_tokens=1_234_567, cache_read_tokens=9_876_543,
                cache_write_tokens=123_456, audio_heard_ms=3_600_000, audio_spoken_ms=7_200_000,
            )
        for status, code, error in (("ok", None, ""), ("failed", 503, "webhook answered 503 Service Unavailable")):
            AlertDelivery.objects.create(tenant=tenant, kind="handoff_requested", url=LONG_URL, attempts=3,
                                         status=status, status_code=code, last_error=error, created_at=MOMENT,
                                         finished_at=MOMENT + timedelta(seconds=4))
        for number in ("A1001", "A1002", "A1003"):
            DemoOrder.objects.create(tenant=tenant, number=f"{slug[:4].upper()}-{number}", status="shipped",
                                     total=Decimal("1299.99"),
                                     items=[{"product": "pro-headphones", "quantity": 2}])
        TenantMembership.objects.filter(tenant=tenant).update(created_at=MOMENT)
    for name in ("Tenant owners", "Support desk (read only)"):
        Group.objects.create(name=name)
    for username in ("olivia.operator@acme-outdoor-supplies.example.com", "mallory"):
        common = {"user_agent": USER_AGENT, "ip_address": "2001:db8:85a3::8a2e:370:7334",
                  "username": username, "http_accept": "text/html", "path_info": "/console/login/"}
        AccessAttempt.objects.create(**common, get_data="next=/console/", post_data="username=" + username,
                                     failures_since_start=3)
        AccessLog.objects.create(**common, logout_time=MOMENT)
        AccessFailureLog.objects.create(**common, locked_out=True)
    for model in (AccessLog, AccessFailureLog):
        model.objects.update(attempt_time=MOMENT)
    # A login attempt older than the cool-off is forgotten at the next login,
    # so the attempts are the moment the rows are made, not MOMENT.
    AccessAttempt.objects.update(attempt_time=timezone.now())
    return Rows(tenants=tenants, sessions=sessions, approvals=approvals, root=root)
