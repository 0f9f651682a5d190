"""OwlLayer Server settings: everything comes from the environment, read here.

Each helper fails loudly on a value it cannot use, so a typo in a deployment
stops the process at start-up instead of changing behaviour silently.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent


def env_str(name: str, default: str) -> str:
    return os.environ.get(name, default)


def env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    value = raw.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ImproperlyConfigured(f"{name} must be a boolean (true/false), got {raw!r}")


def env_int(name: str, default: int, *, minimum: int = 0) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name} must be an integer, got {raw!r}") from None
    if value < minimum:
        raise ImproperlyConfigured(f"{name} must be >= {minimum}, got {value}")
    return value


def env_float(name: str, default: float, *, minimum: float = 0.0) -> float:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name} must be a number, got {raw!r}") from None
    if value < minimum:
        raise ImproperlyConfigured(f"{name} must be >= {minimum}, got {value}")
    return value


def env_list(name: str, default: list[str]) -> list[str]:
    raw = os.environ.get(name)
    if raw is None:
        return default
    return [item.strip() for item in raw.split(",") if item.strip()]


def env_networks(name: str) -> tuple:
    """Comma-separated CIDRs (IPv4 or IPv6) as ipaddress networks."""
    import ipaddress

    networks = []
    for item in env_list(name, []):
        try:
            networks.append(ipaddress.ip_network(item, strict=False))
        except ValueError:
            raise ImproperlyConfigured(f"{name} must be CIDRs such as 10.0.0.0/8, got {item!r}") from None
    return tuple(networks)


def env_choice(name: str, default: str, choices: tuple[str, ...] | dict[str, str], *,
               or_dotted_path: bool = False) -> str:
    """One of ``choices``; with ``or_dotted_path``, a dotted path of one's own
    is taken too (a backend's class, which runtime/config.py imports)."""
    value = os.environ.get(name) or default
    if value not in choices and not (or_dotted_path and "." in value):
        also = " or a dotted path" if or_dotted_path else ""
        raise ImproperlyConfigured(f"{name} must be one of {', '.join(choices)}{also}, got {value!r}")
    return value


DEBUG = env_bool("DJANGO_DEBUG", False)
SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "")
if not SECRET_KEY:
    if not DEBUG and os.environ.get("OWLLAYER_INSECURE_DEV_SECRET") != "1":
        raise ImproperlyConfigured(
            "DJANGO_SECRET_KEY is not set. For local use on this machine, set "
            "DJANGO_DEBUG=true (make run does), e.g. DJANGO_DEBUG=true .venv/bin/python "
            "manage.py createsuperuser. For a deployment, set DJANGO_SECRET_KEY to a long "
            "random value, e.g. the output of: python3 -c 'import secrets; "
            "print(secrets.token_urlsafe(50))'"
        )
    SECRET_KEY = "owllayer-insecure-development-secret-do-not-deploy"
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]"])
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "channels",
    "tenants",  # the ground floor: tenants and who may manage them
    "aitp",
    "approvals",
    "console",
    "demo",
    "operators",
    "axes",  # login throttling: see docs/security.md
]

MIDDLEWARE = [
    # Health checks, before the Host check and the HTTPS redirect (owllayer_site/probes.py).
    "owllayer_site.probes.probes",
    "django.middleware.security.SecurityMiddleware",
    # daphne serves no static files: the admin's and the console's CSS and JS
    # come from here (found in the apps directly, no collectstatic needed).
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "csp.middleware.CSPMiddleware",
    # Last, as django-axes asks: it turns a locked-out login into its answer.
    "axes.middleware.AxesMiddleware",
]

# --- Security: HTTPS, CSP, login throttling ----------------------------------
# Behind TLS (directly or at a proxy), OWLLAYER_HTTPS=true turns on what
# `manage.py check --deploy` asks for: HTTPS redirect, HSTS, Secure cookies.
OWLLAYER_HTTPS = env_bool("OWLLAYER_HTTPS", False)
if OWLLAYER_HTTPS:
    # (A proxy's health checks, over plain HTTP, are answered before the
    # redirect: owllayer_site/probes.py.)
    SECURE_SSL_REDIRECT = env_bool("OWLLAYER_SSL_REDIRECT", True)
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    SECURE_HSTS_SECONDS = env_int("OWLLAYER_HSTS_SECONDS", 31536000, minimum=0)
    SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("OWLLAYER_HSTS_INCLUDE_SUBDOMAINS", True)
    SECURE_HSTS_PRELOAD = env_bool("OWLLAYER_HSTS_PRELOAD", True)
    # Set only behind a proxy that terminates TLS and always sets the header.
    if env_bool("OWLLAYER_TRUST_X_FORWARDED_PROTO", False):
        SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
SESSION_COOKIE_HTTPONLY = True

# Content-Security-Policy (django-csp): scripts only from this site (inline
# ones carry the response's nonce), the WebSocket only to this host.
from csp.constants import NONCE, SELF  # noqa: E402

CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": [SELF],
        "script-src": [SELF, NONCE],
        # The admin and the templates use style attributes.
        "style-src": [SELF, "'unsafe-inline'"],
        "img-src": [SELF, "data:"],
        "font-src": [SELF],
        "connect-src": [SELF],
        "object-src": ["'none'"],
        "base-uri": [SELF],
        "form-action": [SELF],
        "frame-ancestors": ["'none'"],
    },
}

