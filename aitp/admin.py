"""Django admin for sessions, the ledger, usage, operator actions and alert
deliveries (read only), and the tenant scoping every admin of the product
builds on.

Tenants, their members and their keys are changed in ``console.admin``,
through ``aitp.tenancy`` as the console's pages are.

Operators (staff, not superusers) see only their tenants' rows, and the
tenant filters name only those tenants; the admin never shows a full key
(only its lookup prefix exists after creation).

The change lists fit a 1280-pixel-wide window (tests/browser/test_admin_widths.py):
a list shows what tells its rows apart, long values shortened (the whole value
on hover, and on the row's own page).
"""
from __future__ import annotations

import json

from django.contrib import admin
from django.db.models import TextField
from django.db.models.functions import Cast
from django.template.loader import render_to_string
from django.utils.html import format_html

from aitp.models import (
    AlertDelivery,
    ApiKey,
    ConversationMessage,
    DailyUsage,
    OperatorAction,
    Session,
    ToolCall,
)
from aitp.transcript import action_words, pretty_json
from tenants.models import Tenant
from tenants.selectors import changeable_tenant_ids, scope_to_user, tenant_ids_for_user, visible_tenants


def json_shown(value) -> str:
    """A stored JSON value for a read-only admin field, depth-bounded."""
    return format_html('<pre style="white-space: pre-wrap; margin: 0">{}</pre>',
                       pretty_json(value)) if value not in (None, "", [], {}) else "-"


SHOWN_RAW_CHARS = 2000


def json_text_shown(text: str | None) -> str:
    """JSON stored as text, parsed here: what no decoder can read is shown
    as the start of its text instead of breaking the page."""
    if text is None:
        return "-"
    try:
        value = json.loads(text)
    except (RecursionError, ValueError):
        return format_html(
            '<pre style="white-space: pre-wrap; margin: 0">{}</pre>',
            f"(nested too deeply to show; {len(text)} characters of JSON)\n{text[:SHOWN_RAW_CHARS]}",
        )
    return json_shown(value)


def shortened(text: str | None, limit: int) -> str:
    """A long value cut to ``limit`` characters for a list, whole on hover."""
    text = text or ""
    if len(text) <= limit:
        return text or "-"
    return format_html('<span title="{}">{}…</span>', text, text[:limit - 1])


# Session and call ids are 28 and 25 characters: a list shows their start
# (as `git log` shows a commit's), the row's page and the search the whole id.
SHORT_ID = 12


# Tool names run to 64 characters, with no space to wrap at.
TOOL_NAME_SHOWN = 24


def short_id(value: str | None) -> str:
    return shortened(value, SHORT_ID + 1)


def counted(number: int | None) -> str:
    """A count as a person writes it: 12,345,678."""
    return "-" if number is None else f"{number:,}"


def page_path(url: str | None) -> str:
    """Where a page was, as a list shows it: the path and query of its URL
    (the origin is the key's), shortened."""
    url = url or ""
    scheme, _, rest = url.partition("://")
    path = "/" + rest.partition("/")[2] if scheme and rest else url
    if len(path) <= 40:
        return format_html('<span title="{}">{}</span>', url, path) if path else "-"
    return format_html('<span title="{}">{}…</span>', url, path[:39])


class VisibleTenantFilter(admin.RelatedFieldListFilter):
    """"By tenant" offers only the tenants the user may see: a staff member
    of one tenant never reads the others' slugs off the filter. Every tenant
    filter of the admin is this one, on whatever path leads to the tenant
    (``("session__tenant", VisibleTenantFilter)``)."""

    def field_choices(self, field, request, model_admin):
        return [(tenant.pk, str(tenant)) for tenant in visible_tenants(request.user).order_by("slug")]


def _tenant_id_of(obj, tenant_field: str):
    for part in tenant_field.split("__")[:-1]:
        obj = getattr(obj, part)
    return getattr(obj, tenant_field.split("__")[-1] + "_id")


