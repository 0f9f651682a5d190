"""Server-side tools, human approvals of risky tool calls, and the audit chain."""
from __future__ import annotations

import secrets

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import RegexValidator, URLValidator
from django.db import models
from django.utils import timezone

from aitp.tools import RISK_CHOICES, TOOL_NAME_RE, Risk, ToolError
from approvals.tool_specs import python_tool, spec_for_row
from approvals.webhook_addresses import parse_networks, within
from runtime.config import config

GENESIS_HASH = "0" * 64


# The one risk enum is aitp.tools.Risk; these are its database choices.
RISKS_NEEDING_APPROVAL = frozenset(r.value for r in Risk if r.needs_approval)


def higher_risk(*risks: str) -> str:
    """The highest of several risk levels (plain strings or str enums)."""
    return Risk.highest(*risks).value


class Policy(models.TextChoices):
    USER = "user", "The page user"
    OPERATOR = "operator", "An operator"
    USER_AND_OPERATOR = "user_and_operator", "The page user and an operator"


def policy_parties(policy: str) -> tuple[bool, bool]:
    """(needs_user, needs_operator) for an approval policy."""
    policy = Policy(policy)
    return (
        policy in (Policy.USER, Policy.USER_AND_OPERATOR),
        policy in (Policy.OPERATOR, Policy.USER_AND_OPERATOR),
    )


def generate_webhook_secret() -> str:
    return "whsec_" + secrets.token_urlsafe(32)


def default_webhook_timeout() -> float:
    return config().webhooks.timeout


def validate_webhook_networks(text: str) -> None:
    """Entries that parse and lie inside the operator's ceiling."""
    try:
        entries = parse_networks(text)
    except ValueError as exc:
        raise ValidationError(str(exc)) from None
    ceiling = config().webhooks.allowed_networks
    outside = [str(entry) for entry in entries if not within(entry, ceiling)]
    if outside:
        raise ValidationError(
            f"outside OWLLAYER_WEBHOOK_ALLOWED_NETWORKS ({', '.join(map(str, ceiling)) or 'empty'}): "
            + ", ".join(outside))


class ServerTool(models.Model):
    """A tool that runs on the server: a tenant's webhook or a registered Python handler."""

    class Kind(models.TextChoices):
        WEBHOOK = "webhook", "Webhook"
        PYTHON = "python", "Python (built in)"

    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.CASCADE, related_name="server_tools")
    name = models.CharField(
        max_length=64,
        validators=[RegexValidator(TOOL_NAME_RE, "letters, digits, _ and - only (1-64)")],
    )
    description = models.TextField(blank=True, default="")
    parameters = models.JSONField(
        null=True, blank=True,
        help_text='AITP schema with upper-case types, e.g. {"type": "OBJECT", "properties": {...}}.',
    )
    risk = models.CharField(max_length=16, choices=RISK_CHOICES, default=Risk.NONE.value)
    kind = models.CharField(max_length=16, choices=Kind.choices, default=Kind.WEBHOOK)
    webhook_url = models.CharField(
        "webhook URL", max_length=2000, blank=True, default="",
        validators=[URLValidator(schemes=["http", "https"])],
    )
    webhook_secret = models.CharField(max_length=128, default=generate_webhook_secret)
    timeout_seconds = models.FloatField(default=default_webhook_timeout)
    # Not a choices field: the registered handlers live in code and would make
    # a migration every time one is added. clean() and the admin form check it.
    python_handler = models.CharField(max_length=64, blank=True, default="")
    approval_policy = models.CharField(max_length=24, choices=Policy.choices, default=Policy.USER)
    enabled = models.BooleanField(default=True)
    # Set by superusers only (the admin shows it to no one else): a tenant
    # must not open the server's own network to itself.
    webhook_networks = models.TextField(
        blank=True, default="", validators=[validate_webhook_networks],
        help_text="Networks this webhook may reach although not public, inside "
                  "OWLLAYER_WEBHOOK_ALLOWED_NETWORKS: one per line, each a network, optionally "
                  "with ports (10.20.0.0/16, 10.20.0.7:8443, [fd00:1::/64]:443,8443).",
    )
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["tenant", "name"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "name"], name="uniq_servertool_tenant_name")
        ]

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        errors: dict[str, str] = {}
        if self.kind == self.Kind.WEBHOOK and not self.webhook_url:
            errors["webhook_url"] = "a webhook tool needs a url"
        if self.kind == self.Kind.PYTHON and python_tool(self.python_handler) is None:
            errors["python_handler"] = "not a registered python tool"
        if self.timeout_seconds is not None and self.timeout_seconds <= 0:
            errors["timeout_seconds"] = "must be positive"
        if not errors:
            try:
                spec_for_row(self)
            except ToolError as exc:
                field = "parameters" if ".parameters" in exc.message else "description"
                errors[field] = exc.message
        if errors:
            raise ValidationError(errors)


