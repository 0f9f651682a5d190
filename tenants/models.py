"""Tenants and who may manage them: the ground floor every other app builds on.

A tenant is the customer (its name, the model's system prompt, its monthly
token quota); a membership says who may see it (viewer) or change it (owner).
Nothing here imports another app of the product, so the protocol app (keys,
sessions, usage) and the console, operator pages and approvals above it can
all point down to these rows.

The tables are still the ones the protocol app created (``aitp_tenant``,
``aitp_tenantmembership``): the models moved here without moving the data.
"""
from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone


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
        constraints = [
            models.UniqueConstraint(fields=["tenant", "user"], name="uniq_membership_tenant_user")
        ]

    def __str__(self) -> str:
        return f"{self.user} @ {self.tenant} ({self.role})"
