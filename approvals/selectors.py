"""Reads for approvals, shared by the admin, the console and the consumer."""
from __future__ import annotations

from django.db.models import QuerySet
from django.utils import timezone

from approvals.models import RISKS_NEEDING_APPROVAL, Approval
from tenants.selectors import scope_to_user, tenant_ids_for_user


def approval_for_call(*, call_id: str) -> Approval | None:
    return Approval.objects.select_related("tool_call").filter(tool_call__call_id=call_id).first()


def approval_status(*, approval_id: int) -> str | None:
    return Approval.objects.filter(pk=approval_id).values_list("status", flat=True).first()


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


def pending_operator_approvals(user) -> QuerySet[Approval]:
    """Pending approvals still waiting for an operator, in the user's tenants."""
    queryset = awaiting_operator(Approval.objects.select_related("tenant", "session", "tool_call"))
    return scope_to_user(queryset, user).order_by("deadline")


def review_queue(user) -> QuerySet[Approval]:
    """Decided approvals of high or critical risk, in the user's tenants."""
    queryset = Approval.objects.filter(risk__in=RISKS_NEEDING_APPROVAL).exclude(
        status=Approval.Status.PENDING
    ).select_related("tenant", "session", "tool_call")
    return scope_to_user(queryset, user).order_by("-created_at")
