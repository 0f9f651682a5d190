"""Django admin for tenants, their members and their keys.

Every write goes through the same functions as the console's pages
(``aitp.tenancy``): an operator action is recorded with who made the
change, and a key whose origins or expiry changed is re-checked by its live
sessions at once, so a page from a removed origin is closed as it is when
the change is made in the console.

The tenant's own staff see only their tenants; only the service's operators
(superusers) create a tenant, set a quota or its ceilings (live sessions,
keys), delete a tenant or put a staff account in one.
"""
from __future__ import annotations

from django import forms
from django.contrib import admin, messages
from django.template.response import TemplateResponse
from django.utils import timezone
from django.utils.cache import add_never_cache_headers
from django.utils.html import format_html

from aitp import tenancy
from aitp.admin import TenantScopedAdmin, VisibleTenantFilter
from aitp.models import ApiKey
from aitp.quota import tenant_quota_status
from console.forms import MAX_SESSION_CAP
from console.origins import MAX_ORIGINS, InvalidOrigin, normalize_origin
from tenants.models import Tenant, TenantMembership
from tenants.selectors import changeable_tenant_ids, tenant_ids_for_user

# --- tenants and members ----------------------------------------------------------


class MembershipForm(forms.ModelForm):
    class Meta:
        model = TenantMembership
        fields = ["user", "role"]

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        user_field = self.fields.get("user")
        if self.instance.pk is not None and user_field is not None:
            # A member already there stays valid whoever may be added (a
            # staff account a superuser put in); the account itself never changes.
            user_field.queryset = user_field.queryset | type(self.instance.user).objects.filter(
                pk=self.instance.user_id
            )

    def clean_user(self):
        user = self.cleaned_data["user"]
        if self.instance.pk is not None and user.pk != self.instance.user_id:
            raise forms.ValidationError("remove this member and add the other account instead")
        return user


class MembershipFormSet(forms.BaseInlineFormSet):
    def clean(self):
        super().clean()
        if any(self.errors) or self.instance.pk is None:
            return
        kept = [form for form in self.forms if form.cleaned_data and not form.cleaned_data.get("DELETE")]
        owners_before = sum(
            1 for form in self.forms
            if form.instance.pk is not None and form.initial.get("role") == TenantMembership.Role.OWNER
        )
        owners_after = sum(1 for form in kept if form.cleaned_data.get("role") == TenantMembership.Role.OWNER)
        if owners_before and not owners_after:
            raise forms.ValidationError("a tenant needs at least one owner")


class MembershipInline(admin.TabularInline):
    model = TenantMembership
    form = MembershipForm
    formset = MembershipFormSet
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
    list_display = ["slug", "name", "quota_display", "tokens_this_month", "max_sessions", "max_keys",
                    "created_at"]
    search_fields = ["slug", "name"]
    inlines = [MembershipInline]
    # The alert webhook's and the visitor tokens' secrets are the tenant's owners' (the console).
    exclude = ["alert_webhook_secret", "visitor_secret"]

    def get_readonly_fields(self, request, obj=None):
        # The quota and the ceilings bound what a tenant costs: only the
        # service's operators (superusers) set them, never a tenant's own staff.
        # The budget and the alert webhook are the owners' own, set in the console.
        readonly = [*super().get_readonly_fields(request, obj), "created_at", "tokens_this_month",
                    "monthly_budget_micros", "alert_webhook_url"]
        if not request.user.is_superuser:
            readonly += ["monthly_token_quota", *tenancy.CEILING_FIELDS]
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

    def has_add_permission(self, request) -> bool:
        # A tenant's own staff see only their tenants: one they made would be
        # out of their sight, with no member.
        return super().has_add_permission(request) and request.user.is_superuser

    def has_delete_permission(self, request, obj=None) -> bool:
        owned = changeable_tenant_ids(request.user)
        return super().has_delete_permission(request, obj) and (owned is None)

    def save_model(self, request, obj: Tenant, form, change):
        if not change:
            data = form.cleaned_data
            tenant = tenancy.tenant_create(
                by=request.user, **{field: data[field] for field in tenancy.TENANT_FIELDS if field in data},
            )
            # The members' inline is saved next, onto this object.
            obj.pk, obj.name, obj.created_at = tenant.pk, tenant.name, tenant.created_at
            obj._state.adding = False
            return None
        current = Tenant.objects.get(pk=obj.pk)
        changes = {
            field: form.cleaned_data[field] for field in tenancy.TENANT_FIELDS
            if field in form.changed_data and form.cleaned_data[field] != getattr(current, field)
        }
        tenancy.tenant_update(tenant=current, by=request.user, changes=changes)
        return None

    def save_formset(self, request, form, formset, change):
        if formset.model is not TenantMembership:
            return super().save_formset(request, form, formset, change)
        tenant, by = form.instance, request.user
        owner = TenantMembership.Role.OWNER
        deleted = [row for row in formset.deleted_forms if row.instance.pk is not None]
        edited = [row for row in formset.forms if row not in formset.deleted_forms and row.has_changed()]
        added = [row for row in edited if row.instance.pk is None]
        promoted = [row for row in edited if row.instance.pk is not None and row.cleaned_data["role"] == owner]
        demoted = [row for row in edited if row.instance.pk is not None and row.cleaned_data["role"] != owner]
        formset.new_objects, formset.changed_objects, formset.deleted_objects = [], [], []
        try:
            # Owners are added and promoted before any is demoted or removed,
            # so handing a tenant over in one save never leaves it ownerless.
            for row in added:
                formset.new_objects.append(tenancy.membership_add(
                    tenant=tenant, user=row.cleaned_data["user"], role=row.cleaned_data["role"],
                    by=by, operators_allowed=by.is_superuser,
                ))
            for row in promoted + demoted:
                tenancy.membership_set_role(membership=row.instance, role=row.cleaned_data["role"], by=by)
                formset.changed_objects.append((row.instance, ["role"]))
            for row in deleted:
                tenancy.membership_remove(membership=row.instance, by=by)
                formset.deleted_objects.append(row.instance)
        except tenancy.LastOwnerError as exc:
            # Another owner changed the members since this form was shown.
            messages.error(request, f"Members not all saved: {exc}.")


