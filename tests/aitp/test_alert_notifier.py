"""The tenant's alerts (aitp.alerts): the webhook's body with its one-line
``text``, its retries until a 2xx, the delivery log the admin shows, and the
two alerts of a chat that needs a person: a request for one
(``handoff_requested``) and an approval waiting for an operator
(``approval_waiting``). The webhook is a real receiver on 127.0.0.1."""
from __future__ import annotations

import ipaddress
import json
import logging
import threading
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler

import pytest
from django.core import mail
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from aitp import alerts, tenancy
from aitp.models import AlertDelivery, Session
from approvals import services
from approvals.models import ServerTool
from tenants.models import TenantMembership
from tests.approvals.conftest import make_call
from tests.support.people import make_session, make_user
from tests.support.receiver import serving

DEADLINE = datetime(2026, 12, 4, 12, 30, tzinfo=UTC)
# As shipped; the receiver fixture makes the retries wait nothing.
RETRY_WAITS = alerts.RETRY_WAITS


class Receiver(BaseHTTPRequestHandler):
    """Records each POST; answers the next status of ``statuses`` (the last one ever after)."""

    statuses: list[int] = [204]
    received: list[dict] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        handler = type(self)
        handler.received.append(json.loads(body))
        status = handler.statuses.pop(0) if len(handler.statuses) > 1 else handler.statuses[0]
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def receiver(settings, monkeypatch):
    """(handler class, url); the retries do not wait."""
    settings.OWLLAYER_WEBHOOK_ALLOWED_NETWORKS = (ipaddress.ip_network("127.0.0.1/32"),)
    settings.OWLLAYER_WEBHOOK_TIMEOUT = 5.0
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    monkeypatch.setattr(alerts, "RETRY_WAITS", (0.0, 0.0))

    class Handler(Receiver):
        statuses = [204]
        received: list[dict] = []

    with serving(Handler) as url:
        yield Handler, url + "/alerts"


@pytest.fixture
def acme(receiver):
    tenant = tenancy.tenant_create(slug="acme", name="Acme Store")
    tenancy.tenant_budget_update(tenant=tenant, by=None, alert_webhook_url=receiver[1], monthly_budget_micros=None)
    owner = make_user("olivia", tenant=tenant, staff=False)
    owner.email = "olivia@acme.example"
    owner.save(update_fields=["email"])
    return tenant


def waiting_session(tenant, reason: str = "refund", session_id: str = "ses_waiting") -> Session:
    return make_session(tenant, session_id, current_url="https://shop.example/orders/17",
                        handoff_requested_at=timezone.now(), handoff_reason=reason)


def notify(tenant) -> alerts.Notified:
    return alerts.notify_tenant(tenant, "budget", "Acme Store: a test alert", "The body.\n", {"month": "2026-12"},
                                line="Acme Store: a test alert, in one line")


# --- the body and the retries ------------------------------------------------------


@pytest.mark.django_db
def test_the_webhook_body_has_a_one_line_text_beside_the_kind_the_tenant_and_the_data(acme, receiver):
    notified = notify(acme)

    assert notified == alerts.Notified(emails=1, webhook=True)
    assert receiver[0].received == [{"kind": "budget", "tenant": "acme",
                                     "text": "Acme Store: a test alert, in one line", "month": "2026-12"}]


@pytest.mark.django_db
def test_the_text_is_the_subject_when_no_line_is_given(acme, receiver):
    alerts.notify_tenant(acme, "budget", "Acme Store: the subject", "The body.\n", {})

    assert receiver[0].received[0]["text"] == "Acme Store: the subject"


@pytest.mark.django_db
def test_a_webhook_answering_errors_is_tried_again_until_it_answers_2xx(acme, receiver):
    receiver[0].statuses = [500, 503, 204]

    notified = notify(acme)

    assert notified.webhook is True
    assert len(receiver[0].received) == 3
    delivery = AlertDelivery.objects.get()
    assert (delivery.status, delivery.attempts, delivery.status_code, delivery.last_error) == ("ok", 3, None, "")


@pytest.mark.django_db
def test_a_webhook_that_never_answers_2xx_is_given_up_after_three_attempts_and_logged_failed(
        acme, receiver, caplog):
    receiver[0].statuses = [500]

    with caplog.at_level(logging.WARNING, logger="aitp.alerts"):
        notified = notify(acme)

    assert notified == alerts.Notified(emails=1, webhook=False)
    assert len(receiver[0].received) == 3
    delivery = AlertDelivery.objects.get()
    assert (delivery.status, delivery.attempts, delivery.status_code) == ("failed", 3, 500)
    assert delivery.last_error == "webhook answered 500" and delivery.finished_at is not None
    assert sum("webhook not taken" in r.getMessage() for r in caplog.records) == 3


