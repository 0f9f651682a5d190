"""Monthly budget alerts: told once per month and threshold, by e-mail to the
owners and at the tenant's alert webhook (a receiver on 127.0.0.1 here)."""
from __future__ import annotations

import ipaddress
import json
import logging
import threading
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler
from unittest import mock

import pytest
from django.core import mail
from django.db import connection

from aitp import alerts, budgets, tenancy
from aitp.models import Session, TurnRecord
from approvals.webhooks import sign
from tenants.models import BudgetAlert, TenantMembership
from tests.support.receiver import serving

NOW = datetime(2026, 12, 15, 12, 0, tzinfo=UTC)
NEXT_MONTH = datetime(2027, 1, 2, 9, 0, tzinfo=UTC)
DOLLAR = 1_000_000


class Receiver(BaseHTTPRequestHandler):
    """Records each POST (headers and body); answers ``status``."""

    status = 204
    received: list[dict] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        type(self).received.append({"headers": dict(self.headers), "body": body})
        self.send_response(type(self).status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def receiver(settings):
    settings.OWLLAYER_WEBHOOK_ALLOWED_NETWORKS = (ipaddress.ip_network("127.0.0.1/32"),)
    settings.OWLLAYER_WEBHOOK_TIMEOUT = 5.0

    class Handler(Receiver):
        received: list[dict] = []

    with serving(Handler) as url:
        yield Handler, url + "/alerts"


@pytest.fixture(autouse=True)
def locmem_mail(settings):
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"


_numbers = iter(range(1, 1_000_000))


def make_tenant(django_user_model, slug: str, *, budget_usd: float | None, webhook: str = ""):
    tenant = tenancy.tenant_create(slug=slug, name=slug.title())
    tenancy.tenant_budget_update(
        tenant=tenant, by=None, alert_webhook_url=webhook,
        monthly_budget_micros=None if budget_usd is None else int(budget_usd * DOLLAR))
    for name, role, email in ((f"{slug}-owner", "owner", f"owner@{slug}.example"),
                              (f"{slug}-mailless", "owner", ""),
                              (f"{slug}-viewer", "viewer", f"viewer@{slug}.example")):
        user = django_user_model.objects.create_user(username=name, password=None, email=email)
        TenantMembership.objects.create(tenant=tenant, user=user, role=role)
    key, _ = tenancy.key_create(tenant=tenant, name="web", allowed_origins=[])
    tenant.session = Session.objects.create(id=f"ses_budget_{slug}", tenant=tenant, api_key=key)
    return tenant


def spend(tenant, usd: float, at: datetime = NOW) -> None:
    TurnRecord.objects.create(session=tenant.session, number=next(_numbers), started_at=at, ended_at=at,
                              outcome="answered", cost_micros=int(usd * DOLLAR), model="m")


def sent(receiver_class) -> list[dict]:
    return [json.loads(r["body"]) for r in receiver_class.received]


@pytest.fixture
def acme(django_user_model, receiver):
    return make_tenant(django_user_model, "acme", budget_usd=100, webhook=receiver[1])


@pytest.mark.django_db
def test_passing_80_percent_tells_the_owners_once_by_email_and_webhook(acme, receiver):
    spend(acme, 79.99)
    assert budgets.budgets_check(NOW) == []
    spend(acme, 0.01)

    made = budgets.budgets_check(NOW)

    assert [(a.month, a.threshold) for a in made] == [("2026-12", 80)]
    assert [m.to for m in mail.outbox] == [["owner@acme.example"]]
    assert "80%" in mail.outbox[0].subject and "stops nothing" in mail.outbox[0].body
    assert sent(receiver[0]) == [{
        "kind": "budget", "tenant": "acme",
        "text": "Acme: model cost passed 80% of the monthly budget (2026-12): US$80.00 of US$100.00.",
        "month": "2026-12", "threshold": 80, "spent_usd": 80.0, "budget_usd": 100.0}]


@pytest.mark.django_db
def test_the_webhook_request_is_signed_with_the_tenants_alert_secret(acme, receiver):
    spend(acme, 85)
    budgets.budgets_check(NOW)

    [request] = receiver[0].received
    headers = {k.lower(): v for k, v in request["headers"].items()}
    assert headers["x-owllayer-signature"] == sign(
        acme.alert_webhook_secret, headers["x-owllayer-timestamp"], request["body"])


@pytest.mark.django_db
def test_reaching_100_percent_after_80_tells_once_more(acme, receiver):
    spend(acme, 90)
    budgets.budgets_check(NOW)
    spend(acme, 10)

    made = budgets.budgets_check(NOW)

    assert [a.threshold for a in made] == [100]
    assert [json.loads(r["body"])["threshold"] for r in receiver[0].received] == [80, 100]
    assert len(mail.outbox) == 2 and "reached" in mail.outbox[1].subject


@pytest.mark.django_db
def test_jumping_past_both_thresholds_sends_both_in_one_check(acme, receiver):
    spend(acme, 250)

    made = budgets.budgets_check(NOW)

    assert sorted(a.threshold for a in made) == [80, 100]
    assert sorted(b["threshold"] for b in sent(receiver[0])) == [80, 100]
    assert len(mail.outbox) == 2


@pytest.mark.django_db
def test_a_second_check_sends_nothing_more(acme, receiver):
    spend(acme, 250)
    budgets.budgets_check(NOW)

    assert budgets.budgets_check(NOW) == []
    assert len(receiver[0].received) == 2 and len(mail.outbox) == 2
    assert BudgetAlert.objects.filter(tenant=acme).count() == 2


@pytest.mark.django_db
def test_a_new_month_starts_again_from_nothing(acme, receiver):
    spend(acme, 250)
    budgets.budgets_check(NOW)

    assert budgets.budgets_check(NEXT_MONTH) == []
    spend(acme, 81, at=NEXT_MONTH)
    made = budgets.budgets_check(NEXT_MONTH)

    assert [(a.month, a.threshold) for a in made] == [("2027-01", 80)]
    assert sent(receiver[0])[-1]["month"] == "2027-01" and sent(receiver[0])[-1]["spent_usd"] == 81.0


@pytest.mark.django_db
def test_a_tenant_without_a_budget_is_never_told(django_user_model, receiver):
    free = make_tenant(django_user_model, "free", budget_usd=None, webhook=receiver[1])
    spend(free, 10_000)

    assert budgets.budgets_check(NOW) == []
    assert mail.outbox == [] and receiver[0].received == []
    assert not BudgetAlert.objects.exists()


@pytest.mark.django_db
def test_turns_of_a_model_without_a_price_count_nothing(acme, receiver):
    TurnRecord.objects.create(session=acme.session, number=next(_numbers), started_at=NOW, ended_at=NOW,
                              outcome="answered", cost_micros=None, model="unpriced")
    spend(acme, 50)

    assert budgets.budgets_check(NOW) == []
    assert budgets.spent_micros([acme.pk], NOW) == {acme.pk: 50 * DOLLAR}


@pytest.mark.django_db
def test_a_failing_webhook_is_logged_and_the_email_still_goes(acme, receiver, caplog, monkeypatch):
    monkeypatch.setattr(alerts, "RETRY_WAITS", (0.0, 0.0))
    receiver[0].status = 500
    spend(acme, 85)

    with caplog.at_level(logging.WARNING, logger="aitp.alerts"):
        made = budgets.budgets_check(NOW)

    assert [a.threshold for a in made] == [80]
    # Three attempts (aitp.alerts' retries), one e-mail.
    assert len(receiver[0].received) == 3 and len(mail.outbox) == 1
    assert any("webhook not taken" in r.getMessage() for r in caplog.records)
    # Tried once: the next check does not repeat it.
    assert budgets.budgets_check(NOW) == []


@pytest.mark.django_db
def test_a_refusing_mail_server_is_logged_and_the_webhook_still_goes(acme, receiver, caplog):
    spend(acme, 85)

    with mock.patch("django.core.mail.backends.locmem.EmailBackend.send_messages",
                    side_effect=OSError("refused")), caplog.at_level(logging.WARNING, logger="aitp.alerts"):
        made = budgets.budgets_check(NOW)

    assert [a.threshold for a in made] == [80]
    assert len(receiver[0].received) == 1
    assert any("e-mail not sent" in r.getMessage() for r in caplog.records)


@pytest.mark.django_db
def test_a_webhook_outside_the_allowed_networks_is_not_called_and_the_email_goes(
        django_user_model, receiver, settings):
    settings.OWLLAYER_WEBHOOK_ALLOWED_NETWORKS = ()
    acme = make_tenant(django_user_model, "acme", budget_usd=100, webhook=receiver[1])
    spend(acme, 85)

    budgets.budgets_check(NOW)

    assert receiver[0].received == [] and len(mail.outbox) == 1


@pytest.mark.django_db
def test_of_two_checks_that_found_the_same_alert_due_only_the_one_that_recorded_it_sends(acme, receiver):
    # The race, step by step: both read "due" before either inserted the row.
    spend(acme, 85)
    first = budgets.budgets_due(NOW)
    second = budgets.budgets_due(NOW)

    with mock.patch.object(budgets, "budgets_due", side_effect=[first, second]):
        made = budgets.budgets_check(NOW) + budgets.budgets_check(NOW)

    assert [a.threshold for a in made] == [80]
    assert len(receiver[0].received) == 1 and len(mail.outbox) == 1




@pytest.mark.django_db(transaction=True)
def test_two_checks_racing_on_their_own_connections_send_each_alert_once(django_user_model, receiver):
    acme = make_tenant(django_user_model, "acme", budget_usd=100, webhook=receiver[1])
    spend(acme, 250)
    barrier = threading.Barrier(2)
    outcomes: list = [None, None]

    def check(index: int) -> None:
        try:
            barrier.wait()
            outcomes[index] = budgets.budgets_check(NOW)
        except Exception as exc:  # the outcome under test
            outcomes[index] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=check, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert all(isinstance(o, list) for o in outcomes), outcomes
    assert sorted(a.threshold for o in outcomes for a in o) == [80, 100]
    assert sorted(b["threshold"] for b in sent(receiver[0])) == [80, 100]
    assert len(mail.outbox) == 2


@pytest.mark.django_db
def test_the_command_checks_once_and_says_what_it_sent(acme, receiver):
    from io import StringIO

    from django.core.management import call_command

    spend(acme, 85, at=datetime.now(UTC))
    out = StringIO()
    call_command("check_budgets", stdout=out)

    assert "acme: 80% of the" in out.getvalue() and "sent 1 budget alerts" in out.getvalue()


@pytest.mark.django_db(transaction=True)
async def test_every_serving_process_checks_the_budgets_off_the_event_loop_and_0_turns_it_off(
        settings, monkeypatch):
    import asyncio

    from aitp import processes

    loop = asyncio.get_running_loop()
    checked = asyncio.Event()
    threads: list[threading.Thread] = []

    def check(now):
        threads.append(threading.current_thread())
        loop.call_soon_threadsafe(checked.set)
        return []

    monkeypatch.setattr(budgets, "budgets_check", check)
    monkeypatch.setattr(processes, "_timers", [])
    settings.OWLLAYER_BUDGET_CHECK_INTERVAL = 0
    processes.start_timers(loop)
    without = len(processes._timers)
    settings.OWLLAYER_BUDGET_CHECK_INTERVAL = 0.05
    processes.start_timers(loop)
    try:
        await asyncio.wait_for(checked.wait(), timeout=30)
    finally:
        for timer in processes._timers:
            timer.cancel()
        await asyncio.gather(*processes._timers, return_exceptions=True)

    assert len(processes._timers) == 2 * without + 1
    assert threads and threads[0] is not threading.main_thread()
