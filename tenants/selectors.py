"""Who may see and who may change which tenant's rows, decided in one place.

Every app asks here: the admin's tenant scoping, the console, the operator
pages and feeds, and the approval services.
"""
from __future__ import annotations

from django.db.models import QuerySet

from tenants.models import Tenant, TenantMembership


def tenant_ids_for_user(user) -> set[int] | None:
    """The tenants a signed-in user may see: None means all (superuser)."""
    if not user.is_authenticated or not user.is_active:
        return set()
    if user.is_superuser:
        return None
    return set(TenantMembership.objects.filter(user=user).values_list("tenant_id", flat=True))


def visible_tenants(user) -> QuerySet[Tenant]:
    """The tenants a signed-in user may see, as rows (every one for a superuser)."""
    tenant_ids = tenant_ids_for_user(user)
    tenants = Tenant.objects.all()
    return tenants if tenant_ids is None else tenants.filter(pk__in=tenant_ids)


def scope_to_user(queryset: QuerySet, user, tenant_field: str = "tenant") -> QuerySet:
    """Filter any queryset with a tenant relation down to what the user may see."""
    tenant_ids = tenant_ids_for_user(user)
    if tenant_ids is None:
        return queryset
    return queryset.filter(**{f"{tenant_field}__in": tenant_ids})


def changeable_tenant_ids(user) -> set[int] | None:
    """Tenants whose rows the user may change (decide, review, end a session,
    edit a key): None means all (superuser). Viewers change nothing, whatever
    model permissions they were given."""
    tenant_ids = tenant_ids_for_user(user)
    if tenant_ids is None:
        return None
    if not tenant_ids:  # signed out, inactive, or a member of nothing
        return set()
    return set(
        TenantMembership.objects.filter(user=user, role=TenantMembership.Role.OWNER)
        .values_list("tenant_id", flat=True)
    )


def may_change_tenant(user, tenant_id: int) -> bool:
    tenant_ids = changeable_tenant_ids(user)
    return tenant_ids is None or tenant_id in tenant_ids