# django-axes: OWLLAYER_LOGIN_FAILURE_LIMIT failed logins for one username
# from one address lock that pair out (that account from that address, even
# with the right password); OWLLAYER_LOGIN_ADDRESS_FAILURE_LIMIT failures
# from one address over any usernames lock the address (password spraying).
# Someone else's mistakes, from another address or on another account, never
# lock an account out. Each lock lasts OWLLAYER_LOGIN_COOLOFF_MINUTES (1 in
# debug mode, so a local mistake costs a minute). Attempts live in the
# database, shared by every process; owllayer_site/login_throttling.py counts
# the address and draws the lockout page.
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]
from datetime import timedelta  # noqa: E402

AXES_FAILURE_LIMIT = env_int("OWLLAYER_LOGIN_FAILURE_LIMIT", 5, minimum=1)
OWLLAYER_LOGIN_ADDRESS_FAILURE_LIMIT = env_int(
    "OWLLAYER_LOGIN_ADDRESS_FAILURE_LIMIT", 10 * AXES_FAILURE_LIMIT, minimum=AXES_FAILURE_LIMIT
)
AXES_COOLOFF_TIME = timedelta(
    minutes=env_float("OWLLAYER_LOGIN_COOLOFF_MINUTES", 1.0 if DEBUG else 15.0, minimum=0.1)
)
# Behind a proxy, run daphne with --proxy-headers so the address is the client's.
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_HANDLER = "owllayer_site.login_throttling.LoginThrottlingHandler"
AXES_LOCKOUT_CALLABLE = "owllayer_site.login_throttling.lockout_response"
AXES_RESET_ON_SUCCESS = True
# A try while locked out is refused without being counted, so a lock ends
# when its page says it does.
AXES_RESET_COOL_OFF_ON_FAILURE_DURING_LOCKOUT = False
AXES_ENABLED = env_bool("OWLLAYER_LOGIN_THROTTLING", True)
# A locked-out login's answer: 429 Too Many Requests (django-axes' own choice, written here).
AXES_HTTP_RESPONSE_CODE = 429

ROOT_URLCONF = "owllayer_site.urls"
ASGI_APPLICATION = "owllayer_site.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "owllayer_site.context_processors.model_access_problem",
            ],
        },
    },
]

# --- Database -------------------------------------------------------------
import dj_database_url  # noqa: E402

DATABASE_URL = os.environ.get("DATABASE_URL") or f"sqlite:///{BASE_DIR / 'db.sqlite3'}"
try:
    DATABASES = {"default": dj_database_url.parse(DATABASE_URL, conn_max_age=0)}
except Exception as exc:  # dj_database_url raises a bare ValueError / KeyError
    raise ImproperlyConfigured(f"DATABASE_URL is not a usable database URL: {exc}") from None
_database = DATABASES["default"]
_database.setdefault("OPTIONS", {})
if _database["ENGINE"] == "django.db.backends.sqlite3":
    # Several sessions write from their own database threads: wait for the
    # lock instead of failing at once.
    _database["OPTIONS"]["timeout"] = 20
    # Take the write lock when a transaction starts, so concurrent writers
    # wait for it instead of failing half way with "database is locked".
    _database["OPTIONS"]["transaction_mode"] = "IMMEDIATE"
    # Write-ahead log: readers never wait for the writer, and a commit is one
    # append instead of a rewritten journal. synchronous=NORMAL syncs at
    # checkpoints, not at every commit: a crash of the process loses nothing,
    # a power cut may lose the last commits (never corrupts the file).
    _database["OPTIONS"]["init_command"] = "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL"
    # A connection costs a file open and set-up: each database thread keeps its own.
    _database["CONN_MAX_AGE"] = None
    _database["TEST"] = {"NAME": str(BASE_DIR / "test-db.sqlite3")}
    # One file, one writer at a time: a second thread mostly waits for the
    # write lock, and SQLite's lock wait sleeps in steps of up to 100 ms.
    OWLLAYER_DB_THREADS = env_int("OWLLAYER_DB_THREADS", 1, minimum=1)
else:
    # Threads running the database calls of this process's sessions at once
    # (runtime/db.py); each holds a pooled connection only while it works.
    OWLLAYER_DB_THREADS = env_int("OWLLAYER_DB_THREADS", 8, minimum=1)
