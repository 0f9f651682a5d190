"""Console forms: keys, memberships, invitations and the budget. Writes happen in the views through services."""
from __future__ import annotations

from decimal import Decimal

from django import forms
from django.contrib.auth import get_user_model
from django.contrib.auth.forms import UserCreationForm
from django.core.validators import URLValidator
from django.utils import timezone

from console.origins import parse_origin_lines
from runtime.config import config
from tenants.models import TenantMembership
from widget import appearance

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
        initial=lambda: config().store.default_session_cap,
        help_text="Live sessions this key may hold at once; one more is refused.",
    )


def _handoff_field() -> forms.BooleanField:
    return forms.BooleanField(
        label="The agent may hand the chat to a person",
        required=False,
        help_text="When the page user asks for a person, or the agent cannot help, it asks an "
                  "operator to take the chat over on the admin's live pages, and the tenant's "
                  "alerts go out (owners' e-mail, the alert webhook). Applies to chats started "
                  "after saving.",
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
    handoff = _handoff_field()

    def clean_expires_at(self):
        expires_at = self.cleaned_data["expires_at"]
        if expires_at is not None and expires_at <= timezone.now():
            raise forms.ValidationError("the expiry must be in the future")
        return expires_at


class ApiKeyEditForm(forms.Form):
    name = forms.CharField(max_length=200)
    allowed_origins = OriginsField()
    max_sessions = _cap_field()
    handoff = _handoff_field()


class WidgetAppearanceForm(forms.Form):
    """How the key's widget looks and speaks; widget.appearance checks it
    (its lengths and forms), so that the form, the service and the widget's
    endpoint agree. ``read_only``: a viewer's, shown and never posted."""

    name = forms.CharField(
        label="Assistant's name", required=False,
        widget=forms.TextInput(attrs={"maxlength": appearance.MAX_NAME, "placeholder": "Assistant"}),
        help_text=f"The panel's heading, at most {appearance.MAX_NAME} characters. Empty: \"Assistant\".")
    greeting = forms.CharField(
        label="Greeting", required=False,
        widget=forms.Textarea(attrs={"rows": 3, "cols": 50, "maxlength": appearance.MAX_GREETING}),
        help_text=f"The assistant's first message, shown by the widget (the model does not see it), "
                  f"at most {appearance.MAX_GREETING} characters. Empty: none.")
    accent = forms.CharField(
        label="Accent colour", required=False,
        widget=forms.TextInput(attrs={"placeholder": "#1f5fd1", "size": 9, "spellcheck": "false"}),
        help_text="The launcher's and header's colour, written #rrggbb; their text is white or "
                  "near-black, whichever reads better on it. Empty: the widget's own colours, "
                  "light or dark as the visitor's setting.")
    position = forms.ChoiceField(
        label="Corner", choices=[("right", "Bottom right"), ("left", "Bottom left")], initial="right",
        widget=forms.RadioSelect)
    language = forms.ChoiceField(
        label="Language", choices=list(appearance.LANGUAGES.items()), initial="en",
        help_text="Of the widget's own words: buttons, status, the approval dialog and errors. "
                  "The assistant answers in the visitor's language whatever this says.")
    prompts = forms.CharField(
        label="Suggested prompts", required=False,
        widget=forms.Textarea(attrs={"rows": 4, "cols": 50}),
        help_text=f"One per line, up to {appearance.MAX_PROMPTS}, at most {appearance.MAX_PROMPT} "
                  "characters each: buttons under the greeting that send their text, gone after the "
                  "first message.")

    def __init__(self, *args, read_only: bool = False, **kwargs):
        # Its own ids: the key's edit page also has the key's form, whose "name" is the key's.
        kwargs.setdefault("auto_id", "appearance-%s")
        super().__init__(*args, **kwargs)
        for field in self.fields.values():
            field.disabled = read_only

    @staticmethod
    def initial_of(stored: dict) -> dict:
        shown = appearance.public(stored)
        return {**shown, "prompts": "\n".join(shown["prompts"])}

    def clean(self):
        data = super().clean()
        try:
            data["appearance"] = appearance.clean({field: data.get(field) for field in appearance.FIELDS})
        except appearance.AppearanceError as refused:
            for field, message in refused.errors.items():
                self.add_error(None if field == "__all__" else field, message[:1].upper() + message[1:])
        return data


class InviteForm(forms.Form):
    """Whom to invite: an e-mail address, never an account. Nothing here
    looks an account up, so the answer is the same whatever accounts exist."""

    email = forms.EmailField(label="E-mail address", max_length=254)
    role = forms.ChoiceField(choices=TenantMembership.Role.choices, initial=TenantMembership.Role.VIEWER)


class InvitationSignUpForm(UserCreationForm):
    """A new person's account, made through an invitation link: a username
    and a password (the e-mail address is the invited one)."""

    class Meta(UserCreationForm.Meta):
        model = get_user_model()
        fields = ("username",)


class MemberRoleForm(forms.Form):
    role = forms.ChoiceField(choices=TenantMembership.Role.choices)


class BudgetForm(forms.Form):
    """The monthly budget in US dollars (empty: none) and the alert webhook."""

    budget_usd = forms.DecimalField(
        label="Monthly budget (US$)", required=False, min_value=Decimal("0.01"),
        max_value=Decimal("1000000000"), max_digits=12, decimal_places=2,
        help_text="Model cost per calendar month (UTC). Empty: no budget, no alerts.",
    )
    alert_webhook_url = forms.URLField(
        label="Alert webhook", required=False, max_length=500, assume_scheme="https",
        validators=[URLValidator(schemes=["http", "https"])],
        help_text="Optional. Each alert is also POSTed here as signed JSON. Empty: e-mail only.",
    )

    def budget_micros(self) -> int | None:
        dollars = self.cleaned_data["budget_usd"]
        return None if dollars is None else int(dollars * 1_000_000)
