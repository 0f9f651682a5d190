"""The configuration: one frozen object built from Django's settings.

``owllayer_site/settings.py`` reads the environment and is the only place a
default is written; this module reads the settings once into typed parts
(none of which has defaults of its own) and everything else reads the parts:
``config().llm.model``, ``config().voice.limits``. The object is built on
first use and built again whenever a setting changes (Django sends
``setting_changed`` for ``override_settings`` and pytest-django's
``settings`` fixture), so tests that change a setting see the change.

Backends (the LLM, speech to text, text to speech) are named by a dotted
path, imported with ``import_string``. Their settings take either a short
name from the site's table (``OWLLAYER_LLM=anthropic``) or a dotted path of
one's own; the part holds the name as given and the path it stands for.
Values derived from the configuration are cached with ``@derived`` and
forgotten with it.
"""
from __future__ import annotations

import shutil
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, TypeVar

from django.core.signals import setting_changed

T = TypeVar("T")

ESPEAK = "espeak-ng"


# --- the parts -----------------------------------------------------------------


@dataclass(frozen=True)
class ProtocolConfig:
    """The AITP endpoint and what one connection may send (settings OWLLAYER_WS_PATH, OWLLAYER_MAX_*)."""

    ws_path: str
    server_version: str
    handshake_timeout: float
    resume_window: float
    resume_hold: float
    handoff_wait: float
    max_message_bytes: int
    max_active_tools: int
    max_context_bytes: int
    max_invalid_frames: int
    max_input_chars: int
    max_json_depth: int
    frame_ceiling_bytes: int
    max_inbound_bytes: int
    max_outbound_bytes: int


@dataclass(frozen=True)
class LimitsConfig:
    """Rate limits (0 turns one off), shared through Redis when redis_url is set."""

    frames_per_second: int
    flood_close_drops: int
    user_inputs_per_minute: int
    approval_requests_per_call: int
    session_opens_per_key_per_minute: int
    redis_url: str
    prefix: str
    redis_timeout: float
    flood_log_interval: float


@dataclass(frozen=True)
class AgentConfig:
    """The agent's turn: the model asked, and how long and how far a turn may go."""

    model: str
    max_tokens: int
    tool_timeout: float
    approval_timeout: float
    max_tool_rounds: int
    history_messages: int
    stream_interval: float
    max_json_depth: int
    # (model or the start of its name, input, output, cache read, cache write), USD per million tokens.
    prices: tuple[tuple[str, float, float, float, float], ...]


@dataclass(frozen=True)
class LlmConfig:
    """The model backend: ``backend`` is the dotted path of its class, ``name`` the setting as given."""

    name: str
    backend: str
    api_key: str
    base_url: str | None
    max_retries: int
    timeout: float
    max_retry_wait: float
    # The SDK's OpenTelemetry spans per call (its ANTHROPIC_OPEN_TELEMETRY*
    # variables apply); off, no span attributes are worked out per request.
    traces: bool
    # Seconds the server's check of the key at start may take (0: no check).
    check_timeout: float


@dataclass(frozen=True)
class VoiceLimits:
    """One voice session's bounds: the longest utterance, microphone bytes
    per second, how long a stream may pause, server-side end of speech."""

    max_utterance_seconds: float
    bytes_per_second: int
    idle_seconds: float
    server_vad: bool
    vad_silence_seconds: float


@dataclass(frozen=True)
class PocketSphinxConfig:
    grammar: str  # path of a JSGF grammar file, or "" for the full language model
    # Seconds of vowels the phone-by-phone pass must hear for the words to
    # count (0: no such pass, whatever is heard counts).
    min_voiced_seconds: float


@dataclass(frozen=True)
class EspeakConfig:
    voice: str
    words_per_minute: int
    timeout: float
    # The program: found on the serving process's PATH when the configuration
    # is built ("" when it is not there), so that every worker runs the same one.
    program: str


@dataclass(frozen=True)
class HostedConfig:
    """OpenAI's audio endpoints, or any server speaking them."""

    api_key: str
    base_url: str
    stt_model: str
    tts_model: str
    tts_voice: str
    timeout: float

    def url(self, path: str) -> str:
        return self.base_url.rstrip("/") + path


@dataclass(frozen=True)
class SpeechPoolConfig:
    """The speech worker processes of one serving process, and one API key's share of them."""

    workers: int
    queue: int
    timeout: float
    jobs_per_key: int
    seconds_per_key_per_minute: float


@dataclass(frozen=True)
class VoiceConfig:
    enabled: bool
    stt: str  # the setting as given
    stt_backend: str  # the dotted path it stands for
    tts: str
    tts_backend: str
    send_ahead_seconds: float
    limits: VoiceLimits
    pocketsphinx: PocketSphinxConfig
    espeak: EspeakConfig
    hosted: HostedConfig
    pool: SpeechPoolConfig


