"""The admin entry that leads to the live pages (operators.views)."""
from __future__ import annotations

from django.contrib import admin
from django.shortcuts import redirect

from approvals.admin import ScreenAdmin
from operators.models import LiveSession
from operators.selectors import is_watcher


@admin.register(LiveSession)
class LiveSessionAdmin(ScreenAdmin):
    def may_use(self, user) -> bool:
        return is_watcher(user)

    def changelist_view(self, request, extra_context=None):
        return redirect("operators:live_list")

    def change_view(self, request, object_id, form_url="", extra_context=None):
        return redirect("operators:live_session", session_id=object_id)
