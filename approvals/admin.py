"""Operator screens: pending approvals, the review queue, the audit log, server tools.

Access follows tenancy rather than Django's per-model permissions: staff
users see and act on the rows of the tenants they are members of, superusers
on all. Every decision, and every server tool created, changed or removed,
goes through approvals.services, which checks the membership again inside
its transaction and records who acted.
"""
from __future__ import annotations

import json

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import OuterRef, Subquery
from django.db.models.functions import Coalesce
from django.http import Http404, HttpResponseNotAllowed, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.cache import add_never_cache_headers
from django.utils.html import format_html

from aitp import admin as aitp_admin
from aitp.admin import TOOL_NAME_SHOWN, VisibleTenantFilter, short_id, shortened
from aitp.models import ToolCall
from aitp.selectors import session_conversation
from aitp.transcript import conversation_rows, pretty_json
from approvals import services
from approvals.forms import DecisionForm, ReviewForm, decide_from_post
from approvals.models import (
    RISKS_NEEDING_APPROVAL,
    Approval,
    AuditEvent,
    PendingApproval,
    ReviewedApproval,
    ServerTool,
)
from approvals.selectors import awaiting_operator, in_review_queue, is_operator
from approvals.server_tools import python_tool, python_tool_names
from tenants.models import Tenant
from tenants.selectors import changeable_tenant_ids, may_change_tenant


class ScreenAdmin(admin.ModelAdmin):
    """A screen open to whoever ``may_use`` admits, with no model permissions
    granted: access follows staff status and tenancy. Read-only unless a
    subclass says otherwise. The live pages' admin entry (operators.admin) is
    one too."""

    def may_use(self, user) -> bool:
        raise NotImplementedError

    def has_module_permission(self, request) -> bool:
        return self.may_use(request.user)

    def has_view_permission(self, request, obj=None) -> bool:
        return self.may_use(request.user)

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False


class TenantScopedAdmin(ScreenAdmin, aitp_admin.TenantScopedAdmin):
    """Rows and foreign-key choices limited to the user's tenants, as in aitp's
    admin; open to operators."""

    def may_use(self, user) -> bool:
        return is_operator(user)


# --- approvals ------------------------------------------------------------------


