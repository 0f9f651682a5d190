"""A tenant's monthly budget: told at 80% and at 100%, once each a month.

The month is the calendar month in UTC; what was spent is the summed cost of
the turns of the tenant's sessions that started in it (``TurnRecord``;
turns of a model without a price count nothing). The budget stops nothing:
the monthly token quota is the hard stop.

``budgets_check`` runs in every serving process (``aitp.processes``, every
OWLLAYER_BUDGET_CHECK_INTERVAL) and from the ``check_budgets`` command. The
``BudgetAlert`` row of (tenant, month, threshold) is unique: the check whose
insert made it sends the alert, so processes checking at once tell the tenant
once. The row is kept even when sending failed (logged): an alert is sent
once (``aitp.alerts`` tries its webhook up to three times), never repeated
every minute.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, datetime

from django.db import transaction
from django.db.models import Sum

from aitp import alerts
from aitp.models import TurnRecord
from tenants.models import BudgetAlert, Tenant

logger = logging.getLogger(__name__)

THRESHOLDS = (80, 100)
KIND = "budget"


def month_bounds(now: datetime) -> tuple[str, datetime, datetime]:
    """("YYYY-MM", its first instant, the next month's first instant), in UTC."""
    now = now.astimezone(UTC)
    start = datetime(now.year, now.month, 1, tzinfo=UTC)
    end = datetime(now.year + (now.month == 12), now.month % 12 + 1, 1, tzinfo=UTC)
    return f"{now.year:04d}-{now.month:02d}", start, end


def spent_micros(tenant_ids: list[int], now: datetime) -> dict[int, int]:
    """Each tenant's cost of this month's turns, in millionths of USD."""
    _, start, end = month_bounds(now)
    rows = (
        TurnRecord.objects.filter(session__tenant_id__in=tenant_ids, started_at__gte=start,
                                  started_at__lt=end, cost_micros__isnull=False)
        .values("session__tenant_id")
        .annotate(spent=Sum("cost_micros"))
    )
    return {row["session__tenant_id"]: row["spent"] or 0 for row in rows}


def usd(micros: int) -> str:
    return f"{micros / 1_000_000:,.2f}"


@dataclass(frozen=True)
class Due:
    tenant: Tenant
    month: str
    threshold: int
    spent: int
    budget: int


def budgets_check(now: datetime) -> list[BudgetAlert]:
    """Record and send every alert due at ``now``; returns the rows this call
    made (those it sent). Safe from several processes at once."""
    sent = []
    for due in budgets_due(now):
        alert = _claim(due)
        if alert is not None:
            _send(due)
            sent.append(alert)
    return sent


def budgets_due(now: datetime) -> list[Due]:
    """The thresholds passed this month with no alert row yet, lowest first."""
    month, _, _ = month_bounds(now)
    tenants = {t.pk: t for t in Tenant.objects.filter(monthly_budget_micros__gt=0)}
    if not tenants:
        return []
    spent = spent_micros(list(tenants), now)
    told = set(BudgetAlert.objects.filter(tenant_id__in=list(tenants), month=month)
               .values_list("tenant_id", "threshold"))
    return [
        Due(tenant, month, threshold, spent.get(pk, 0), tenant.monthly_budget_micros or 0)
        for pk, tenant in tenants.items()
        for threshold in THRESHOLDS
        if (pk, threshold) not in told
        and spent.get(pk, 0) * 100 >= (tenant.monthly_budget_micros or 0) * threshold
    ]


def _claim(due: Due) -> BudgetAlert | None:
    """The alert's row if this call made it; None when another had."""
    with transaction.atomic():
        alert, created = BudgetAlert.objects.get_or_create(
            tenant=due.tenant, month=due.month, threshold=due.threshold,
            defaults={"spent_micros": due.spent, "budget_micros": due.budget},
        )
    return alert if created else None


def _send(due: Due) -> None:
    tenant = due.tenant
    reached = "reached" if due.threshold >= 100 else f"passed {due.threshold}% of"
    subject = f"{tenant.name}: model cost {reached} the monthly budget ({due.month})"
    text = (
        f"The model cost of {tenant.name} on OwlLayer this month ({due.month}, UTC) is "
        f"US${usd(due.spent)}, {due.threshold}% or more of its monthly budget of "
        f"US${usd(due.budget)}.\n\n"
        "The budget stops nothing: sessions and turns go on. Only the monthly token quota, "
        "if the tenant has one, refuses turns once it is used up.\n\n"
        "Owners change the budget and the alert webhook on the console's Budget page.\n"
    )
    alerts.notify_tenant(tenant, KIND, subject, text, {
        "month": due.month, "threshold": due.threshold,
        "spent_usd": round(due.spent / 1_000_000, 6), "budget_usd": round(due.budget / 1_000_000, 6),
    }, line=f"{subject}: US${usd(due.spent)} of US${usd(due.budget)}.")