class TenantScopedAdmin(admin.ModelAdmin):
    """Querysets and foreign-key choices limited to the user's tenants; changes
    limited to the tenants they own."""

    tenant_field = "tenant"
    # The list's title, where Django's "Select <name> to view" does not read well.
    changelist_title: str | None = None

    def get_queryset(self, request):
        return scope_to_user(super().get_queryset(request), request.user, self.tenant_field)

    def changelist_view(self, request, extra_context=None):
        title = self.title_for(request)
        if title:
            extra_context = {"title": title, **(extra_context or {})}
        return super().changelist_view(request, extra_context)

    def title_for(self, request) -> str | None:
        return self.changelist_title

    def _owns(self, request, obj=None) -> bool:
        owned = changeable_tenant_ids(request.user)
        if owned is None:
            return True
        return bool(owned) if obj is None else _tenant_id_of(obj, self.tenant_field) in owned

    def has_add_permission(self, request, *args) -> bool:
        return super().has_add_permission(request, *args) and self._owns(request)

    def has_change_permission(self, request, obj=None) -> bool:
        return super().has_change_permission(request, obj) and self._owns(request, obj)

    def has_delete_permission(self, request, obj=None) -> bool:
        return super().has_delete_permission(request, obj) and self._owns(request, obj)

    def formfield_for_foreignkey(self, db_field, request, **kwargs):
        tenant_ids = changeable_tenant_ids(request.user) if db_field.name == "tenant" else (
            tenant_ids_for_user(request.user)
        )
        if tenant_ids is not None:
            if db_field.name == "tenant":
                kwargs["queryset"] = Tenant.objects.filter(pk__in=tenant_ids)
            elif db_field.name == "api_key":
                kwargs["queryset"] = ApiKey.objects.filter(tenant_id__in=tenant_ids)
        return super().formfield_for_foreignkey(db_field, request, **kwargs)


class RecordAdmin(TenantScopedAdmin):
    """A record the product writes (a session, its calls and messages, the
    daily usage, the operator actions): read here, never added, changed or
    deleted, whatever model permissions a user was given. Sessions are ended
    from the live pages, through the services."""

    def has_add_permission(self, request, *args) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False


class ToolCallInline(admin.TabularInline):
    model = ToolCall
    extra = 0
    can_delete = False
    fields = ["created_at", "name", "risk", "origin", "status", "arguments_shown", "result_shown",
              "error", "duration_ms"]
    readonly_fields = fields

    @admin.display(description="arguments")
    def arguments_shown(self, obj: ToolCall) -> str:
        return json_shown(obj.arguments)

    @admin.display(description="result")
    def result_shown(self, obj: ToolCall) -> str:
        return json_shown(obj.result)

    def has_add_permission(self, request, obj=None):
        return False


# A session's sockets are shown as one list (Session.sockets); its resume token's hash not at all.
SESSION_SOCKET_FIELDS = ("resume_token_hash", "earlier_sockets", "socket_opened_at")


