"""The protocol's records: publishable keys, sessions, the conversation, the
tool-call ledger, daily usage, the tokens reserved against a tenant's quota
while a model request runs, server processes, the operator actions
taken on keys and sessions, and the alerts POSTed to tenants' webhooks.

Tenants and their members live one floor down, in ``tenants.models``.
"""
from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from aitp.calls import FINAL as FINAL_CALL_STATUSES
from aitp.calls import CallStatus
from aitp.turn_state import TurnState
from tenants.models import Tenant


class ApiKey(models.Model):
    """A publishable key: a lookup prefix and a keyed hash, which the
    handshake checks, and the key itself, which is public by design (every
    page that uses it carries it; its allowed origins are what limit it), so
    that the console shows the key's snippet at any time."""

    class Status(models.TextChoices):
        ACTIVE = "active", "Active"
        DISABLED = "disabled", "Disabled"
        REVOKED = "revoked", "Revoked"

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="api_keys")
    name = models.CharField(max_length=200, blank=True, default="")
    prefix = models.CharField(max_length=32, unique=True)
    key_hash = models.CharField(max_length=64)
    # Empty for keys made before keys were kept: their snippet cannot be shown again.
    publishable = models.CharField("key", max_length=100, blank=True, default="", editable=False)
    allowed_origins = models.JSONField(
        default=list, blank=True, help_text="Exact Origin values; an empty list accepts any origin."
    )
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.ACTIVE)
    expires_at = models.DateTimeField(null=True, blank=True)
    max_sessions = models.PositiveIntegerField("session cap", default=10)
    # The agent of its sessions may hand the chat to a person (the built-in
    # server tool ``ask_for_a_person``, connection.handoff).
    handoff = models.BooleanField("agent may ask for a person", default=False)
    # How the drop-in widget looks and speaks on pages using this key
    # (widget.appearance.clean's dict; empty: the widget's defaults). Public:
    # GET /widget/appearance answers it to any page.
    widget_appearance = models.JSONField("appearance of the widget", default=dict, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        verbose_name = "API key"
        verbose_name_plural = "API keys"

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.name or 'unnamed'})"


class AudioSeconds:
    """The voice counts (milliseconds heard and spoken) as seconds: a
    session's, or a tenant's usage over some days."""

    audio_heard_ms: int
    audio_spoken_ms: int

    @property
    def audio_heard_seconds(self) -> float:
        return self.audio_heard_ms / 1000

    @property
    def audio_spoken_seconds(self) -> float:
        return self.audio_spoken_ms / 1000