# --- keys -------------------------------------------------------------------------


class ApiKeyAdminForm(forms.ModelForm):
    """Origins are checked and normalised as in the console: a key only
    matches the exact Origin header a browser sends."""

    max_sessions = forms.IntegerField(label="Session cap", min_value=1, max_value=MAX_SESSION_CAP)

    class Meta:
        model = ApiKey
        fields = ["tenant", "name", "status", "allowed_origins", "max_sessions", "expires_at", "handoff"]

    def clean_allowed_origins(self):
        value = self.cleaned_data["allowed_origins"] or []
        if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
            raise forms.ValidationError('a list of origins, like ["https://shop.example"]')
        origins: list[str] = []
        errors: list[str] = []
        for item in value:
            try:
                origin = normalize_origin(item)
            except InvalidOrigin as exc:
                errors.append(f"{item.strip()[:100]!r}: {exc}")
                continue
            if origin not in origins:
                origins.append(origin)
        if len(origins) > MAX_ORIGINS:
            errors.append(f"at most {MAX_ORIGINS} origins per key")
        if errors:
            raise forms.ValidationError(errors)
        return origins

    def clean_expires_at(self):
        # A new key starts active: never already expired (as it is never
        # already revoked or disabled: the add form has no status).
        expires_at = self.cleaned_data["expires_at"]
        if self.instance.pk is None and expires_at is not None and expires_at <= timezone.now():
            raise forms.ValidationError("the expiry must be in the future")
        return expires_at

    def clean_status(self):
        status = self.cleaned_data["status"]
        if self.initial.get("status") == ApiKey.Status.REVOKED and status != ApiKey.Status.REVOKED:
            raise forms.ValidationError("a revoked key cannot be re-activated")
        return status

    def clean_tenant(self):
        # A new key must fit its tenant's ceiling (the service checks again,
        # under the tenant's lock, when it writes).
        tenant = self.cleaned_data["tenant"]
        if self.instance.pk is None and tenant is not None:
            refusal = tenancy.key_ceiling_refusal(tenant.pk)
            if refusal is not None:
                raise forms.ValidationError(refusal)
        return tenant


