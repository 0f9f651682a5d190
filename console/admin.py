"""Django admin for tenants and their members.

The tenant's own staff see only their tenants; only the service's operators
(superusers) set a quota or delete a tenant.
"""
from __future__ import annotations

from django.contrib import admin

from aitp.limits import tenant_quota_status
from tenants.models import Tenant, TenantMembership
from tenants.selectors import changeable_tenant_ids, tenant_ids_for_user


class MembershipInline(admin.TabularInline):
    model = TenantMembership
    extra = 0
    autocomplete_fields = ["user"]

    def formfield_for_foreignkey(self, db_field, request, **kwargs):
        # Only a superuser puts staff (operator) accounts into a tenant.
        field = super().formfield_for_foreignkey(db_field, request, **kwargs)
        if db_field.name == "user" and not request.user.is_superuser:
            field.queryset = field.queryset.filter(is_staff=False, is_superuser=False)
        return field


@admin.register(Tenant)
class TenantAdmin(admin.ModelAdmin):
    list_display = ["slug", "name", "quota_display", "tokens_this_month", "created_at"]
    search_fields = ["slug", "name"]
    inlines = [MembershipInline]

    def get_readonly_fields(self, request, obj=None):
        # The quota bounds what a tenant costs: only the service's operators
        # (superusers) set it, never a tenant's own staff.
        readonly = [*super().get_readonly_fields(request, obj), "tokens_this_month"]
        if not request.user.is_superuser:
            readonly.append("monthly_token_quota")
        return readonly

    @admin.display(description="Monthly token quota")
    def quota_display(self, obj: Tenant) -> str:
        return f"{obj.monthly_token_quota:,}" if obj.monthly_token_quota else "unlimited"

    @admin.display(description="Tokens this month")
    def tokens_this_month(self, obj: Tenant) -> str:
        if obj.pk is None:
            return "-"
        status = tenant_quota_status(obj)
        used = f"{status.used:,}"
        return used if status.unlimited else f"{used} ({status.percent}% of the quota)"

    def get_queryset(self, request):
        tenant_ids = tenant_ids_for_user(request.user)
        queryset = super().get_queryset(request)
        return queryset if tenant_ids is None else queryset.filter(pk__in=tenant_ids)

    def has_change_permission(self, request, obj=None) -> bool:
        owned = changeable_tenant_ids(request.user)
        allowed = owned is None or (bool(owned) if obj is None else obj.pk in owned)
        return super().has_change_permission(request, obj) and allowed

    def has_delete_permission(self, request, obj=None) -> bool:
        owned = changeable_tenant_ids(request.user)
        return super().has_delete_permission(request, obj) and (owned is None)