if _database["ENGINE"] == "django.db.backends.postgresql":
    # Django's pool (psycopg_pool): a call borrows an open connection instead
    # of opening one. The pool serves the database threads and the admin and
    # console views. OWLLAYER_DB_POOL_MAX=0 turns it off (e.g. behind
    # PgBouncer): one connection per call, as before.
    OWLLAYER_DB_POOL_MIN = env_int("OWLLAYER_DB_POOL_MIN", 2)
    OWLLAYER_DB_POOL_MAX = env_int("OWLLAYER_DB_POOL_MAX", OWLLAYER_DB_THREADS + 8)
    OWLLAYER_DB_POOL_TIMEOUT = env_float("OWLLAYER_DB_POOL_TIMEOUT", 10.0, minimum=0.1)
    if OWLLAYER_DB_POOL_MAX:
        if OWLLAYER_DB_POOL_MAX < OWLLAYER_DB_POOL_MIN:
            raise ImproperlyConfigured(
                f"OWLLAYER_DB_POOL_MAX ({OWLLAYER_DB_POOL_MAX}) must be at least "
                f"OWLLAYER_DB_POOL_MIN ({OWLLAYER_DB_POOL_MIN})"
            )
        _database["CONN_MAX_AGE"] = 0  # the pool keeps the connections
        _database["OPTIONS"]["pool"] = {
            "min_size": OWLLAYER_DB_POOL_MIN,
            "max_size": OWLLAYER_DB_POOL_MAX,
            "timeout": OWLLAYER_DB_POOL_TIMEOUT,
            # Connections above min_size close after a minute unused.
            "max_idle": 60.0,
        }
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- Channel layer --------------------------------------------------------
REDIS_URL = os.environ.get("REDIS_URL", "")
# How long a connection to Redis may take to open (the channel layer's, the
# shared rate limits', the start-up check's).
OWLLAYER_REDIS_CONNECT_TIMEOUT = env_float("OWLLAYER_REDIS_CONNECT_TIMEOUT", 3.0, minimum=0.1)
if REDIS_URL:
    if not REDIS_URL.startswith(("redis://", "rediss://", "unix://")):
        raise ImproperlyConfigured(f"REDIS_URL must be a redis:// URL, got {REDIS_URL!r}")
    from urllib.parse import urlsplit

    try:
        _ = urlsplit(REDIS_URL).port  # the port is only checked when read
    except ValueError as exc:
        raise ImproperlyConfigured(f"REDIS_URL is not a usable redis:// URL: {exc}") from None
    # A consumer's channel receive is a blocking read of this many seconds;
    # the socket timeout must outlast it, or every idle receive ends in a read
    # timeout (redis-py's default, 5 s, equals channels-redis' blocking read).
    OWLLAYER_REDIS_BLOCKING_READ = env_int("OWLLAYER_REDIS_BLOCKING_READ", 5, minimum=1)
    OWLLAYER_REDIS_SOCKET_TIMEOUT = env_float("OWLLAYER_REDIS_SOCKET_TIMEOUT", 15.0, minimum=1.0)
    if OWLLAYER_REDIS_SOCKET_TIMEOUT < OWLLAYER_REDIS_BLOCKING_READ + 2:
        raise ImproperlyConfigured(
            "OWLLAYER_REDIS_SOCKET_TIMEOUT must be at least OWLLAYER_REDIS_BLOCKING_READ + 2 s, "
            f"got {OWLLAYER_REDIS_SOCKET_TIMEOUT} and {OWLLAYER_REDIS_BLOCKING_READ}"
        )
    OWLLAYER_REDIS_HEALTH_CHECK_INTERVAL = env_int("OWLLAYER_REDIS_HEALTH_CHECK_INTERVAL", 30)
    OWLLAYER_REDIS_RETRY_MAX = env_float("OWLLAYER_REDIS_RETRY_MAX", 2.0, minimum=0.1)
    CHANNEL_LAYERS = {
        "default": {
            # channels-redis that survives Redis going away and restarting empty.
            "BACKEND": "owllayer_site.channel_layer.ResilientRedisChannelLayer",
            "CONFIG": {
                "hosts": [{
                    "address": REDIS_URL,
                    "socket_timeout": OWLLAYER_REDIS_SOCKET_TIMEOUT,
                    "socket_connect_timeout": OWLLAYER_REDIS_CONNECT_TIMEOUT,
                    "health_check_interval": OWLLAYER_REDIS_HEALTH_CHECK_INTERVAL,
                }],
                "prefix": env_str("OWLLAYER_CHANNEL_PREFIX", "owllayer"),
                "capacity": 1000,
                "expiry": 30,
                "blocking_read": OWLLAYER_REDIS_BLOCKING_READ,
                "retry_max": OWLLAYER_REDIS_RETRY_MAX,
            },
        }
    }
else:
    # Channels' in-memory layer, sweeping expired messages once a second
    # instead of on every message (owllayer_site/channel_layer.py).
    CHANNEL_LAYERS = {"default": {"BACKEND": "owllayer_site.channel_layer.InMemoryChannelLayer"}}

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]
LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True
# One way to write a moment on every page (the admin, the console, the live
# and approval pages): "3 Dec 2026, 14:05", in TIME_ZONE, which each page
# names. The English format module below hands these to Django in place of
# its own ("Dec. 3, 2026, 2:05 p.m."); owl_display's filters use them too.
DATE_FORMAT = SHORT_DATE_FORMAT = "j M Y"
DATETIME_FORMAT = SHORT_DATETIME_FORMAT = "j M Y, H:i"
TIME_FORMAT = "H:i"
YEAR_MONTH_FORMAT = "M Y"
MONTH_DAY_FORMAT = "j M"
FORMAT_MODULE_PATH = ["owllayer_site.formats"]
STATIC_URL = "static/"
# Only for `manage.py collectstatic` (then served from there); without it
# the files are served straight from the apps.
STATIC_ROOT = os.environ.get("DJANGO_STATIC_ROOT") or None
WHITENOISE_USE_FINDERS = True
# The browser client (static/owllayer/owllayer-client.js), for any page.
STATICFILES_DIRS = [BASE_DIR / "static"]
LOGIN_URL = "/console/login/"
LOGIN_REDIRECT_URL = "/console/"