@dataclass(frozen=True)
class StoreConfig:
    """Sessions, keys and processes in the database."""

    database_url: str
    implementation: str  # "fast" or "plain" (aitp.store)
    db_threads: int
    key_hash_secret: str
    default_session_cap: int
    default_tenant_session_cap: int
    default_tenant_key_cap: int
    heartbeat_interval: float
    sweep_interval: float
    shutdown_drain: float
    usage_flush_interval: float
    token_reservation_seconds: float
    budget_check_interval: float


@dataclass(frozen=True)
class WebhooksConfig:
    """Server tools' webhooks: how long, how much, and where they may go."""

    timeout: float
    max_bytes: int
    allowed_networks: tuple  # ipaddress networks: the ceiling
    ca_file: str


@dataclass(frozen=True)
class AuditConfig:
    """The audit chain's keys and its anchors ("" anchor_file / anchor_url: none)."""

    key: str
    old_keys: tuple[str, ...]
    anchor_file: str
    anchor_events: int
    anchor_seconds: float
    anchor_url: str
    anchor_timeout: float


@dataclass(frozen=True)
class ConsoleConfig:
    invitation_days: float
    invitation_sign_up: bool
    demo_key_file: Path


@dataclass(frozen=True)
class LoginConfig:
    """Login throttling (django-axes and the per-address limit)."""

    failure_limit: int
    address_failure_limit: int
    lockout_status: int


@dataclass(frozen=True)
class MetricsConfig:
    """The figures a host's monitoring reads (runtime.metrics, runtime.metrics_server)."""

    enabled: bool
    address: str  # host:port of the endpoint; "" serves none
    token: str  # "" asks none (the default address is the loopback one)
    directory: str  # shared by a host's processes; "" keeps one of the process's own


@dataclass(frozen=True)
class TracingConfig:
    """Traces of the agent's turns, for an OpenTelemetry collector (runtime.tracing)."""

    enabled: bool
    endpoint: str  # the collector's OTLP/HTTP base url; spans go to its /v1/traces
    service_name: str


@dataclass(frozen=True)
class SiteConfig:
    """The site itself: where it is installed, and the origins trusted besides its own host."""

    base_dir: Path
    trusted_origins: tuple[str, ...]
    log_format: str  # "text" or "json" (runtime.logs)


@dataclass(frozen=True)
class Config:
    site: SiteConfig
    protocol: ProtocolConfig
    limits: LimitsConfig
    agent: AgentConfig
    llm: LlmConfig
    voice: VoiceConfig
    store: StoreConfig
    webhooks: WebhooksConfig
    audit: AuditConfig
    console: ConsoleConfig
    login: LoginConfig
    metrics: MetricsConfig
    tracing: TracingConfig


# --- building it ---------------------------------------------------------------


def backend_path(choice: str, table: Mapping[str, str]) -> str:
    """The dotted path a backend setting stands for: a name from the site's
    table, or a dotted path as it is."""
    if choice in table:
        return table[choice]
    if "." in choice:
        return choice
    raise ValueError(f"unknown backend {choice!r}: one of {', '.join(table)} or a dotted path")


