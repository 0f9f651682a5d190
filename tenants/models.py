"""Tenants and who may manage them: the ground floor every other app builds on.

A tenant is the customer (its name, the model's system prompt, its monthly
token quota, its ceilings on live sessions and keys); a membership says who may see it (viewer) or change it (owner).
Nothing here imports another app of the product, so the protocol app (keys,
sessions, usage) and the console, operator pages and approvals above it can
all point down to these rows.

The tables are still the ones the protocol app created (``aitp_tenant``,
``aitp_tenantmembership``): the models moved here without moving the data.
"""
from __future__ import annotations

import secrets

from django.conf import settings
from django.core.validators import MinValueValidator
from django.db import models
from django.utils import timezone

from runtime.config import config


def default_session_ceiling() -> int | None:
    """A new tenant's ceiling on live sessions (OWLLAYER_DEFAULT_TENANT_SESSION_CAP; 0: none)."""
    return config().store.default_tenant_session_cap or None


def default_key_ceiling() -> int | None:
    """A new tenant's ceiling on API keys (OWLLAYER_DEFAULT_TENANT_KEY_CAP; 0: none)."""
    return config().store.default_tenant_key_cap or None


def generate_alert_secret() -> str:
    """The secret signing a tenant's alert webhook (as a server tool's is made)."""
    return "whsec_" + secrets.token_urlsafe(32)


def generate_visitor_secret() -> str:
    """The secret a tenant's backend signs its visitor tokens with (HS256; aitp.visitors)."""
    return "vsec_" + secrets.token_urlsafe(32)


class Tenant(models.Model):
    slug = models.SlugField(max_length=64, unique=True)
    name = models.CharField(max_length=200)
    system_prompt = models.TextField(
        blank=True,
        default="You are a helpful assistant embedded in this web site. Be concise.",
        help_text="Sent to the model at the start of every turn, before the page context.",
    )
    monthly_token_quota = models.PositiveBigIntegerField(
        null=True,
        blank=True,
        help_text="Model tokens (input + output) this tenant may use per calendar month; "
        "empty or 0 means unlimited. Once used up, new sessions and turns are refused.",
    )
    # The tenant's own ceilings, above its keys' caps (set by the service's
    # operators): a tenant with many keys still holds at most this much.
    max_sessions = models.PositiveIntegerField(
        "live session ceiling",
        null=True,
        blank=True,
        default=default_session_ceiling,
        validators=[MinValueValidator(1)],
        help_text="Live sessions this tenant may hold at once, over all its keys; one more is "
        "refused (tenant_session_limit). Empty means no ceiling.",
    )
    max_keys = models.PositiveIntegerField(
        "key ceiling",
        null=True,
        blank=True,
        default=default_key_ceiling,
        validators=[MinValueValidator(1)],
        help_text="API keys this tenant may hold (active or disabled; revoked keys do not "
        "count); one more is refused. Empty means no ceiling.",
    )
    # Told, never enforced: the token quota above is the hard stop.
    monthly_budget_micros = models.PositiveBigIntegerField(
        "monthly budget (millionths of USD)",
        null=True,
        blank=True,
        help_text="The model cost this tenant means to spend per calendar month (UTC); its "
        "owners are told at 80% and 100% of it. Nothing is refused when it is spent. "
        "Empty means no budget.",
    )
    alert_webhook_url = models.URLField(
        "alert webhook",
        max_length=500,
        blank=True,
        help_text="Alerts (a chat asking for a person, an approval waiting for an operator, the monthly "
        "budget) are also POSTed here as signed JSON. Empty: e-mail only.",
    )
    alert_webhook_secret = models.CharField(
        max_length=128, default=generate_alert_secret,
        help_text="Signs the alert webhook's requests (X-OwlLayer-Signature).",
    )
    visitor_secret = models.CharField(
        max_length=128, default=generate_visitor_secret,
        help_text="Signs the visitor tokens of the tenant's backend (JWT, HS256), which link a "
        "visitor's conversations across visits and devices.",
    )
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        db_table = "aitp_tenant"
        ordering = ["slug"]

    def __str__(self) -> str:
        return self.slug


class TenantMembership(models.Model):
    class Role(models.TextChoices):
        OWNER = "owner", "Owner"
        VIEWER = "viewer", "Viewer"

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="tenant_memberships"
    )
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.VIEWER)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        db_table = "aitp_tenantmembership"
        verbose_name = "member"
        verbose_name_plural = "members"
        constraints = [
            models.UniqueConstraint(fields=["tenant", "user"], name="uniq_membership_tenant_user")
        ]

    def __str__(self) -> str:
        return f"{self.user} @ {self.tenant} ({self.role})"


class Invitation(models.Model):
    """An owner's invitation to join a tenant, sent to an e-mail address.

    The membership exists only once the person at that address accepts, signed
    in as the account with that address (or as the account the link lets a
    new person make). The link's token is shown nowhere but in the e-mail:
    only its SHA-256 is stored, and it works once, until ``expires_at``.
    """

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="invitations")
    email = models.EmailField(max_length=254, help_text="Stored in lower case.")
    role = models.CharField(max_length=16, choices=TenantMembership.Role.choices,
                            default=TenantMembership.Role.VIEWER)
    token_hash = models.CharField(max_length=64, unique=True)
    invited_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField()
    accepted_at = models.DateTimeField(null=True, blank=True)
    accepted_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    withdrawn_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["tenant", "email"], name="invitation_tenant_email")]

    def __str__(self) -> str:
        return f"{self.email} @ {self.tenant} ({self.role})"

    def is_pending(self, now) -> bool:
        return self.accepted_at is None and self.withdrawn_at is None and self.expires_at > now


class BudgetAlert(models.Model):
    """A budget alert sent: one per tenant, month and threshold. The process
    whose insert made the row is the one that sends it, so several processes
    checking at once tell the tenant once."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="budget_alerts")
    month = models.CharField(max_length=7, help_text="YYYY-MM (UTC).")
    threshold = models.PositiveSmallIntegerField(choices=[(80, "80%"), (100, "100%")])
    spent_micros = models.BigIntegerField("spent (millionths of USD)", default=0)
    budget_micros = models.BigIntegerField("budget (millionths of USD)", default=0)
    sent_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-sent_at"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "month", "threshold"],
                                    name="uniq_budget_alert_tenant_month_threshold")
        ]

    def __str__(self) -> str:
        return f"{self.tenant} {self.month} {self.threshold}%"