# --- E-mail (console invitations) -------------------------------------------
# Debug mode prints each e-mail on the server's output instead of sending it.
EMAIL_BACKEND = env_str(
    "EMAIL_BACKEND",
    "django.core.mail.backends.console.EmailBackend" if DEBUG else "django.core.mail.backends.smtp.EmailBackend",
)
EMAIL_HOST = env_str("EMAIL_HOST", "localhost")
EMAIL_PORT = env_int("EMAIL_PORT", 25, minimum=1)
EMAIL_HOST_USER = env_str("EMAIL_HOST_USER", "")
EMAIL_HOST_PASSWORD = env_str("EMAIL_HOST_PASSWORD", "")
EMAIL_USE_TLS = env_bool("EMAIL_USE_TLS", False)
EMAIL_USE_SSL = env_bool("EMAIL_USE_SSL", False)
if EMAIL_USE_TLS and EMAIL_USE_SSL:
    raise ImproperlyConfigured("EMAIL_USE_TLS and EMAIL_USE_SSL cannot both be true")
EMAIL_TIMEOUT = env_float("EMAIL_TIMEOUT", 10.0, minimum=0.1)
DEFAULT_FROM_EMAIL = env_str("DEFAULT_FROM_EMAIL", "OwlLayer <owllayer@localhost>")
# An invitation link works once, for this many days after it was sent.
OWLLAYER_INVITATION_DAYS = env_float("OWLLAYER_INVITATION_DAYS", 7.0, minimum=0.001)
# Whether a person without an account may make one through an invitation
# link (else an operator makes the account first, and the person signs in).
OWLLAYER_INVITATION_SIGN_UP = env_bool("OWLLAYER_INVITATION_SIGN_UP", True)

# Figures for a host's monitoring, in Prometheus' text format (runtime/metrics.py):
# collected unless off; served at http://OWLLAYER_METRICS_ADDRESS/metrics (""
# serves none), the loopback address by default; with a token, a scrape must
# send `Authorization: Bearer <token>`. The processes of one host that share
# OWLLAYER_METRICS_DIR share the address and each answers with the sum of all.
OWLLAYER_METRICS = env_bool("OWLLAYER_METRICS", True)
OWLLAYER_METRICS_ADDRESS = env_str("OWLLAYER_METRICS_ADDRESS", "127.0.0.1:9464").strip()
if OWLLAYER_METRICS_ADDRESS and not re.fullmatch(r"(\[[0-9A-Fa-f:.]+\]|[^:\s]+):\d{1,5}", OWLLAYER_METRICS_ADDRESS):
    raise ImproperlyConfigured("OWLLAYER_METRICS_ADDRESS must be host:port (e.g. 127.0.0.1:9464, "
                               f"[::1]:9464) or empty, got {OWLLAYER_METRICS_ADDRESS!r}")
OWLLAYER_METRICS_TOKEN = env_str("OWLLAYER_METRICS_TOKEN", "")
OWLLAYER_METRICS_DIR = env_str("OWLLAYER_METRICS_DIR", "")

# Traces of the agent's turns, for an OpenTelemetry collector (runtime/tracing.py):
# off unless OWLLAYER_TRACES; then sent over OTLP/HTTP to the standard
# OTEL_EXPORTER_OTLP_ENDPOINT (its /v1/traces), named OTEL_SERVICE_NAME.
OWLLAYER_TRACES = env_bool("OWLLAYER_TRACES", False)
OTEL_EXPORTER_OTLP_ENDPOINT = (env_str("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
                               or "http://127.0.0.1:4318")
if OWLLAYER_TRACES and not re.fullmatch(r"https?://[^/\s]+(/\S*)?", OTEL_EXPORTER_OTLP_ENDPOINT):
    raise ImproperlyConfigured("OTEL_EXPORTER_OTLP_ENDPOINT must be an http:// or https:// url "
                               f"(e.g. http://127.0.0.1:4318), got {OTEL_EXPORTER_OTLP_ENDPOINT!r}")
OTEL_SERVICE_NAME = env_str("OTEL_SERVICE_NAME", "owllayer-server").strip() or "owllayer-server"

# "text": `time LEVEL logger message`; "json": one JSON object per line, with
# the session's id and tenant on every line of a session (runtime/logs.py).
OWLLAYER_LOG_FORMAT = env_choice("OWLLAYER_LOG_FORMAT", "text", ("text", "json"))
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "text": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"},
        "json": {"()": "runtime.logs.JsonFormatter"},
    },
    "filters": {"session": {"()": "runtime.logs.SessionFields"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": OWLLAYER_LOG_FORMAT,
                             "filters": ["session"]}},
    "root": {"handlers": ["console"], "level": env_choice(
        "OWLLAYER_LOG_LEVEL", "INFO", ("DEBUG", "INFO", "WARNING", "ERROR"))},
}

# The demo store's key, in plain text: written by `manage.py ensure_demo`
# (`make run`), read by the demo pages and by the console, which warns
# before revoking it.
OWLLAYER_DEMO_KEY_FILE = Path(env_str("OWLLAYER_DEMO_KEY_FILE", "") or BASE_DIR / ".demo-key")

# --- The AITP protocol ----------------------------------------------------
OWLLAYER_WS_PATH = env_str("OWLLAYER_WS_PATH", "/owllayer")
if not OWLLAYER_WS_PATH.startswith("/"):
    raise ImproperlyConfigured(f"OWLLAYER_WS_PATH must start with '/', got {OWLLAYER_WS_PATH!r}")