class ApprovalAdmin(TenantScopedAdmin):
    # The session, the origin and the deadline are on the approval's page.
    list_display = ("id", "created_at", "tenant", "tool", "risk", "status", "parties", "review_status")
    list_filter = ("status", "risk", "origin", "needs_operator", "review_status", "review_verdict",
                   ("tenant", VisibleTenantFilter))
    search_fields = ("tool_name", "session__id", "tool_call__call_id")
    list_select_related = ("tenant",)
    ordering = ("-created_at",)
    detail_template = "admin/approvals/approval/detail.html"

    @admin.display(description="tool", ordering="tool_name")
    def tool(self, obj: Approval) -> str:
        return shortened(obj.tool_name, TOOL_NAME_SHOWN)

    @admin.display(description="session", ordering="session_id")
    def session_short(self, obj: Approval) -> str:
        return short_id(obj.session_id)

    @admin.display(description="decided by")
    def parties(self, obj: Approval) -> str:
        return {
            (True, False): "user", (False, True): "operator", (True, True): "user + operator",
        }.get((obj.needs_user, obj.needs_operator), "-")

    # The detail page replaces the change form: nothing here is edited in place,
    # decisions and reviews are posted to their own views below.
    def get_urls(self):
        info = self.opts.app_label, self.opts.model_name
        wrap = self.admin_site.admin_view
        return [
            path("<path:object_id>/decide/", wrap(self.decide_view), name="{}_{}_decide".format(*info)),
            path("<path:object_id>/review/", wrap(self.review_view), name="{}_{}_review".format(*info)),
            *super().get_urls(),
        ]

    def _get_visible(self, request, object_id) -> Approval:
        try:
            pk = int(object_id)
        except (TypeError, ValueError):
            raise Http404("no such approval") from None
        approval = (
            self.get_queryset(request)
            .select_related("tenant", "session", "tool_call", "operator", "reviewed_by")
            .filter(pk=pk)
            .first()
        )
        if approval is None:
            raise Http404("no such approval")
        return approval

    def _detail_url(self, approval: Approval) -> str:
        # The full history's page: after a decision the approval leaves the
        # pending queue, and its page there would be a 404.
        return reverse(f"{self.admin_site.name}:approvals_approval_change", args=[approval.pk])

    def change_view(self, request, object_id, form_url="", extra_context=None):
        approval = self._get_visible(request, object_id)
        info = self.opts.app_label, self.opts.model_name
        # Viewers read; only owners of the tenant (and superusers) act.
        may_act = may_change_tenant(request.user, approval.tenant_id)
        can_decide = may_act and (
            approval.is_pending and approval.needs_operator and approval.operator_decision is None
        )
        can_review = may_act and not approval.is_pending and approval.risk in RISKS_NEEDING_APPROVAL
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": f"Approval #{approval.pk}: {approval.tool_name}",
            "approval": approval,
            "arguments_json": pretty_json(approval.arguments),
            "conversation": conversation_rows(session_conversation(approval.session)),
            "audit_events": AuditEvent.objects.filter(approval_id=approval.pk).order_by("seq"),
            "can_decide": can_decide,
            "can_review": can_review,
            "decision_form": DecisionForm(),
            "review_form": ReviewForm(initial={"verdict": approval.review_verdict or "ok"}),
            "decide_url": reverse(f"{self.admin_site.name}:%s_%s_decide" % info, args=[approval.pk]),
            "review_url": reverse(f"{self.admin_site.name}:%s_%s_review" % info, args=[approval.pk]),
            **(extra_context or {}),
        }
        return TemplateResponse(request, self.detail_template, context)

    def _changeable(self, request, object_id) -> Approval:
        approval = self._get_visible(request, object_id)
        if not may_change_tenant(request.user, approval.tenant_id):
            raise PermissionDenied("viewers change nothing")
        return approval

    def decide_view(self, request, object_id):
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        approval = self._changeable(request, object_id)
        decide_from_post(request, approval)
        return HttpResponseRedirect(self._detail_url(approval))

    def review_view(self, request, object_id):
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        approval = self._changeable(request, object_id)
        form = ReviewForm(request.POST)
        if not form.is_valid():
            messages.error(request, "choose a verdict")
            return HttpResponseRedirect(self._detail_url(approval))
        try:
            services.approval_review(
                approval_id=approval.pk, user=request.user, verdict=form.cleaned_data["verdict"],
                note=form.cleaned_data["note"], channel="admin",
            )
        except services.ApprovalError as exc:
            messages.error(request, f"Not recorded: {exc.message}.")
        else:
            verdict = dict(form.fields["verdict"].choices)[form.cleaned_data["verdict"]]
            messages.success(request, f"Review of #{approval.pk} ({approval.tool_name}) recorded: {verdict}.")
            return HttpResponseRedirect(self._after_review_url(request, approval))
        return HttpResponseRedirect(self._detail_url(approval))

    def _after_review_url(self, request, approval: Approval) -> str:
        return self._detail_url(approval)


@admin.register(Approval)
class AllApprovalsAdmin(ApprovalAdmin):
    pass


@admin.register(PendingApproval)
class PendingApprovalAdmin(ApprovalAdmin):
    list_display = ("id", "tenant", "tool", "risk", "arguments_short", "created_at", "deadline")
    list_filter = ("risk", ("tenant", VisibleTenantFilter))
    ordering = ("deadline",)
    changelist_title = "Approvals waiting for an operator"

    def get_queryset(self, request):
        return awaiting_operator(super().get_queryset(request))

    @admin.display(description="arguments")
    def arguments_short(self, obj: Approval) -> str:
        text = json.dumps(obj.arguments, sort_keys=True, ensure_ascii=False)
        return shortened(text, 60)