class Approval(models.Model):
    """One request for a human decision on one tool call."""

    class Status(models.TextChoices):
        PENDING = "pending", "Pending"
        APPROVED = "approved", "Approved"
        DENIED = "denied", "Denied"
        EXPIRED = "expired", "Expired"
        CANCELLED = "cancelled", "Cancelled"
        DISCONNECTED = "disconnected", "Client disconnected"
        # The page answered a high or critical call without asking its user
        # first: the answer was refused and the row waits in the review queue.
        VIOLATION = "violation", "Approval skipped (refused)"

    class Origin(models.TextChoices):
        CLIENT = "client", "Interface (page)"
        SERVER = "server", "Server"

    class Decision(models.TextChoices):
        APPROVED = "approved", "Approved"
        DENIED = "denied", "Denied"

    class ReviewStatus(models.TextChoices):
        UNREVIEWED = "unreviewed", "Unreviewed"
        REVIEWED = "reviewed", "Reviewed"

    class Verdict(models.TextChoices):
        NONE = "", "-"
        OK = "ok", "OK"
        CONCERN = "concern", "Concern"

    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.CASCADE, related_name="approvals")
    session = models.ForeignKey("aitp.Session", on_delete=models.CASCADE, related_name="approvals")
    tool_call = models.OneToOneField(
        "aitp.ToolCall", on_delete=models.CASCADE, related_name="approval"
    )
    tool_name = models.CharField(max_length=64)
    arguments = models.JSONField(default=dict)
    args_hash = models.CharField("arguments hash", max_length=64)
    risk = models.CharField(max_length=16, choices=RISK_CHOICES)
    origin = models.CharField(max_length=16, choices=Origin.choices)
    policy = models.CharField(max_length=24, choices=Policy.choices, default=Policy.USER)
    message = models.TextField(blank=True, default="")
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    needs_user = models.BooleanField(default=True)
    needs_operator = models.BooleanField(default=False)
    user_decision = models.CharField(max_length=16, choices=Decision.choices, null=True, blank=True)
    user_decided_at = models.DateTimeField(null=True, blank=True)
    operator_decision = models.CharField(
        max_length=16, choices=Decision.choices, null=True, blank=True
    )
    operator = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True,
        related_name="approval_decisions",
    )
    operator_note = models.TextField(blank=True, default="")
    operator_decided_at = models.DateTimeField(null=True, blank=True)
    deadline = models.DateTimeField()
    created_at = models.DateTimeField(default=timezone.now)
    decided_at = models.DateTimeField(null=True, blank=True)
    review_status = models.CharField(
        max_length=16, choices=ReviewStatus.choices, default=ReviewStatus.UNREVIEWED
    )
    review_verdict = models.CharField(
        max_length=16, choices=Verdict.choices, blank=True, default=Verdict.NONE
    )
    review_note = models.TextField(blank=True, default="")
    reviewed_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True,
        related_name="approval_reviews",
    )
    reviewed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [
            models.Index(fields=["status", "needs_operator"], name="approval_status_op_idx"),
            models.Index(fields=["tenant", "created_at"], name="approval_tenant_created_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.tool_name} ({self.status})"

    @property
    def call_id(self) -> str:
        return self.tool_call.call_id

    @property
    def is_pending(self) -> bool:
        return self.status == self.Status.PENDING


class PendingApproval(Approval):
    """The operator queue: pending approvals still waiting for an operator."""

    class Meta:
        proxy = True
        verbose_name = "pending approval"
        verbose_name_plural = "pending approvals"


class ReviewedApproval(Approval):
    """The review queue: decided approvals of high or critical risk."""

    class Meta:
        proxy = True
        verbose_name = "approval to review"
        verbose_name_plural = "approvals to review"


class AuditChainHead(models.Model):
    """A single row holding the end of the audit chain. Appenders lock it, so
    two processes can never both link a new event to the same predecessor."""

    SINGLETON_PK = 1

    last_seq = models.PositiveBigIntegerField(default=0)
    last_hash = models.CharField(max_length=64, default=GENESIS_HASH)
    # The first event hashed with the audit key (approvals.audit): events
    # before it are plain SHA-256 links written before keyed hashing began.
    keyed_from = models.PositiveBigIntegerField(default=1)

    class Meta:
        default_permissions = ()


class AppendOnlyQuerySet(models.QuerySet):
    def update(self, **kwargs):
        raise TypeError("audit events are append-only")

    def delete(self):
        raise TypeError("audit events are append-only")

    def bulk_create(self, *args, **kwargs):
        raise TypeError("audit events are appended one by one through approvals.audit")

    def bulk_update(self, *args, **kwargs):
        raise TypeError("audit events are append-only")


class AuditEvent(models.Model):
    """One link of the tamper-evident log of approvals. Append with
    approvals.audit.append_event; check with approvals.audit.verify_chain."""

    class Action(models.TextChoices):
        REQUESTED = "requested", "Requested"
        EXTENDED = "extended", "Extended"
        MISMATCH = "mismatch", "Arguments mismatch"
        APPROVED = "approved", "Approved"
        DENIED = "denied", "Denied"
        EXPIRED = "expired", "Expired"
        CANCELLED = "cancelled", "Cancelled"
        DISCONNECTED = "disconnected", "Disconnected"
        EXECUTED = "executed", "Executed"
        FAILED = "failed", "Failed"
        REVIEWED = "reviewed", "Reviewed"
        VIOLATION = "violation", "Approval skipped"
        TAKEN_OVER = "taken_over", "Chat taken over"
        HANDED_BACK = "handed_back", "Chat handed back"

    class ActorKind(models.TextChoices):
        PAGE = "page", "Page user"
        OPERATOR = "operator", "Operator"
        SYSTEM = "system", "System"

    class Channel(models.TextChoices):
        PAGE = "page", "Page"
        ADMIN = "admin", "Admin"
        CONSOLE = "console", "Console"
        SYSTEM = "system", "System"

    seq = models.PositiveBigIntegerField("number", unique=True)
    # The log must outlive what it describes and keep the exact ids it hashed:
    # no database constraint and no cascade, so deleting a tenant or a session
    # leaves its history (and the chain) intact.
    tenant = models.ForeignKey(
        "tenants.Tenant", on_delete=models.DO_NOTHING, db_constraint=False, related_name="+"
    )
    approval = models.ForeignKey(
        Approval, on_delete=models.DO_NOTHING, db_constraint=False, null=True, blank=True,
        related_name="audit_events",
    )
    session_id = models.CharField("session ID", max_length=40, blank=True, default="")
    call_id = models.CharField("call ID", max_length=64, blank=True, default="")
    action = models.CharField(max_length=16, choices=Action.choices)
    actor_kind = models.CharField(max_length=16, choices=ActorKind.choices)
    actor = models.CharField(max_length=150, blank=True, default="")
    channel = models.CharField(max_length=16, choices=Channel.choices)
    args_hash = models.CharField("arguments hash", max_length=64, blank=True, default="")
    data = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField()
    prev_hash = models.CharField(max_length=64)
    hash = models.CharField(max_length=64)
    # The id of the audit key whose HMAC ``hash`` is (never the key); empty
    # for the plain SHA-256 events before the keyed chain began.
    key_id = models.CharField("key ID", max_length=16, blank=True, default="")

    objects = AppendOnlyQuerySet.as_manager()

    class Meta:
        ordering = ["seq"]
        # Rows are written only by approvals.audit; the admin shows them.
        default_permissions = ("view",)

    def __str__(self) -> str:
        return f"#{self.seq} {self.action}"

    def save(self, *args, **kwargs):
        if not self._state.adding:
            raise TypeError("audit events are append-only")
        kwargs["force_insert"] = True
        super().save(*args, **kwargs)

    def delete(self, *args, **kwargs):
        raise TypeError("audit events are append-only")