@pytest.mark.django_db
def test_the_attempts_wait_one_then_three_seconds(acme, receiver, monkeypatch):
    monkeypatch.setattr(alerts, "RETRY_WAITS", RETRY_WAITS)
    waits: list[float] = []
    monkeypatch.setattr(alerts.time, "sleep", waits.append)
    receiver[0].statuses = [500]

    notify(acme)

    assert waits == [1.0, 3.0]


@pytest.mark.django_db
def test_an_address_the_rules_refuse_is_tried_once(acme, receiver, settings):
    settings.OWLLAYER_WEBHOOK_ALLOWED_NETWORKS = ()

    notified = notify(acme)

    assert notified == alerts.Notified(emails=1, webhook=False)
    assert receiver[0].received == []
    delivery = AlertDelivery.objects.get()
    assert (delivery.status, delivery.attempts, delivery.status_code) == ("failed", 1, None)
    assert delivery.last_error == "the webhook address is not allowed"


# --- the delivery log ----------------------------------------------------------------


@pytest.mark.django_db
def test_each_alert_to_the_webhook_is_one_delivery_row_of_its_tenant(acme, receiver):
    globex = tenancy.tenant_create(slug="globex", name="Globex")
    notify(acme)
    notify(acme)
    notify(globex)  # no webhook: e-mail only, no row

    rows = list(AlertDelivery.objects.filter(tenant=acme).order_by("pk"))
    assert [(r.kind, r.url, r.status, r.attempts) for r in rows] == [("budget", receiver[1], "ok", 1)] * 2
    assert all(r.created_at <= r.finished_at for r in rows)
    assert not AlertDelivery.objects.filter(tenant=globex).exists()


@pytest.mark.django_db
def test_the_delivery_log_shows_a_tenants_staff_their_rows_only_and_nobody_changes_it(acme, receiver):
    globex = tenancy.tenant_create(slug="globex", name="Globex")
    AlertDelivery.objects.create(tenant=globex, kind="budget", url="https://globex.example/hook", attempts=1,
                                 status="ok")
    notify(acme)
    acme_row = AlertDelivery.objects.get(tenant=acme)
    viewer = make_user("victor", tenant=acme, role=TenantMembership.Role.VIEWER)
    root = make_user("root", superuser=True)
    outsider = make_user("nobody")  # staff, member of no tenant

    def shown(user) -> list:
        client = Client()
        client.force_login(user)
        page = client.get(reverse("admin:aitp_alertdelivery_changelist"))
        return [] if page.status_code != 200 else [row.pk for row in page.context["cl"].result_list]

    assert shown(viewer) == [acme_row.pk]
    assert sorted(shown(root)) == sorted(AlertDelivery.objects.values_list("pk", flat=True))
    assert shown(outsider) == []
    client = Client()
    client.force_login(root)
    assert client.get(reverse("admin:aitp_alertdelivery_change", args=[acme_row.pk])).status_code == 200
    assert client.get(reverse("admin:aitp_alertdelivery_add")).status_code == 403
    assert client.post(reverse("admin:aitp_alertdelivery_delete", args=[acme_row.pk]),
                       {"post": "yes"}).status_code == 403
    assert AlertDelivery.objects.filter(pk=acme_row.pk).exists()


# --- a chat asks for a person ----------------------------------------------------------


@pytest.mark.django_db
def test_a_request_for_a_person_tells_the_tenant_the_session_the_reason_and_the_live_page(acme, receiver):
    session = waiting_session(acme)

    notified = alerts.handoff_requested(session.id)

    assert notified == alerts.Notified(emails=1, webhook=True)
    [body] = receiver[0].received
    assert body == {
        "kind": "handoff_requested", "tenant": "acme",
        "text": "Acme Store: a page user asked for a person (reason: refund). Open /admin/live/ses_waiting/",
        "session_id": "ses_waiting", "reason": "refund", "admin_path": "/admin/live/ses_waiting/",
        "requested_at": session.handoff_requested_at.isoformat(),
    }
    [message] = mail.outbox
    assert message.subject == "Acme Store: a page user asked for a person (session ses_waiting)"
    assert "Reason: refund" in message.body and "/admin/live/ses_waiting/" in message.body
    assert "https://shop.example/orders/17" in message.body
    assert AlertDelivery.objects.get().kind == "handoff_requested"


@pytest.mark.django_db
def test_a_reason_from_the_chat_stays_one_line_and_makes_no_link_in_the_text(acme, receiver):
    session = waiting_session(acme, reason="see <https://evil.example|your refund>\n& more")

    alerts.handoff_requested(session.id)

    [body] = receiver[0].received
    assert body["text"] == ("Acme Store: a page user asked for a person (reason: see "
                            "&lt;https://evil.example|your refund&gt; &amp; more). Open /admin/live/ses_waiting/")
    assert body["reason"] == "see <https://evil.example|your refund>\n& more"
    assert "\n" not in mail.outbox[0].subject


