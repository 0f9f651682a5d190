"""The admin entry that leads to the live pages (operators.views)."""
from __future__ import annotations

from django.contrib import admin
from django.shortcuts import redirect

from operators.models import LiveSession
from operators.selectors import is_watcher


@admin.register(LiveSession)
class LiveSessionAdmin(admin.ModelAdmin):
    def has_module_permission(self, request) -> bool:
        return is_watcher(request.user)

    def has_view_permission(self, request, obj=None) -> bool:
        return is_watcher(request.user)

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False

    def changelist_view(self, request, extra_context=None):
        return redirect("operators:live_list")

    def change_view(self, request, object_id, form_url="", extra_context=None):
        return redirect("operators:live_session", session_id=object_id)