class Session(AudioSeconds, models.Model):
    class State(models.TextChoices):
        # A turn's states come from the turn itself (agent.parts.TurnState).
        IDLE = TurnState.IDLE.value, "Idle"
        ANSWERING = TurnState.ANSWERING.value, "Agent answering"
        WAITING_TOOL = TurnState.WAITING_TOOL.value, "Waiting for a tool"
        WAITING_APPROVAL = TurnState.WAITING_APPROVAL.value, "Waiting for approval"
        ENDED = "ended", "Ended"

    id = models.CharField("session ID", primary_key=True, max_length=40)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="sessions")
    api_key = models.ForeignKey(ApiKey, on_delete=models.CASCADE, related_name="sessions",
                                verbose_name="API key")
    channel_name = models.CharField(max_length=200, blank=True, default="")
    # The server process holding the connection (ServerProcess.id): when
    # that process is gone, the session is too, whatever its last heartbeat.
    process = models.CharField(max_length=100, blank=True, default="", db_index=True)
    origin = models.CharField(max_length=500, blank=True, default="")
    user_agent = models.CharField(max_length=500, blank=True, default="")
    viewport = models.CharField(max_length=40, blank=True, default="")
    sdk_version = models.CharField("SDK version", max_length=40, blank=True, default="")
    protocol_version = models.CharField(max_length=40, blank=True, default="")
    started_at = models.DateTimeField(default=timezone.now)
    last_seen_at = models.DateTimeField(default=timezone.now)
    last_activity_at = models.DateTimeField(default=timezone.now)
    ended_at = models.DateTimeField(null=True, blank=True)
    close_code = models.PositiveIntegerField(null=True, blank=True)
    close_reason = models.CharField(max_length=200, blank=True, default="")
    state = models.CharField(max_length=20, choices=State.choices, default=State.IDLE)
    current_url = models.CharField("current URL", max_length=2000, blank=True, default="")
    title = models.CharField(max_length=500, blank=True, default="")
    context = models.JSONField(default=dict, blank=True)
    tools = models.JSONField(default=list, blank=True)
    page_history = models.JSONField(default=list, blank=True)
    turns = models.PositiveIntegerField(default=0)
    input_tokens = models.PositiveBigIntegerField(default=0)
    output_tokens = models.PositiveBigIntegerField(default=0)
    cache_read_tokens = models.PositiveBigIntegerField(default=0)
    cache_write_tokens = models.PositiveBigIntegerField(default=0)
    # Voice: milliseconds of the user's speech heard (utterances transcribed)
    # and of the agent's audio sent (a barge-in stops the count where it stopped the voice).
    audio_heard_ms = models.PositiveBigIntegerField("speech heard (ms)", default=0)
    audio_spoken_ms = models.PositiveBigIntegerField("speech spoken (ms)", default=0)
    # The SHA-256 of the secret of the session's resume token (aitp.resume),
    # replaced at every socket: "" when its client cannot resume.
    resume_token_hash = models.CharField(max_length=64, blank=True, default="")
    # How many times a new socket continued the session after its socket dropped;
    # the sockets before the current one (each {opened_at, closed_at, code,
    # reason}, oldest first) and when the current one opened (None: at the start).
    resumes = models.PositiveIntegerField(default=0)
    earlier_sockets = models.JSONField(default=list, blank=True)
    socket_opened_at = models.DateTimeField(null=True, blank=True)
    # Who the tenant's backend vouched for (the ``sub`` of a visitor token,
    # aitp.visitors): "" for an anonymous page. Links a visitor's conversations.
    visitor_id = models.CharField("visitor", max_length=128, blank=True, default="")
    # The operator who took the chat over from the agent (operators.handover), by
    # name as the page is told it, and since when: None while the agent answers.
    operator = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True,
                                 related_name="+", verbose_name="operator in charge")
    operator_name = models.CharField(max_length=150, blank=True, default="")
    taken_over_at = models.DateTimeField(null=True, blank=True)
    # The agent asked for a person and none has taken the chat over yet
    # (None: nobody is waited for), and why it asked.
    handoff_requested_at = models.DateTimeField(null=True, blank=True)
    handoff_reason = models.CharField(max_length=500, blank=True, default="")

    class Meta:
        ordering = ["-started_at"]
        indexes = [
            models.Index(fields=["tenant", "visitor_id", "started_at"], name="session_tenant_visitor_idx"),
            models.Index(fields=["api_key", "ended_at"], name="session_key_live_idx"),
            models.Index(fields=["tenant", "started_at"], name="session_tenant_started_idx"),
            # The tenant's live sessions, counted against its ceiling at every open.
            models.Index(fields=["tenant", "ended_at"], name="session_tenant_live_idx"),
        ]

    def __str__(self) -> str:
        return self.id

    @property
    def is_live(self) -> bool:
        return self.ended_at is None

    @property
    def sockets(self) -> list[dict]:
        """Every socket of the session, oldest first: {opened_at, closed_at,
        code, reason}; the current one's close is the session's, if ended."""
        earlier = [{**socket, "opened_at": parse_datetime(socket["opened_at"]),
                    "closed_at": parse_datetime(socket["closed_at"])} for socket in self.earlier_sockets]
        return [*earlier, {"opened_at": self.socket_opened_at or self.started_at,
                           "closed_at": self.ended_at, "code": self.close_code, "reason": self.close_reason}]

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens


class ServerProcess(models.Model):
    """A daphne process serving sessions: registered at start, refreshed while
    it runs, marked stopped on a clean exit. Sessions of a process that is
    gone are closed by the sweep of any process."""

    id = models.CharField(primary_key=True, max_length=100)
    hostname = models.CharField(max_length=200)
    pid = models.PositiveIntegerField("PID")
    started_at = models.DateTimeField(default=timezone.now)
    last_seen_at = models.DateTimeField(default=timezone.now)
    stopped_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-started_at"]
        verbose_name_plural = "server processes"

    def __str__(self) -> str:
        return self.id


class ConversationMessage(models.Model):
    """One message of the conversation as the model sees it (Anthropic content blocks)."""

    class Role(models.TextChoices):
        USER = "user", "User"
        ASSISTANT = "assistant", "Assistant"

    session = models.ForeignKey(Session, on_delete=models.CASCADE, related_name="messages")
    seq = models.PositiveIntegerField("number")
    turn = models.PositiveIntegerField(default=0)
    role = models.CharField(max_length=16, choices=Role.choices)
    content = models.JSONField(default=list)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["session", "seq"]
        constraints = [
            models.UniqueConstraint(fields=["session", "seq"], name="uniq_message_session_seq")
        ]


class ToolCall(models.Model):
    """The ledger: one row for every tool_use the model emitted."""

    class Origin(models.TextChoices):
        CLIENT = "client", "Interface (page)"
        SERVER = "server", "Server"

    # A call's states and its one transition table live in aitp.calls.
    Status = models.TextChoices("Status", [(s.name, (s.value, s.label)) for s in CallStatus])
    FINAL_STATUSES = frozenset(map(Status, sorted(s.value for s in FINAL_CALL_STATUSES)))

    session = models.ForeignKey(Session, on_delete=models.CASCADE, related_name="tool_calls")
    call_id = models.CharField("call ID", max_length=64, unique=True)
    tool_use_id = models.CharField("tool use ID", max_length=128)
    turn = models.PositiveIntegerField(default=0)
    name = models.CharField(max_length=64)
    arguments = models.JSONField(default=dict)
    risk = models.CharField(max_length=16, default="none")
    origin = models.CharField(max_length=16, choices=Origin.choices, default=Origin.CLIENT)
    status = models.CharField(max_length=20, choices=Status.choices, default=Status.PENDING)
    result = models.JSONField(null=True, blank=True)
    error = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(default=timezone.now)
    sent_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    duration_ms = models.PositiveIntegerField("duration (ms)", null=True, blank=True)

    class Meta:
        ordering = ["created_at"]
        indexes = [models.Index(fields=["session", "created_at"], name="toolcall_session_idx")]

    def __str__(self) -> str:
        return f"{self.name} ({self.call_id})"


class TurnRecord(models.Model):
    """One turn's figures, written with its last checkpoint: how it ended,
    where its time went, its tokens and their cost, its trace."""

    class Outcome(models.TextChoices):
        ANSWERED = "answered", "Answered"
        FAILED = "failed", "Failed"
        REFUSED = "refused", "Refused (token quota)"
        CUT = "cut", "Cut (barge-in, page gone)"

    session = models.ForeignKey(Session, on_delete=models.CASCADE, related_name="turn_records")
    number = models.PositiveIntegerField()
    started_at = models.DateTimeField()
    ended_at = models.DateTimeField()
    outcome = models.CharField(max_length=16, choices=Outcome.choices)
    error_code = models.CharField(max_length=64, blank=True, default="")
    first_text_ms = models.PositiveIntegerField("time to first text (ms)", null=True, blank=True)
    model_ms = models.PositiveIntegerField("model time (ms)", default=0)
    tools_ms = models.PositiveIntegerField("tool time (ms)", default=0)
    approval_ms = models.PositiveIntegerField("approval wait (ms)", default=0)
    input_tokens = models.PositiveIntegerField(default=0)
    output_tokens = models.PositiveIntegerField(default=0)
    cache_read_tokens = models.PositiveIntegerField(default=0)
    cache_write_tokens = models.PositiveIntegerField(default=0)
    # Millionths of a US dollar, at the prices of the turn's day (OWLLAYER_MODEL_PRICES);
    # None: the model has no price there.
    cost_micros = models.BigIntegerField("cost (millionths of USD)", null=True, blank=True)
    model = models.CharField(max_length=128, blank=True, default="")
    trace_id = models.CharField("trace ID", max_length=32, blank=True, default="")

    class Meta:
        ordering = ["session", "number"]
        constraints = [
            models.UniqueConstraint(fields=["session", "number"], name="uniq_turn_session_number")
        ]

    def __str__(self) -> str:
        return f"turn {self.number} of {self.session_id}"