class ReviewStateFilter(admin.SimpleListFilter):
    """Unreviewed by default: the queue shows what still needs a look."""

    title = "review"
    parameter_name = "review"

    def lookups(self, request, model_admin):
        return [("unreviewed", "Unreviewed"), ("reviewed", "Reviewed"), ("all", "All")]

    def value(self):
        return super().value() or "unreviewed"

    def choices(self, changelist):
        for lookup, title in self.lookup_choices:
            yield {
                "selected": self.value() == lookup,
                "query_string": changelist.get_query_string({self.parameter_name: lookup}),
                "display": title,
            }

    def queryset(self, request, queryset):
        if self.value() == "all":
            return queryset
        return queryset.filter(review_status=self.value())


@admin.register(ReviewedApproval)
class ReviewQueueAdmin(ApprovalAdmin):
    list_display = ("id", "decided_at", "tenant", "tool", "risk", "status", "review")
    list_filter = (ReviewStateFilter, "risk", "status", "review_verdict", ("tenant", VisibleTenantFilter))
    actions = ["mark_reviewed_ok"]
    # As the review filter shows them: what waits (the default), what was
    # reviewed, or both.
    TITLES = {
        "unreviewed": "Approvals to review",
        "reviewed": "Reviewed approvals",
        "all": "Decided approvals of high and critical risk",
    }

    def title_for(self, request) -> str | None:
        return self.TITLES.get(request.GET.get(ReviewStateFilter.parameter_name) or "unreviewed",
                               self.TITLES["all"])

    @admin.display(description="review", ordering="review_status")
    def review(self, obj: Approval) -> str:
        if obj.review_status != Approval.ReviewStatus.REVIEWED:
            return obj.get_review_status_display()
        return f"{obj.get_review_status_display()}: {obj.get_review_verdict_display()}"

    def get_queryset(self, request):
        return in_review_queue(super().get_queryset(request))

    def _after_review_url(self, request, approval: Approval) -> str:
        # A verdict moves the reviewer on: to the next unreviewed item they may
        # review, or back to the (now empty) queue.
        info = self.opts.app_label, self.opts.model_name
        waiting = self.get_queryset(request).filter(review_status="unreviewed").exclude(pk=approval.pk)
        owned = changeable_tenant_ids(request.user)
        if owned is not None:
            waiting = waiting.filter(tenant_id__in=owned)
        following = waiting.order_by(*self.ordering, "-pk").first()
        if following is None:
            messages.info(request, "Nothing else waits for a review.")
            return reverse(f"{self.admin_site.name}:%s_%s_changelist" % info)
        return reverse(f"{self.admin_site.name}:%s_%s_change" % info, args=[following.pk])

    @admin.action(description="Mark reviewed: OK")
    def mark_reviewed_ok(self, request, queryset):
        done = 0
        for approval in queryset:
            try:
                services.approval_review(approval_id=approval.pk, user=request.user, verdict="ok")
            except services.ApprovalError as exc:
                messages.error(request, f"#{approval.pk} not reviewed: {exc.message}.")
            else:
                done += 1
        messages.success(request, f"{done} approval(s) marked reviewed.")


# --- the audit log ------------------------------------------------------------