@admin.register(Session)
class SessionAdmin(RecordAdmin):
    # The key, the origin, the end and the close code are on the session's page.
    list_display = ["session_short", "tenant", "page", "state", "turns", "tokens", "started_at"]
    list_select_related = ["tenant"]
    # "Ended" among the states is every session that ended.
    list_filter = ["state", ("tenant", VisibleTenantFilter)]
    search_fields = ["id", "origin", "current_url", "title"]
    date_hierarchy = "started_at"
    # The page's JSON is shown depth-bounded: Django's own display of a
    # JSONField breaks on a context nested a few hundred levels deep.
    exclude = ["context", "tools", "page_history", *SESSION_SOCKET_FIELDS]
    readonly_fields = [
        *(f.name for f in Session._meta.fields
          if f.name not in ("context", "tools", "page_history", *SESSION_SOCKET_FIELDS)),
        "context_shown", "tools_shown", "page_history_shown", "sockets_shown",
    ]
    inlines = [ToolCallInline]

    def get_queryset(self, request):
        # Read as text and parsed here: a row stored before the depth limit
        # may be too deep for the JSON decoder, which must not break the page.
        return super().get_queryset(request).defer(*self.exclude).annotate(
            context_text=Cast("context", TextField()), tools_text=Cast("tools", TextField()),
            page_history_text=Cast("page_history", TextField()),
        )

    @admin.display(description="session", ordering="id")
    def session_short(self, obj: Session) -> str:
        return short_id(obj.id)

    @admin.display(description="page", ordering="current_url")
    def page(self, obj: Session) -> str:
        return page_path(obj.current_url)

    @admin.display(description="tokens")
    def tokens(self, obj: Session) -> str:
        return counted(obj.total_tokens)

    @admin.display(description="context")
    def context_shown(self, obj: Session) -> str:
        return json_text_shown(obj.context_text)

    @admin.display(description="tools")
    def tools_shown(self, obj: Session) -> str:
        return json_text_shown(obj.tools_text)

    @admin.display(description="page history")
    def page_history_shown(self, obj: Session) -> str:
        return json_text_shown(obj.page_history_text)

    @admin.display(description="sockets")
    def sockets_shown(self, obj: Session) -> str:
        return render_to_string("operators/_sockets.html", {"session": obj})


@admin.register(ToolCall)
class ToolCallAdmin(RecordAdmin):
    tenant_field = "session__tenant"
    list_display = ["call", "session_short", "tool", "risk", "status", "created_at", "duration_ms"]
    list_filter = ["status", "risk", "origin", ("session__tenant", VisibleTenantFilter)]
    search_fields = ["call_id", "tool_use_id", "name", "session__id"]
    exclude = ["arguments", "result"]
    readonly_fields = [
        *(f.name for f in ToolCall._meta.fields if f.name not in ("arguments", "result")),
        "arguments_shown", "result_shown",
    ]
    arguments_shown = ToolCallInline.arguments_shown
    result_shown = ToolCallInline.result_shown

    @admin.display(description="call", ordering="call_id")
    def call(self, obj: ToolCall) -> str:
        return short_id(obj.call_id)

    @admin.display(description="session", ordering="session_id")
    def session_short(self, obj: ToolCall) -> str:
        return short_id(obj.session_id)

    @admin.display(description="tool", ordering="name")
    def tool(self, obj: ToolCall) -> str:
        return shortened(obj.name, TOOL_NAME_SHOWN)


@admin.register(ConversationMessage)
class ConversationMessageAdmin(RecordAdmin):
    tenant_field = "session__tenant"
    list_display = ["message", "session_short", "turn", "role", "created_at"]
    list_filter = ["role", ("session__tenant", VisibleTenantFilter)]
    search_fields = ["session__id"]
    exclude = ["content"]
    readonly_fields = [
        *(f.name for f in ConversationMessage._meta.fields if f.name != "content"), "content_shown",
    ]

    @admin.display(description="message", ordering="seq")
    def message(self, obj: ConversationMessage) -> str:
        return f"#{obj.seq}"

    @admin.display(description="session", ordering="session_id")
    def session_short(self, obj: ConversationMessage) -> str:
        return short_id(obj.session_id)

    @admin.display(description="content")
    def content_shown(self, obj: ConversationMessage) -> str:
        return json_shown(obj.content)