class DailyUsage(models.Model):
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="daily_usage")
    date = models.DateField()
    sessions = models.PositiveIntegerField(default=0)
    turns = models.PositiveIntegerField(default=0)
    input_tokens = models.PositiveBigIntegerField(default=0)
    output_tokens = models.PositiveBigIntegerField(default=0)
    cache_read_tokens = models.PositiveBigIntegerField(default=0)
    cache_write_tokens = models.PositiveBigIntegerField(default=0)
    audio_heard_ms = models.PositiveBigIntegerField("speech heard (ms)", default=0)
    audio_spoken_ms = models.PositiveBigIntegerField("speech spoken (ms)", default=0)

    class Meta:
        ordering = ["-date"]
        verbose_name = "daily usage"
        verbose_name_plural = "daily usage"
        constraints = [
            models.UniqueConstraint(fields=["tenant", "date"], name="uniq_usage_tenant_date")
        ]


class TokenReservation(models.Model):
    """Model tokens set aside against a tenant's monthly quota while one
    model request runs (``aitp.quota``): an estimate of what the request may
    use, counted with the month's usage until the request ends and its real
    tokens are counted instead. A reservation counts until ``expires_at``,
    or until the sweep finds its process gone."""

    id = models.BigAutoField(primary_key=True)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="token_reservations")
    tokens = models.PositiveBigIntegerField()
    session_id = models.CharField("session ID", max_length=40, blank=True, default="")
    # The server process that made it (ServerProcess.id; "" when none is registered).
    process = models.CharField(max_length=100, blank=True, default="", db_index=True)
    created_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField()

    class Meta:
        ordering = ["created_at"]
        indexes = [models.Index(fields=["tenant", "expires_at"], name="reservation_tenant_idx")]

    def __str__(self) -> str:
        return f"{self.tokens} tokens for tenant {self.tenant_id}"


class OperatorAction(models.Model):
    """An action an operator or tenant member took on a session (recorded, never edited)."""

    session = models.ForeignKey(
        Session, on_delete=models.CASCADE, related_name="operator_actions", null=True, blank=True
    )
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="operator_actions")
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True
    )
    action = models.CharField(max_length=40)
    data = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-created_at"]


class AlertDelivery(models.Model):
    """One alert POSTed to a tenant's alert webhook (``aitp.alerts``): the
    attempts it took and how it ended, for the tenant's staff to check that
    their receiver takes them. Written by the notifier, never edited."""

    class Status(models.TextChoices):
        SENDING = "sending", "Sending"
        OK = "ok", "Delivered"
        FAILED = "failed", "Failed"

    id = models.BigAutoField(primary_key=True)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="alert_deliveries")
    kind = models.CharField(max_length=40)
    url = models.CharField("URL", max_length=500)
    attempts = models.PositiveSmallIntegerField(default=0)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.SENDING)
    # The last refusal's words, as the server's log has them ("webhook answered 500").
    last_error = models.CharField(max_length=500, blank=True, default="")
    # The receiver's answer to the last attempt that got one outside 2xx
    # (None: delivered, or no answer at all).
    status_code = models.PositiveSmallIntegerField("status code", null=True, blank=True)
    created_at = models.DateTimeField("started", default=timezone.now)
    finished_at = models.DateTimeField("finished", null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        verbose_name = "alert delivery"
        verbose_name_plural = "alert deliveries"
        indexes = [models.Index(fields=["tenant", "-created_at"], name="alert_delivery_tenant_idx")]

    def __str__(self) -> str:
        return f"{self.kind} to {self.tenant_id} ({self.status})"
