"""The demo shop's orders in the admin: the seeded ones and those paid in the
store, each under its tenant, for operators of that tenant."""
from __future__ import annotations

from django.contrib import admin

from approvals.admin import TenantScopedAdmin
from demo.models import DemoOrder


@admin.register(DemoOrder)
class DemoOrderAdmin(TenantScopedAdmin):
    list_display = ("number", "tenant", "status", "total", "updated_at")
    list_filter = ("status",)
    search_fields = ("number",)
