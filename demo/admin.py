"""The demo shop's orders in the admin: the seeded ones and those paid in the
store, each under its tenant, for operators of that tenant."""
from __future__ import annotations

from django.contrib import admin

from aitp.admin import VisibleTenantFilter
from approvals.admin import TenantScopedAdmin
from demo.models import DemoOrder


@admin.register(DemoOrder)
class DemoOrderAdmin(TenantScopedAdmin):
    list_display = ("number", "tenant", "status", "total", "updated_at")
    list_select_related = ("tenant",)
    list_filter = ("status", ("tenant", VisibleTenantFilter))
    search_fields = ("number",)
