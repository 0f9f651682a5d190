"""Console forms: keys and memberships. Writes happen in the views through services."""
from __future__ import annotations

from django import forms
from django.conf import settings
from django.contrib.auth import get_user_model
from django.utils import timezone

from console.origins import parse_origin_lines
from tenants.models import Tenant, TenantMembership

MAX_SESSION_CAP = 10_000


class OriginsField(forms.CharField):
    """A textarea of origins, one per line; cleans to a list of normalised origins."""

    widget = forms.Textarea(attrs={"rows": 4, "cols": 50, "spellcheck": "false"})

    def __init__(self, **kwargs):
        kwargs.setdefault("required", False)
        kwargs.setdefault(
            "help_text",
            "One per line, like https://shop.example or http://localhost:8000 (no path). "
            "Leave empty to accept any origin.",
        )
        super().__init__(**kwargs)

    def prepare_value(self, value):
        if isinstance(value, (list, tuple)):
            return "\n".join(value)
        return value

    def clean(self, value):
        text = super().clean(value) or ""
        origins, errors = parse_origin_lines(text)
        if errors:
            raise forms.ValidationError(errors)
        return origins


def _cap_field() -> forms.IntegerField:
    return forms.IntegerField(
        label="Concurrent session cap",
        min_value=1,
        max_value=MAX_SESSION_CAP,
        initial=settings.OWLLAYER_DEFAULT_SESSION_CAP,
        help_text="Live sessions this key may hold at once; one more is refused.",
    )


class ApiKeyCreateForm(forms.Form):
    name = forms.CharField(max_length=200, help_text="For you: where the key is used.")
    allowed_origins = OriginsField()
    max_sessions = _cap_field()
    expires_at = forms.DateTimeField(
        label="Expires (UTC)",
        required=False,
        widget=forms.DateTimeInput(attrs={"type": "datetime-local"}, format="%Y-%m-%dT%H:%M"),
        input_formats=["%Y-%m-%dT%H:%M", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M", "%Y-%m-%d"],
        help_text="Optional. After this moment the key is refused.",
    )

    def clean_expires_at(self):
        expires_at = self.cleaned_data["expires_at"]
        if expires_at is not None and expires_at <= timezone.now():
            raise forms.ValidationError("the expiry must be in the future")
        return expires_at


class ApiKeyEditForm(forms.Form):
    name = forms.CharField(max_length=200)
    allowed_origins = OriginsField()
    max_sessions = _cap_field()


class MemberAddForm(forms.Form):
    user = forms.CharField(
        label="Username or email", max_length=254,
        help_text="The person must already have an account.",
    )
    role = forms.ChoiceField(choices=TenantMembership.Role.choices, initial=TenantMembership.Role.VIEWER)

    def __init__(self, *args, tenant: Tenant, **kwargs):
        super().__init__(*args, **kwargs)
        self.tenant = tenant

    def clean_user(self):
        identifier = self.cleaned_data["user"].strip()
        # Staff and superusers are the operators' accounts: a tenant owner
        # cannot pull them into a tenant (or learn that they exist).
        users = get_user_model().objects.filter(is_active=True, is_staff=False, is_superuser=False)
        user = users.filter(username=identifier).first()
        if user is None and "@" in identifier:
            matches = list(users.filter(email__iexact=identifier)[:2])
            if len(matches) > 1:
                raise forms.ValidationError("several accounts have this email; use the username")
            user = matches[0] if matches else None
        if user is None:
            raise forms.ValidationError("no account with this username or email")
        if TenantMembership.objects.filter(tenant=self.tenant, user=user).exists():
            raise forms.ValidationError("already a member of this tenant")
        return user


class MemberRoleForm(forms.Form):
    role = forms.ChoiceField(choices=TenantMembership.Role.choices)