@admin.register(AuditEvent)
class AuditEventAdmin(TenantScopedAdmin):
    # The channel (page, admin, console) is on hover over who acted, in the
    # filter and on the event's page.
    list_display = ("event", "created_at", "tenant_shown", "action", "tool", "actor_shown", "hash_prefix")
    list_filter = ("action", "actor_kind", "channel", ("tenant", VisibleTenantFilter))
    search_fields = ("session_id", "call_id", "actor", "hash")
    ordering = ("-seq",)
    actions = None

    def get_queryset(self, request):
        # The event keeps ids only (it outlives what it describes, and no
        # row it names is joined, so none missing hides it): the tool's name
        # and the tenant's slug are read in the list's one query, the tool
        # from the approval or, for an event of a call without one, the call.
        return super().get_queryset(request).annotate(
            tool_name=Coalesce(
                Subquery(Approval.objects.filter(pk=OuterRef("approval_id")).values("tool_name")[:1]),
                Subquery(ToolCall.objects.filter(call_id=OuterRef("call_id")).values("name")[:1]),
            ),
            tenant_slug=Subquery(Tenant.objects.filter(pk=OuterRef("tenant_id")).values("slug")[:1]),
        )

    @admin.display(description="tool", ordering="tool_name")
    def tool(self, obj: AuditEvent) -> str:
        return shortened(getattr(obj, "tool_name", None), TOOL_NAME_SHOWN)

    @admin.display(description="tenant", ordering="tenant_slug")
    def tenant_shown(self, obj: AuditEvent) -> str:
        return getattr(obj, "tenant_slug", None) or f"#{obj.tenant_id} (deleted)"

    @admin.display(description="event", ordering="seq")
    def event(self, obj: AuditEvent) -> str:
        return f"#{obj.seq}"

    @admin.display(description="by", ordering="actor")
    def actor_shown(self, obj: AuditEvent) -> str:
        # Who acted; the kind of actor and the channel on hover.
        kind = obj.get_actor_kind_display()
        return format_html('<span title="{}; channel: {}">{}</span>', kind,
                           obj.get_channel_display().lower(), obj.actor or kind)

    @admin.display(description="hash")
    def hash_prefix(self, obj: AuditEvent) -> str:
        return format_html("<code>{}</code>", obj.hash[:12])


# --- server tools ---------------------------------------------------------------


def _owner_tenant_ids(user) -> set[int] | None:
    """Tenants whose tools the user may change: None means all (superuser)."""
    return changeable_tenant_ids(user)


class OptionalJSONField(forms.JSONField):
    """A JSON value that may be absent: an empty box, never the word null."""

    def prepare_value(self, value):
        return "" if value is None else super().prepare_value(value)


# Fields only one kind of server tool uses: a built-in (Python) tool never
# calls a webhook, a webhook has no handler in this code.
WEBHOOK_ONLY_FIELDS = ("webhook_url", "timeout_seconds", "webhook_networks", "masked_secret")
# What a tool's webhook may reach inside the server's network: superusers
# set it, and no one else sees it (a tenant must not open that network to
# itself, nor read which networks exist).
SUPERUSER_ONLY_FIELDS = ("webhook_networks",)
PYTHON_ONLY_FIELDS = ("python_handler", "handler_parameters")


class ServerToolForm(forms.ModelForm):
    python_handler = forms.ChoiceField(required=False)
    parameters = OptionalJSONField(
        required=False,
        help_text='AITP schema with upper-case types, e.g. {"type": "OBJECT", "properties": {...}}. '
                  "Left empty, a built-in tool takes its handler's own.",
    )

    class Meta:
        model = ServerTool
        fields = ("tenant", "name", "description", "kind", "webhook_url", "timeout_seconds",
                  "webhook_networks", "python_handler", "parameters", "risk", "approval_policy",
                  "enabled")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["python_handler"].choices = [("", "-")] + [(n, n) for n in python_tool_names()]