@pytest.mark.django_db
def test_nothing_is_sent_for_a_session_nobody_waits_for_or_one_that_is_gone(acme, receiver):
    make_session(acme, "ses_quiet")

    assert alerts.handoff_requested("ses_quiet") is None
    assert alerts.handoff_requested("ses_missing") is None
    assert receiver[0].received == [] and mail.outbox == []


# --- an approval waits for an operator ---------------------------------------------------


@pytest.mark.django_db
def test_an_approval_waiting_tells_the_tenant_the_tool_the_deadline_and_the_live_page(acme, receiver):
    session = make_session(acme, "ses_pay")

    notified = alerts.approval_waiting(acme.pk, session.id, 42, "refund", "high", DEADLINE)

    assert notified == alerts.Notified(emails=1, webhook=True)
    assert receiver[0].received == [{
        "kind": "approval_waiting", "tenant": "acme",
        "text": ("Acme Store: refund (risk: high) waits for an operator's approval until 12:30:00 UTC. "
                 "Open /admin/live/ses_pay/"),
        "session_id": "ses_pay", "approval_id": 42, "tool": "refund", "risk": "high",
        "deadline": DEADLINE.isoformat(), "admin_path": "/admin/live/ses_pay/",
    }]
    assert mail.outbox[0].subject == "Acme Store: an approval waits for an operator (refund)"
    assert "Approval: 42" in mail.outbox[0].body and "/admin/live/ses_pay/" in mail.outbox[0].body


def open_server_approval(session, policy: str):
    tool = ServerTool.objects.create(
        tenant=session.tenant, name=f"refund_{policy}", description="Refund an order", risk="high",
        kind=ServerTool.Kind.WEBHOOK, webhook_url="http://127.0.0.1:9/refund", approval_policy=policy,
    )
    call = make_call(session, name=tool.name, args={"order": "A1"}, risk="high", origin="server")
    return call, lambda: services.approval_request_server(
        tool_call=call, tool=tool, args={"order": "A1"}, session_id=session.id, timeout=120.0)


@pytest.fixture
def sent_in_background(monkeypatch) -> list[tuple]:
    """The alerts sent in the background, by name and arguments; each runs,
    and is waited for here."""
    sent: list[tuple] = []
    send = alerts.send_in_background

    def recorded(fn, *args):
        sent.append((fn.__name__, *args))
        send(fn, *args).join(timeout=30)

    monkeypatch.setattr(alerts, "send_in_background", recorded)
    return sent


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("policy", ["operator", "user_and_operator"])
def test_an_approval_that_needs_an_operator_sends_approval_waiting_once_after_it_is_committed(
        acme, receiver, sent_in_background, policy):
    session = make_session(acme, "ses_pay")
    _call, request = open_server_approval(session, policy)

    approval = request()
    request()  # asked again: the same approval, its deadline extended

    assert sent_in_background == [("approval_waiting", acme.pk, "ses_pay", approval.pk, f"refund_{policy}",
                                   "high", approval.deadline)]
    assert [(b["kind"], b["approval_id"]) for b in receiver[0].received] == [("approval_waiting", approval.pk)]
    assert AlertDelivery.objects.get().status == "ok"


@pytest.mark.django_db(transaction=True)
def test_an_approval_only_the_page_user_decides_sends_no_alert(acme, receiver, sent_in_background):
    session = make_session(acme, "ses_pay")
    _call, request = open_server_approval(session, "user")

    request()

    assert sent_in_background == [] and receiver[0].received == [] and mail.outbox == []


@pytest.mark.django_db
def test_the_approval_alert_waits_for_the_transaction_to_commit(
        acme, receiver, sent_in_background, django_capture_on_commit_callbacks):
    session = make_session(acme, "ses_pay")
    _call, request = open_server_approval(session, "operator")

    with django_capture_on_commit_callbacks() as callbacks:
        request()

    assert len(callbacks) == 1 and sent_in_background == []  # waits for the commit


# --- in the background -------------------------------------------------------------------


def test_an_alert_sent_in_the_background_runs_on_its_own_thread_and_its_failure_is_logged(caplog):
    ran_on: list[threading.Thread] = []

    def failing(session_id: str) -> None:
        ran_on.append(threading.current_thread())
        raise RuntimeError("mail server on fire")

    with caplog.at_level(logging.ERROR, logger="aitp.alerts"):
        alerts.send_in_background(failing, "ses_x").join(timeout=10)

    assert ran_on and ran_on[0] is not threading.current_thread() and ran_on[0].daemon
    assert any("alert failing('ses_x',) failed" in r.getMessage() for r in caplog.records)