@admin.register(ApiKey)
class ApiKeyAdmin(TenantScopedAdmin):
    form = ApiKeyAdminForm
    # The session cap and when the key was made are on the key's page.
    list_display = ["prefix_display", "name", "tenant", "status", "origins", "expires_at", "last_used_at"]
    list_select_related = ["tenant"]
    # Only the tenants the user may see: never another tenant's slug.
    list_filter = ["status", ("tenant", VisibleTenantFilter)]
    search_fields = ["prefix", "name", "tenant__slug"]
    readonly_fields = ["prefix", "created_at", "last_used_at", "revoked_at"]
    fields = [
        "tenant", "name", "prefix", "status", "allowed_origins", "max_sessions", "expires_at", "handoff",
        "created_at", "last_used_at", "revoked_at",
    ]
    # A new key is active: revoked, disabled, used or made earlier it cannot
    # be, so the add form shows none of those fields, and a status posted
    # to it is never read (the service makes every key active).
    add_fields = ["tenant", "name", "allowed_origins", "max_sessions", "expires_at", "handoff"]
    actions = ["revoke_keys", "disable_keys"]

    def get_fields(self, request, obj=None):
        return self.add_fields if obj is None else super().get_fields(request, obj)

    def has_delete_permission(self, request, obj=None) -> bool:
        # A key is revoked, never deleted: its sessions, transcripts and
        # ledger stay, and its live pages are closed by the revocation.
        return False

    def get_readonly_fields(self, request, obj=None):
        # A key stays with the tenant it was made for.
        readonly = list(super().get_readonly_fields(request, obj))
        return readonly if obj is None else [*readonly, "tenant"]

    @admin.display(description="key", ordering="prefix")
    def prefix_display(self, obj: ApiKey) -> str:
        return f"{obj.prefix}…"

    @admin.display(description="allowed origins")
    def origins(self, obj: ApiKey) -> str:
        # Up to 20 a key: the first two, and how many more (all on hover).
        shown = obj.allowed_origins[:2]
        if not shown:
            return "any"
        more = len(obj.allowed_origins) - len(shown)
        return format_html('<span title="{}">{}{}</span>', "\n".join(obj.allowed_origins), ", ".join(shown),
                           f" and {more} more" if more else "")

    def save_model(self, request, obj: ApiKey, form, change):
        data = form.cleaned_data
        if not change:
            key, raw = tenancy.key_create(
                tenant=data["tenant"], by=request.user, name=data["name"],
                allowed_origins=data["allowed_origins"], max_sessions=data["max_sessions"],
                expires_at=data["expires_at"], handoff=data["handoff"],
            )
            obj.pk, obj.prefix, obj.created_at = key.pk, key.prefix, key.created_at
            # Kept on this request only: response_add shows it in its answer, so
            # the plaintext never goes through the message store (a cookie or the
            # session).
            obj.raw_key_once = raw
            return
        key = ApiKey.objects.get(pk=obj.pk)
        changes = {
            field: data[field] for field in tenancy.KEY_FIELDS
            if field in form.changed_data and data[field] != getattr(key, field)
        }
        if changes:
            # A disabled or revoked key's live sessions close on every
            # process; one whose origins or expiry changed is checked again.
            tenancy.key_update(key=key, by=request.user, changes=changes)
            obj.revoked_at = key.revoked_at

    def response_add(self, request, obj, post_url_continue=None):
        raw = getattr(obj, "raw_key_once", None)
        if raw is None:
            return super().response_add(request, obj, post_url_continue)
        response = TemplateResponse(request, "admin/aitp/apikey/created.html", {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": f"Key {obj.prefix}… created",
            "key": obj,
            "raw_key": raw,
        })
        add_never_cache_headers(response)
        return response

    def _owned(self, request, queryset):
        """The selected keys of tenants the user owns. The changelist also
        lists the keys of tenants the user only views: those are left as they
        are, and the user is told so."""
        owned = changeable_tenant_ids(request.user)
        if owned is None:
            return queryset
        viewed_only = queryset.exclude(tenant_id__in=owned).count()
        if viewed_only:
            whose = "their tenants" if viewed_only != 1 else "its tenant"
            self.message_user(
                request, f"{_keys(viewed_only)} left unchanged: you only view {whose}.", messages.ERROR,
            )
        return queryset.filter(tenant_id__in=owned)

    @admin.action(description="Revoke selected keys (closes their live sessions)",
                  permissions=["change"])
    def revoke_keys(self, request, queryset):
        keys = list(self._owned(request, queryset).exclude(status=ApiKey.Status.REVOKED))
        for key in keys:
            tenancy.key_revoke(key=key, by=request.user)
        if keys:
            self.message_user(request, f"{_keys(len(keys))} revoked; their live sessions are closing.",
                              messages.SUCCESS)

    @admin.action(description="Disable selected keys (closes their live sessions)",
                  permissions=["change"])
    def disable_keys(self, request, queryset):
        keys = list(self._owned(request, queryset).exclude(
            status__in=[ApiKey.Status.REVOKED, ApiKey.Status.DISABLED]))
        for key in keys:
            tenancy.key_update(key=key, by=request.user, changes={"status": ApiKey.Status.DISABLED})
        if keys:
            self.message_user(request, f"{_keys(len(keys))} disabled; their live sessions are closing.",
                              messages.SUCCESS)


def _keys(count: int) -> str:
    return f"{count} key{'s' if count != 1 else ''}"