def build(s: Any) -> Config:
    """The configuration the settings ``s`` describe (every value read here, none defaulted)."""
    return Config(
        site=SiteConfig(
            base_dir=Path(s.BASE_DIR),
            trusted_origins=tuple(s.CSRF_TRUSTED_ORIGINS),
            log_format=s.OWLLAYER_LOG_FORMAT,
        ),
        protocol=ProtocolConfig(
            ws_path=s.OWLLAYER_WS_PATH,
            server_version=s.OWLLAYER_SERVER_VERSION,
            handshake_timeout=s.OWLLAYER_HANDSHAKE_TIMEOUT,
            resume_window=s.OWLLAYER_RESUME_WINDOW_SECONDS,
            resume_hold=s.OWLLAYER_RESUME_HOLD_SECONDS,
            handoff_wait=s.OWLLAYER_HANDOFF_WAIT_SECONDS,
            max_message_bytes=s.OWLLAYER_MAX_MESSAGE_BYTES,
            max_active_tools=s.OWLLAYER_MAX_ACTIVE_TOOLS,
            max_context_bytes=s.OWLLAYER_MAX_CONTEXT_BYTES,
            max_invalid_frames=s.OWLLAYER_MAX_INVALID_FRAMES,
            max_input_chars=s.OWLLAYER_MAX_INPUT_CHARS,
            max_json_depth=s.OWLLAYER_MAX_JSON_DEPTH,
            frame_ceiling_bytes=s.OWLLAYER_WS_FRAME_CEILING_BYTES,
            max_inbound_bytes=s.OWLLAYER_MAX_INBOUND_BYTES,
            max_outbound_bytes=s.OWLLAYER_MAX_OUTBOUND_BYTES,
        ),
        limits=LimitsConfig(
            frames_per_second=s.OWLLAYER_FRAMES_PER_SECOND,
            flood_close_drops=s.OWLLAYER_FLOOD_CLOSE_DROPS,
            user_inputs_per_minute=s.OWLLAYER_USER_INPUTS_PER_MINUTE,
            approval_requests_per_call=s.OWLLAYER_APPROVAL_REQUESTS_PER_CALL,
            session_opens_per_key_per_minute=s.OWLLAYER_SESSION_OPENS_PER_KEY_PER_MINUTE,
            redis_url=s.REDIS_URL,
            prefix=s.OWLLAYER_LIMITS_PREFIX,
            redis_timeout=s.OWLLAYER_REDIS_CONNECT_TIMEOUT,
            flood_log_interval=s.OWLLAYER_FLOOD_LOG_INTERVAL,
        ),
        agent=AgentConfig(
            model=s.OWLLAYER_MODEL,
            max_tokens=s.OWLLAYER_MAX_TOKENS,
            tool_timeout=s.OWLLAYER_TOOL_TIMEOUT,
            approval_timeout=s.OWLLAYER_APPROVAL_TIMEOUT,
            max_tool_rounds=s.OWLLAYER_MAX_TOOL_ROUNDS,
            history_messages=s.OWLLAYER_HISTORY_MESSAGES,
            stream_interval=s.OWLLAYER_STREAM_INTERVAL,
            max_json_depth=s.OWLLAYER_MAX_JSON_DEPTH,
            prices=s.OWLLAYER_MODEL_PRICES,
        ),
        llm=LlmConfig(
            name=s.OWLLAYER_LLM,
            backend=backend_path(s.OWLLAYER_LLM, s.OWLLAYER_LLM_BACKENDS),
            api_key=s.ANTHROPIC_API_KEY,
            base_url=s.ANTHROPIC_BASE_URL or None,
            max_retries=s.OWLLAYER_LLM_MAX_RETRIES,
            timeout=s.OWLLAYER_LLM_TIMEOUT,
            max_retry_wait=s.OWLLAYER_LLM_MAX_RETRY_WAIT,
            traces=s.OWLLAYER_LLM_TRACES,
            check_timeout=s.OWLLAYER_MODEL_CHECK_TIMEOUT,
        ),
        voice=VoiceConfig(
            enabled=s.OWLLAYER_VOICE,
            stt=s.OWLLAYER_STT,
            stt_backend=backend_path(s.OWLLAYER_STT, s.OWLLAYER_STT_BACKENDS),
            tts=s.OWLLAYER_TTS,
            tts_backend=backend_path(s.OWLLAYER_TTS, s.OWLLAYER_TTS_BACKENDS),
            send_ahead_seconds=s.OWLLAYER_VOICE_SEND_AHEAD_SECONDS,
            limits=VoiceLimits(
                max_utterance_seconds=s.OWLLAYER_VOICE_MAX_UTTERANCE_SECONDS,
                bytes_per_second=s.OWLLAYER_VOICE_BYTES_PER_SECOND,
                idle_seconds=s.OWLLAYER_VOICE_IDLE_SECONDS,
                server_vad=s.OWLLAYER_SERVER_VAD,
                vad_silence_seconds=s.OWLLAYER_VAD_SILENCE_SECONDS,
            ),
            pocketsphinx=PocketSphinxConfig(
                grammar=s.OWLLAYER_STT_GRAMMAR,
                min_voiced_seconds=s.OWLLAYER_STT_MIN_VOICED_SECONDS,
            ),
            espeak=EspeakConfig(
                voice=s.OWLLAYER_ESPEAK_VOICE,
                words_per_minute=s.OWLLAYER_ESPEAK_WPM,
                timeout=s.OWLLAYER_VOICE_TIMEOUT,
                program=shutil.which(ESPEAK) or "",
            ),
            hosted=HostedConfig(
                api_key=s.OWLLAYER_VOICE_API_KEY,
                base_url=s.OWLLAYER_VOICE_BASE_URL,
                stt_model=s.OWLLAYER_STT_MODEL,
                tts_model=s.OWLLAYER_TTS_MODEL,
                tts_voice=s.OWLLAYER_TTS_VOICE,
                timeout=s.OWLLAYER_VOICE_TIMEOUT,
            ),
            pool=SpeechPoolConfig(
                workers=s.OWLLAYER_VOICE_JOBS,
                queue=s.OWLLAYER_VOICE_QUEUE,
                timeout=s.OWLLAYER_VOICE_TIMEOUT,
                jobs_per_key=s.OWLLAYER_VOICE_JOBS_PER_KEY,
                seconds_per_key_per_minute=s.OWLLAYER_VOICE_SECONDS_PER_KEY_PER_MINUTE,
            ),
        ),
        store=StoreConfig(
            database_url=s.DATABASE_URL,
            implementation=s.OWLLAYER_STORE,
            db_threads=s.OWLLAYER_DB_THREADS,
            key_hash_secret=s.OWLLAYER_KEY_HASH_SECRET,
            default_session_cap=s.OWLLAYER_DEFAULT_SESSION_CAP,
            default_tenant_session_cap=s.OWLLAYER_DEFAULT_TENANT_SESSION_CAP,
            default_tenant_key_cap=s.OWLLAYER_DEFAULT_TENANT_KEY_CAP,
            heartbeat_interval=s.OWLLAYER_HEARTBEAT_INTERVAL,
            sweep_interval=s.OWLLAYER_SWEEP_INTERVAL,
            shutdown_drain=s.OWLLAYER_SHUTDOWN_DRAIN,
            usage_flush_interval=s.OWLLAYER_USAGE_FLUSH_INTERVAL,
            token_reservation_seconds=s.OWLLAYER_TOKEN_RESERVATION_SECONDS,
            budget_check_interval=s.OWLLAYER_BUDGET_CHECK_INTERVAL,
        ),
        webhooks=WebhooksConfig(
            timeout=s.OWLLAYER_WEBHOOK_TIMEOUT,
            max_bytes=s.OWLLAYER_WEBHOOK_MAX_BYTES,
            allowed_networks=tuple(s.OWLLAYER_WEBHOOK_ALLOWED_NETWORKS),
            ca_file=s.OWLLAYER_WEBHOOK_CA_FILE,
        ),
        audit=AuditConfig(
            key=s.OWLLAYER_AUDIT_KEY,
            old_keys=tuple(s.OWLLAYER_AUDIT_OLD_KEYS),
            anchor_file=s.OWLLAYER_AUDIT_ANCHOR_FILE,
            anchor_events=s.OWLLAYER_AUDIT_ANCHOR_EVENTS,
            anchor_seconds=s.OWLLAYER_AUDIT_ANCHOR_SECONDS,
            anchor_url=s.OWLLAYER_AUDIT_ANCHOR_URL,
            anchor_timeout=s.OWLLAYER_AUDIT_ANCHOR_TIMEOUT,
        ),
        console=ConsoleConfig(
            invitation_days=s.OWLLAYER_INVITATION_DAYS,
            invitation_sign_up=s.OWLLAYER_INVITATION_SIGN_UP,
            demo_key_file=Path(s.OWLLAYER_DEMO_KEY_FILE),
        ),
        login=LoginConfig(
            failure_limit=s.AXES_FAILURE_LIMIT,
            address_failure_limit=s.OWLLAYER_LOGIN_ADDRESS_FAILURE_LIMIT,
            # django-axes' own setting (its default lives in axes.conf).
            lockout_status=s.AXES_HTTP_RESPONSE_CODE,
        ),
        metrics=MetricsConfig(
            enabled=s.OWLLAYER_METRICS,
            address=s.OWLLAYER_METRICS_ADDRESS,
            token=s.OWLLAYER_METRICS_TOKEN,
            directory=s.OWLLAYER_METRICS_DIR,
        ),
        tracing=TracingConfig(
            enabled=s.OWLLAYER_TRACES,
            endpoint=s.OTEL_EXPORTER_OTLP_ENDPOINT,
            service_name=s.OTEL_SERVICE_NAME,
        ),
    )


# --- one per process, rebuilt when a setting changes ----------------------------

_lock = threading.Lock()
_current: Config | None = None
_derived: list = []


def config() -> Config:
    """The configuration of this process (built on first use)."""
    global _current
    current = _current
    if current is None:
        from django.conf import settings

        with _lock:
            if _current is None:
                _current = build(settings)
            current = _current
    return current


def derived(make: Callable[[], T]) -> Callable[[], T]:
    """``make()`` once, from ``config()``; again after the configuration was
    rebuilt. What it makes is shared by every caller: an immutable value."""
    cached = cache(make)
    _derived.append(cached)
    return cached


def rebuild(**_kwargs: Any) -> None:
    """Forget the configuration and what was derived from it: the next
    ``config()`` reads the settings again."""
    global _current
    with _lock:
        _current = None
    for cached in _derived:
        cached.cache_clear()


setting_changed.connect(rebuild, dispatch_uid="runtime.config.rebuild")