OWLLAYER_MAX_ACTIVE_TOOLS = env_int("OWLLAYER_MAX_ACTIVE_TOOLS", 30, minimum=1)
OWLLAYER_HANDSHAKE_TIMEOUT = env_float("OWLLAYER_HANDSHAKE_TIMEOUT", 10.0, minimum=0.1)
# A session whose socket dropped (a reload, a lost network, a stopping
# process) can be continued this many seconds by a client that offers its
# resume token (docs/protocol.md §3a); 0: never.
OWLLAYER_RESUME_WINDOW_SECONDS = env_float("OWLLAYER_RESUME_WINDOW_SECONDS", 600.0)
# How long a chat whose agent asked for a person waits for an operator to
# take it over; then the page user is told none is free, and the agent goes on.
OWLLAYER_HANDOFF_WAIT_SECONDS = env_float("OWLLAYER_HANDOFF_WAIT_SECONDS", 120.0, minimum=1.0)
# When such a socket drops (any close but the page's own 1000), the process
# holding the session keeps it, its turn running and its frames numbered, for
# the client's next socket on this process: while the turn runs (at most the
# resume window) and this many seconds more; 0: the session closes with its socket.
OWLLAYER_RESUME_HOLD_SECONDS = env_float("OWLLAYER_RESUME_HOLD_SECONDS", 30.0)
OWLLAYER_MAX_MESSAGE_BYTES = env_int("OWLLAYER_MAX_MESSAGE_BYTES", 1024 * 1024, minimum=1024)
# daphne's own frame limit (a 1009 close above it); see owllayer_site/serve.py.
OWLLAYER_WS_FRAME_CEILING_BYTES = env_int(
    "OWLLAYER_WS_FRAME_CEILING_BYTES", 4 * OWLLAYER_MAX_MESSAGE_BYTES, minimum=OWLLAYER_MAX_MESSAGE_BYTES
)
OWLLAYER_MAX_CONTEXT_BYTES = env_int("OWLLAYER_MAX_CONTEXT_BYTES", 64 * 1024, minimum=1)
# Hostile input and memory per connection: see docs/security.md (Limits).
OWLLAYER_MAX_JSON_DEPTH = env_int("OWLLAYER_MAX_JSON_DEPTH", 32, minimum=4)
OWLLAYER_MAX_INBOUND_BYTES = env_int(
    "OWLLAYER_MAX_INBOUND_BYTES", OWLLAYER_WS_FRAME_CEILING_BYTES, minimum=OWLLAYER_MAX_MESSAGE_BYTES
)
OWLLAYER_MAX_OUTBOUND_BYTES = env_int("OWLLAYER_MAX_OUTBOUND_BYTES", 4 * 1024 * 1024, minimum=64 * 1024)
OWLLAYER_MAX_INVALID_FRAMES = env_int("OWLLAYER_MAX_INVALID_FRAMES", 20, minimum=1)
OWLLAYER_DEFAULT_SESSION_CAP = env_int("OWLLAYER_DEFAULT_SESSION_CAP", 10, minimum=1)
# A new tenant's ceilings over all its keys: live sessions, and keys (not
# revoked); 0 gives new tenants none. Operators change each tenant's in the admin.
OWLLAYER_DEFAULT_TENANT_SESSION_CAP = env_int("OWLLAYER_DEFAULT_TENANT_SESSION_CAP", 200)
OWLLAYER_DEFAULT_TENANT_KEY_CAP = env_int("OWLLAYER_DEFAULT_TENANT_KEY_CAP", 50)
OWLLAYER_SERVER_VERSION = "0.4.0"

# --- Rate limits (aitp/limits.py; 0 turns a limit off) ------------------------
# Inbound frames per connection per second, every type (audio included).
OWLLAYER_FRAMES_PER_SECOND = env_int("OWLLAYER_FRAMES_PER_SECOND", 30)
# Frames dropped in one minute before the connection is closed as a flood (1008).
OWLLAYER_FLOOD_CLOSE_DROPS = env_int("OWLLAYER_FLOOD_CLOSE_DROPS", 600)
OWLLAYER_USER_INPUTS_PER_MINUTE = env_int("OWLLAYER_USER_INPUTS_PER_MINUTE", 20)
OWLLAYER_APPROVAL_REQUESTS_PER_CALL = env_int("OWLLAYER_APPROVAL_REQUESTS_PER_CALL", 5)
# Shared by every process through Redis when REDIS_URL is set.
OWLLAYER_SESSION_OPENS_PER_KEY_PER_MINUTE = env_int("OWLLAYER_SESSION_OPENS_PER_KEY_PER_MINUTE", 600)
OWLLAYER_LIMITS_PREFIX = env_str(
    "OWLLAYER_LIMITS_PREFIX", env_str("OWLLAYER_CHANNEL_PREFIX", "owllayer") + "-limits"
)
# Refusals that come in floods (frames dropped, invalid frames, inputs and
# approval requests over their limits, audio too fast, opens over a key's
# limit) are logged once per this many seconds, with their count.
OWLLAYER_FLOOD_LOG_INTERVAL = env_float("OWLLAYER_FLOOD_LOG_INTERVAL", 60.0, minimum=1.0)

