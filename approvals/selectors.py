"""Reads for approvals, shared by the admin's screens."""
from __future__ import annotations

from django.db.models import QuerySet
from django.utils import timezone

from approvals.models import RISKS_NEEDING_APPROVAL, Approval
from tenants.selectors import tenant_ids_for_user


def is_operator(user) -> bool:
    """Staff who may use the approval screens: superusers, and staff members of a tenant."""
    if not (user.is_authenticated and user.is_active and user.is_staff):
        return False
    tenant_ids = tenant_ids_for_user(user)
    return tenant_ids is None or bool(tenant_ids)


def awaiting_operator(queryset: QuerySet[Approval]) -> QuerySet[Approval]:
    """Approvals an operator can still decide.

    One past its deadline is left out: its turn has given up on it (or the
    process holding it died before expiring it), so a decision would reach
    nobody."""
    return queryset.filter(
        status=Approval.Status.PENDING, needs_operator=True, operator_decision__isnull=True,
        deadline__gte=timezone.now(),
    )


def in_review_queue(queryset: QuerySet[Approval]) -> QuerySet[Approval]:
    """Approvals the review queue holds: decided, of high or critical risk."""
    return queryset.filter(risk__in=RISKS_NEEDING_APPROVAL).exclude(status=Approval.Status.PENDING)