@admin.register(ServerTool)
class ServerToolAdmin(TenantScopedAdmin):
    form = ServerToolForm
    list_display = ("tool", "tenant", "kind", "risk", "approval_policy", "enabled", "created_at")
    list_select_related = ("tenant",)
    list_filter = ("kind", "risk", "approval_policy", "enabled", ("tenant", VisibleTenantFilter))
    search_fields = ("name", "description")
    readonly_fields = ("masked_secret", "handler_parameters")

    def get_readonly_fields(self, request, obj=None):
        # A tool stays with the tenant it was made for.
        readonly = list(super().get_readonly_fields(request, obj))
        return readonly if obj is None else [*readonly, "tenant"]

    def get_form(self, request, obj=None, change=False, **kwargs):
        # Left out of the form itself, not only of the page: a posted value
        # for a field the form does not have is never read. (The class is
        # made anew for each request.)
        form = super().get_form(request, obj, change=change, **kwargs)
        if not request.user.is_superuser:
            for field in SUPERUSER_ONLY_FIELDS:
                form.base_fields.pop(field, None)
        return form

    def get_fields(self, request, obj=None):
        fields = list(super().get_fields(request, obj))
        if not request.user.is_superuser:
            fields = [f for f in fields if f not in SUPERUSER_ONLY_FIELDS]
        if obj is None:
            return [f for f in fields if f != "handler_parameters"]
        fields.remove("tenant")
        fields.insert(0, "tenant")
        unused = WEBHOOK_ONLY_FIELDS if obj.kind == ServerTool.Kind.PYTHON else PYTHON_ONLY_FIELDS
        fields = [f for f in fields if f not in unused]
        if "handler_parameters" in fields and "parameters" in fields:
            # Beside the box it stands in for when that is left empty.
            fields.remove("handler_parameters")
            fields.insert(fields.index("parameters") + 1, "handler_parameters")
        return fields

    @admin.display(description="name", ordering="name")
    def tool(self, obj: ServerTool) -> str:
        return shortened(obj.name, TOOL_NAME_SHOWN)

    @admin.display(description="handler's parameters")
    def handler_parameters(self, obj: ServerTool) -> str:
        tool = python_tool(obj.python_handler) if obj is not None else None
        if tool is None:
            return "-"
        return aitp_admin.json_shown(tool.spec.parameters) if tool.spec.parameters else "none"

    def _may_manage(self, request, obj=None) -> bool:
        owners = _owner_tenant_ids(request.user)
        if not is_operator(request.user):
            return False
        if owners is None:
            return True
        return bool(owners) if obj is None else obj.tenant_id in owners

    def has_add_permission(self, request) -> bool:
        return self._may_manage(request)

    def has_change_permission(self, request, obj=None) -> bool:
        return self._may_manage(request, obj)

    def has_delete_permission(self, request, obj=None) -> bool:
        return self._may_manage(request, obj)

    def formfield_for_foreignkey(self, db_field, request, **kwargs):
        # Narrowed after the base class has limited the choices to the user's
        # tenants: among those, only the ones they own.
        field = super().formfield_for_foreignkey(db_field, request, **kwargs)
        if db_field.name == "tenant":
            owners = _owner_tenant_ids(request.user)
            if owners is not None:
                field.queryset = field.queryset.filter(pk__in=owners)
        return field

    @admin.display(description="webhook secret")
    def masked_secret(self, obj: ServerTool) -> str:
        if obj is None or not obj.pk:
            return "shown once, after saving"
        return format_html("<code>{}…</code>", obj.webhook_secret[:10])

    # Writes go through approvals.services, which checks ownership again and
    # records who made each change; the form has validated the fields already.

    def save_model(self, request, obj: ServerTool, form, change):
        data = form.cleaned_data
        fields = {field: data[field] for field in services.SERVER_TOOL_FIELDS if field in data}
        if not change:
            tool = services.server_tool_create(tenant=data["tenant"], by=request.user, fields=fields)
            obj.pk, obj.created_at, obj.webhook_secret = tool.pk, tool.created_at, tool.webhook_secret
            obj._state.adding = False
            return
        services.server_tool_update(
            tool=obj, by=request.user,
            changes={field: value for field, value in fields.items() if field in form.changed_data},
        )

    def delete_model(self, request, obj: ServerTool):
        services.server_tool_delete(tool=obj, by=request.user)

    def delete_queryset(self, request, queryset):
        for tool in queryset:
            services.server_tool_delete(tool=tool, by=request.user)

    def response_add(self, request, obj, post_url_continue=None):
        # The only time the whole secret is shown: the receiver needs it to
        # check signatures; afterwards the admin shows a prefix. It goes out
        # in this answer only, never through the message store (a cookie or
        # the session).
        if obj.kind != ServerTool.Kind.WEBHOOK:
            return super().response_add(request, obj, post_url_continue)
        response = TemplateResponse(request, "admin/approvals/servertool/created.html", {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": f"Server tool {obj.name} created",
            "tool": obj,
        })
        add_never_cache_headers(response)
        return response