# --- The agent turn -------------------------------------------------------
ANTHROPIC_API_KEY = os.environ.get("ANTHROPIC_API_KEY", "")
ANTHROPIC_BASE_URL = os.environ.get("ANTHROPIC_BASE_URL", "")
# The backends OWLLAYER_LLM may name (else it is a dotted path of one's own):
# Claude; without a key, the scripted demo assistant (llm/demo.py); and
# "offline", which runs the tools typed as "/tool <name> {json}".
OWLLAYER_LLM_BACKENDS = {
    "anthropic": "llm.anthropic_backend.AnthropicBackend",
    "demo": "llm.demo.DemoBackend",
    "offline": "llm.offline.OfflineBackend",
}
OWLLAYER_LLM = env_choice(
    "OWLLAYER_LLM", "anthropic" if ANTHROPIC_API_KEY else "demo", OWLLAYER_LLM_BACKENDS,
    or_dotted_path=True,
)
if OWLLAYER_LLM == "anthropic" and not ANTHROPIC_API_KEY:
    raise ImproperlyConfigured("OWLLAYER_LLM=anthropic needs ANTHROPIC_API_KEY")
OWLLAYER_MODEL = env_str("OWLLAYER_MODEL", "claude-sonnet-5-5")
OWLLAYER_MAX_TOKENS = env_int("OWLLAYER_MAX_TOKENS", 1024, minimum=1)


def env_prices(name: str, default: dict[str, list[float]]) -> tuple[tuple[str, float, float, float, float], ...]:
    """A JSON object: a model (or the start of its name) -> [input, output,
    cache read, cache write], US dollars per million tokens; added to and
    over ``default``."""
    import json

    raw = os.environ.get(name, "")
    given = {}
    if raw.strip():
        try:
            given = json.loads(raw)
        except ValueError:
            given = None
        if not isinstance(given, dict) or not all(
                isinstance(v, list) and len(v) == 4
                and all(isinstance(n, (int, float)) and not isinstance(n, bool) and n >= 0 for n in v)
                for v in given.values()):
            raise ImproperlyConfigured(
                f'{name} must be a JSON object such as {{"claude-sonnet-4-5": [3, 15, 0.3, 3.75]}} '
                "(model -> input, output, cache read, cache write; US dollars per million tokens)")
    return tuple((model, *map(float, prices)) for model, prices in {**default, **given}.items())


# What a turn's tokens cost (the session record, the console's usage): list
# prices, US dollars per million tokens; set yours, or a model's missing here.
OWLLAYER_MODEL_PRICES = env_prices("OWLLAYER_MODEL_PRICES", {
    "claude-opus-4": [15, 75, 1.5, 18.75],
    "claude-sonnet-4": [3, 15, 0.3, 3.75],
    "claude-sonnet-5": [3, 15, 0.3, 3.75],
    "claude-haiku-4": [1, 5, 0.1, 1.25],
    "claude-3-5-haiku": [0.8, 4, 0.08, 1],
})
OWLLAYER_LLM_TIMEOUT = env_float("OWLLAYER_LLM_TIMEOUT", 30.0, minimum=0.1)
OWLLAYER_LLM_MAX_RETRIES = env_int("OWLLAYER_LLM_MAX_RETRIES", 2, minimum=0)
OWLLAYER_LLM_MAX_RETRY_WAIT = env_float("OWLLAYER_LLM_MAX_RETRY_WAIT", 8.0, minimum=0.0)
# The anthropic SDK's OpenTelemetry spans for each Messages API call.
OWLLAYER_LLM_TRACES = env_bool("OWLLAYER_LLM_TRACES", False)
# The server's check of the model key at start (one request listing one
# model): seconds it may take; 0 skips it.
OWLLAYER_MODEL_CHECK_TIMEOUT = env_float("OWLLAYER_MODEL_CHECK_TIMEOUT", 5.0)
OWLLAYER_TOOL_TIMEOUT = env_float("OWLLAYER_TOOL_TIMEOUT", 10.0, minimum=0.1)
OWLLAYER_MAX_TOOL_ROUNDS = env_int("OWLLAYER_MAX_TOOL_ROUNDS", 8, minimum=1)
OWLLAYER_MAX_INPUT_CHARS = env_int("OWLLAYER_MAX_INPUT_CHARS", 8000, minimum=1)
OWLLAYER_HISTORY_MESSAGES = env_int("OWLLAYER_HISTORY_MESSAGES", 40, minimum=2)
OWLLAYER_STREAM_INTERVAL = env_float("OWLLAYER_STREAM_INTERVAL", 0.04, minimum=0.0)

# --- Human approval -------------------------------------------------------
OWLLAYER_APPROVAL_TIMEOUT = env_float("OWLLAYER_APPROVAL_TIMEOUT", 120.0, minimum=0.1)
OWLLAYER_WEBHOOK_TIMEOUT = env_float("OWLLAYER_WEBHOOK_TIMEOUT", 5.0, minimum=0.1)
OWLLAYER_WEBHOOK_MAX_BYTES = env_int("OWLLAYER_WEBHOOK_MAX_BYTES", 256 * 1024, minimum=1)
# Webhooks reach only addresses IANA's registries call globally reachable,
# except what a server tool's webhook_networks (set by a superuser) open,
# and only inside these networks (CIDRs, e.g. "10.20.0.0/16"): the ceiling.
OWLLAYER_WEBHOOK_ALLOWED_NETWORKS = env_networks("OWLLAYER_WEBHOOK_ALLOWED_NETWORKS")
# CA certificates (PEM) https webhooks trust besides the public ones.
OWLLAYER_WEBHOOK_CA_FILE = env_str("OWLLAYER_WEBHOOK_CA_FILE", "")
if OWLLAYER_WEBHOOK_CA_FILE and not os.path.isfile(OWLLAYER_WEBHOOK_CA_FILE):
    raise ImproperlyConfigured(f"OWLLAYER_WEBHOOK_CA_FILE is not a file: {OWLLAYER_WEBHOOK_CA_FILE!r}")