@admin.register(DailyUsage)
class DailyUsageAdmin(RecordAdmin):
    list_display = ["date", "tenant", "sessions_count", "turns_count", "input", "output", "cache_read",
                    "cache_write", "heard", "spoken"]
    list_display_links = ["date"]
    list_select_related = ["tenant"]
    list_filter = [("tenant", VisibleTenantFilter)]
    changelist_title = "Daily usage: a row per tenant and day"
    date_hierarchy = "date"
    readonly_fields = [f.name for f in DailyUsage._meta.fields]

    @admin.display(description="sessions", ordering="sessions")
    def sessions_count(self, obj: DailyUsage) -> str:
        return counted(obj.sessions)

    @admin.display(description="turns", ordering="turns")
    def turns_count(self, obj: DailyUsage) -> str:
        return counted(obj.turns)

    @admin.display(description="input tokens", ordering="input_tokens")
    def input(self, obj: DailyUsage) -> str:
        return counted(obj.input_tokens)

    @admin.display(description="output tokens", ordering="output_tokens")
    def output(self, obj: DailyUsage) -> str:
        return counted(obj.output_tokens)

    @admin.display(description="cache read tokens", ordering="cache_read_tokens")
    def cache_read(self, obj: DailyUsage) -> str:
        return counted(obj.cache_read_tokens)

    @admin.display(description="cache write tokens", ordering="cache_write_tokens")
    def cache_write(self, obj: DailyUsage) -> str:
        return counted(obj.cache_write_tokens)

    # Seconds, as the console's usage page shows them.
    @admin.display(description="speech heard (s)", ordering="audio_heard_ms")
    def heard(self, obj: DailyUsage) -> str:
        return f"{obj.audio_heard_ms / 1000:.1f}"

    @admin.display(description="speech spoken (s)", ordering="audio_spoken_ms")
    def spoken(self, obj: DailyUsage) -> str:
        return f"{obj.audio_spoken_ms / 1000:.1f}"


class OperatorActionFilter(admin.SimpleListFilter):
    """The actions recorded so far, named in words."""

    title = "action"
    parameter_name = "action"

    def lookups(self, request, model_admin):
        codes = model_admin.get_queryset(request).order_by("action").values_list("action", flat=True)
        return [(code, action_words(code)) for code in codes.distinct()]

    def queryset(self, request, queryset):
        return queryset.filter(action=self.value()) if self.value() else queryset


@admin.register(OperatorAction)
class OperatorActionAdmin(RecordAdmin):
    list_display = ["created_at", "tenant", "session_short", "user", "action_shown"]
    list_select_related = ["tenant", "user"]
    list_filter = [OperatorActionFilter, ("tenant", VisibleTenantFilter)]
    readonly_fields = [f.name for f in OperatorAction._meta.fields]

    @admin.display(description="session", ordering="session_id")
    def session_short(self, obj: OperatorAction) -> str:
        return short_id(obj.session_id)

    @admin.display(description="action", ordering="action")
    def action_shown(self, obj: OperatorAction) -> str:
        return action_words(obj.action)


@admin.register(AlertDelivery)
class AlertDeliveryAdmin(RecordAdmin):
    """The alerts POSTed to tenants' webhooks (``aitp.alerts``). Open, as the
    approval screens are, to the staff members of a tenant without model
    permissions: they check here that their receiver takes the alerts."""

    list_display = ["created_at", "tenant", "kind", "status", "attempts", "status_code", "error", "finished_at"]
    list_select_related = ["tenant"]
    list_filter = ["status", "kind", ("tenant", VisibleTenantFilter)]
    changelist_title = "Alert deliveries: each alert POSTed to a tenant's webhook"
    date_hierarchy = "created_at"
    readonly_fields = [f.name for f in AlertDelivery._meta.fields]

    def has_module_permission(self, request) -> bool:
        return _tenant_staff(request.user)

    def has_view_permission(self, request, obj=None) -> bool:
        return _tenant_staff(request.user)

    @admin.display(description="last error", ordering="last_error")
    def error(self, obj: AlertDelivery) -> str:
        return shortened(obj.last_error, 40)


def _tenant_staff(user) -> bool:
    """Superusers, and staff members of a tenant (they see its rows only)."""
    if not (user.is_authenticated and user.is_active and user.is_staff):
        return False
    tenant_ids = tenant_ids_for_user(user)
    return tenant_ids is None or bool(tenant_ids)