# API keys are stored as an HMAC of the key under this secret, so a leaked
# database does not leak usable keys. Rotating it invalidates every key.
OWLLAYER_KEY_HASH_SECRET = os.environ.get("OWLLAYER_KEY_HASH_SECRET", "") or SECRET_KEY
# The audit chain (approvals.audit): each event is an HMAC under this key,
# kept out of the database, so a database alone cannot rewrite history.
# Events name the key that hashed them by an id; after a change of key,
# the keys before it stay listed in OWLLAYER_AUDIT_OLD_KEYS (comma-separated)
# so the older events still verify.
OWLLAYER_AUDIT_KEY = os.environ.get("OWLLAYER_AUDIT_KEY", "") or SECRET_KEY
OWLLAYER_AUDIT_OLD_KEYS = tuple(env_list("OWLLAYER_AUDIT_OLD_KEYS", []))
# Signed checkpoints of the chain (its sequence and head hash) are appended
# to this file every OWLLAYER_AUDIT_ANCHOR_EVENTS events or
# OWLLAYER_AUDIT_ANCHOR_SECONDS seconds, after the commit, and also POSTed
# to OWLLAYER_AUDIT_ANCHOR_URL when set. "off" writes no file.
OWLLAYER_AUDIT_ANCHOR_FILE = env_str("OWLLAYER_AUDIT_ANCHOR_FILE", "") or str(BASE_DIR / "audit-anchors.log")
if OWLLAYER_AUDIT_ANCHOR_FILE == "off":
    OWLLAYER_AUDIT_ANCHOR_FILE = ""
OWLLAYER_AUDIT_ANCHOR_EVENTS = env_int("OWLLAYER_AUDIT_ANCHOR_EVENTS", 100, minimum=1)
OWLLAYER_AUDIT_ANCHOR_SECONDS = env_float("OWLLAYER_AUDIT_ANCHOR_SECONDS", 60.0, minimum=0.1)
OWLLAYER_AUDIT_ANCHOR_URL = env_str("OWLLAYER_AUDIT_ANCHOR_URL", "")
if OWLLAYER_AUDIT_ANCHOR_URL and not OWLLAYER_AUDIT_ANCHOR_URL.startswith(("http://", "https://")):
    raise ImproperlyConfigured(f"OWLLAYER_AUDIT_ANCHOR_URL must be an http(s) URL, got {OWLLAYER_AUDIT_ANCHOR_URL!r}")
OWLLAYER_AUDIT_ANCHOR_TIMEOUT = env_float("OWLLAYER_AUDIT_ANCHOR_TIMEOUT", 5.0, minimum=0.1)
# A live session refreshes its row at this interval; a row not refreshed for
# three intervals belongs to a process that died and stops counting.
OWLLAYER_HEARTBEAT_INTERVAL = env_float("OWLLAYER_HEARTBEAT_INTERVAL", 15.0, minimum=0.5)
# Every serving process sweeps this often: it closes the rows of server
# processes that are gone (see aitp.processes), whatever their age.
OWLLAYER_SWEEP_INTERVAL = env_float("OWLLAYER_SWEEP_INTERVAL", 60.0, minimum=0.5)
# On SIGTERM, open pages are told to reconnect elsewhere (1001) and running
# turns are cancelled; the process exits after at most this many seconds.
OWLLAYER_SHUTDOWN_DRAIN = env_float("OWLLAYER_SHUTDOWN_DRAIN", 10.0, minimum=0.0)
# The tenants' daily usage counters are added up in each process and written
# at most this many seconds later (and when it stops); 0 writes every count
# at once. A process killed outright loses at most this long of counts.
OWLLAYER_USAGE_FLUSH_INTERVAL = env_float("OWLLAYER_USAGE_FLUSH_INTERVAL", 1.0, minimum=0.0)
# Every serving process checks this often whether a tenant's model cost this
# month passed 80% or 100% of its monthly budget (aitp.budgets); 0 turns the
# check off (the check_budgets command does the same from cron).
OWLLAYER_BUDGET_CHECK_INTERVAL = env_float("OWLLAYER_BUDGET_CHECK_INTERVAL", 60.0, minimum=0.0)
# How sessions' rows are written (aitp/store): "fast" (statements prepared
# once, writes of several sessions together, usage written behind) or
# "plain" (the ORM, one transaction per write), the same promises either way.
OWLLAYER_STORE = env_choice("OWLLAYER_STORE", "fast", ("fast", "plain"))
# A model request's tokens reserved against its tenant's monthly quota count
# at most this long (aitp.quota): a reservation of a process that died stops
# counting then, or when the sweep finds the process gone, whichever is first.
OWLLAYER_TOKEN_RESERVATION_SECONDS = env_float("OWLLAYER_TOKEN_RESERVATION_SECONDS", 300.0,
                                               minimum=1.0)

# --- Voice (docs/agent.md, "Voice") -------------------------------------
# Whether sessions are offered voice at all (they are only when both engines
# below work as well).
OWLLAYER_VOICE = env_bool("OWLLAYER_VOICE", True)
# Speech engines: offline PocketSphinx and eSpeak NG by default, or OpenAI's
# audio endpoints (any server speaking them, at OWLLAYER_VOICE_BASE_URL).
# Each is a name from its table or a dotted path of one's own.
OWLLAYER_STT_BACKENDS = {
    "pocketsphinx": "speech.offline.PocketSphinxStt",
    "openai": "speech.hosted.HostedStt",
}
OWLLAYER_TTS_BACKENDS = {
    "espeak": "speech.offline.EspeakTts",
    "openai": "speech.hosted.HostedTts",
}
OWLLAYER_STT = env_choice("OWLLAYER_STT", "pocketsphinx", OWLLAYER_STT_BACKENDS, or_dotted_path=True)
OWLLAYER_TTS = env_choice("OWLLAYER_TTS", "espeak", OWLLAYER_TTS_BACKENDS, or_dotted_path=True)
OWLLAYER_VOICE_API_KEY = os.environ.get("OWLLAYER_VOICE_API_KEY", "")
OWLLAYER_VOICE_BASE_URL = env_str("OWLLAYER_VOICE_BASE_URL", "https://api.openai.com/v1")
if "openai" in (OWLLAYER_STT, OWLLAYER_TTS) and not OWLLAYER_VOICE_API_KEY:
    raise ImproperlyConfigured("OWLLAYER_STT=openai or OWLLAYER_TTS=openai needs OWLLAYER_VOICE_API_KEY")
OWLLAYER_STT_MODEL = env_str("OWLLAYER_STT_MODEL", "gpt-4o-mini-transcribe")
OWLLAYER_TTS_MODEL = env_str("OWLLAYER_TTS_MODEL", "gpt-4o-mini-tts")
OWLLAYER_TTS_VOICE = env_str("OWLLAYER_TTS_VOICE", "alloy")
# A JSGF grammar that PocketSphinx listens for instead of all of English.
OWLLAYER_STT_GRAMMAR = env_str("OWLLAYER_STT_GRAMMAR", "")
if OWLLAYER_STT_GRAMMAR and not os.path.isfile(OWLLAYER_STT_GRAMMAR):
    raise ImproperlyConfigured(f"OWLLAYER_STT_GRAMMAR is not a file: {OWLLAYER_STT_GRAMMAR!r}")
# Words PocketSphinx hears in an utterance holding fewer seconds of vowels
# than this (its phone-by-phone pass) are noise: no_speech. 0: no such pass.
OWLLAYER_STT_MIN_VOICED_SECONDS = env_float("OWLLAYER_STT_MIN_VOICED_SECONDS", 0.08, minimum=0.0)
OWLLAYER_ESPEAK_VOICE = env_str("OWLLAYER_ESPEAK_VOICE", "en-us")
OWLLAYER_ESPEAK_WPM = env_int("OWLLAYER_ESPEAK_WPM", 175, minimum=80)
# Speech worker processes per serving process (offline transcriptions and
# syntheses run there, never on the serving interpreter), and how many jobs
# may wait for one; past both, a job is refused at once with speech_busy.
OWLLAYER_VOICE_JOBS = env_int("OWLLAYER_VOICE_JOBS", 2, minimum=1)
OWLLAYER_VOICE_QUEUE = env_int("OWLLAYER_VOICE_QUEUE", 4, minimum=0)
# One API key's share of them (speech_rate_limited past it; 0: no bound):
# jobs waiting or running at once (a voice answer has up to two sentences
# synthesized at once), and seconds of speech transcribed per minute.
OWLLAYER_VOICE_JOBS_PER_KEY = env_int(
    "OWLLAYER_VOICE_JOBS_PER_KEY", max(2, (OWLLAYER_VOICE_JOBS + OWLLAYER_VOICE_QUEUE) // 2), minimum=0)
OWLLAYER_VOICE_SECONDS_PER_KEY_PER_MINUTE = env_float(
    "OWLLAYER_VOICE_SECONDS_PER_KEY_PER_MINUTE", 120.0, minimum=0.0)
OWLLAYER_VOICE_TIMEOUT = env_float("OWLLAYER_VOICE_TIMEOUT", 30.0, minimum=0.1)
# Limits of a voice session: the longest utterance (longer audio is cut and
# the utterance ends as "timeout"), microphone bytes per second per
# connection (16 kHz real time is 32,000), and how long a stream may pause
# before its utterance ends as "timeout".
OWLLAYER_VOICE_MAX_UTTERANCE_SECONDS = env_float("OWLLAYER_VOICE_MAX_UTTERANCE_SECONDS", 30.0, minimum=1.0)
OWLLAYER_VOICE_BYTES_PER_SECOND = env_int("OWLLAYER_VOICE_BYTES_PER_SECOND", 64000, minimum=32000)
OWLLAYER_VOICE_IDLE_SECONDS = env_float("OWLLAYER_VOICE_IDLE_SECONDS", 5.0, minimum=0.5)
# How far the agent's audio may run ahead of the page's playback (0: as fast as it is made).
OWLLAYER_VOICE_SEND_AHEAD_SECONDS = env_float("OWLLAYER_VOICE_SEND_AHEAD_SECONDS", 1.0, minimum=0.0)
# The server ends an utterance itself after this much silence following speech.
OWLLAYER_SERVER_VAD = env_bool("OWLLAYER_SERVER_VAD", False)
OWLLAYER_VAD_SILENCE_SECONDS = env_float("OWLLAYER_VAD_SILENCE_SECONDS", 0.8, minimum=0.1)
