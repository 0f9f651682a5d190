"""What ``manage.py`` and the server say when they cannot start: one short
paragraph naming the setting to fix, instead of a traceback.

Three failures are a newcomer's, not a bug: settings that cannot be used
(``ImproperlyConfigured``), a database that does not answer at
``DATABASE_URL``, and a Redis that does not answer at ``REDIS_URL``. Anything
else still ends in its traceback. ``--traceback`` (manage.py) or
``OWLLAYER_STARTUP_TRACEBACK=1`` shows the traceback of these three as well.
Pure standard library until a probe needs a driver, so it can run before
Django is set up.
"""
from __future__ import annotations

import errno
import os
import socket
from urllib.parse import urlsplit, urlunsplit

SETTINGS_HINT = "Every setting is read from the environment; docs/configuration.md lists them."


class StartupError(Exception):
    """A start-up failure with a message for people (no traceback)."""


def wants_traceback(argv: list[str] | None = None) -> bool:
    return os.environ.get("OWLLAYER_STARTUP_TRACEBACK") == "1" or "--traceback" in (argv or [])


def hide_password(url: str) -> str:
    """The URL as it may be printed: its password replaced by ***."""
    try:
        parts = urlsplit(url)
        if parts.password is None:
            return url
        netloc = parts.netloc.rsplit("@", 1)
        return urlunsplit(parts._replace(netloc=f"{parts.username}:***@{netloc[-1]}"))
    except ValueError:
        return "(a URL that cannot be parsed)"


def explain(exc: BaseException) -> str | None:
    """The paragraph for a start-up failure we recognise, or None."""
    from django.core.exceptions import ImproperlyConfigured

    if isinstance(exc, StartupError):
        return str(exc)
    if isinstance(exc, ImproperlyConfigured):
        return f"The settings cannot be used: {exc}\n{SETTINGS_HINT}"
    if _is_database_error(exc):
        reason = database_unreachable()
        if reason is not None:
            return reason
        if _is_missing_table(exc):
            return (
                f"The database at DATABASE_URL={database_url()} has no tables yet ({exc}). "
                "Create them: .venv/bin/python manage.py migrate (make run does)."
            )
        return None
    if _is_redis_error(exc):
        return redis_unreachable_message(str(exc) or type(exc).__name__)
    return None


def _is_database_error(exc: BaseException) -> bool:
    from django.db import InterfaceError, OperationalError

    return isinstance(exc, (OperationalError, InterfaceError))


def _is_missing_table(exc: BaseException) -> bool:
    text = str(exc).lower()
    return "no such table" in text or ("relation" in text and "does not exist" in text)


def _is_redis_error(exc: BaseException) -> bool:
    try:
        from redis.exceptions import ConnectionError as RedisConnectionError
        from redis.exceptions import TimeoutError as RedisTimeoutError
    except ImportError:  # pragma: no cover - redis is a requirement
        return False
    return isinstance(exc, (RedisConnectionError, RedisTimeoutError))


def database_url() -> str:
    from runtime.config import config

    return hide_password(config().store.database_url)


def database_unreachable() -> str | None:
    """None when the database answers; otherwise the paragraph saying so.

    Opens a connection of its own, outside any pool: a pool only says it
    "couldn't get a connection", the driver says why."""
    from django.db import connections

    connection = connections["default"]
    try:
        params = connection.get_connection_params()
        if connection.vendor == "postgresql":
            import psycopg

            params.pop("pool", None)
            params.setdefault("connect_timeout", 5)
            psycopg.connect(**params).close()
        else:
            connection.get_new_connection(params).close()
    except Exception as exc:  # the driver's own error names the cause
        first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        return (
            f"Cannot reach the database at DATABASE_URL={database_url()}: {first_line}\n"
            "Start it, or correct DATABASE_URL (unset, a SQLite file in the project "
            f"is used). {SETTINGS_HINT}"
        )
    return None


def redis_unreachable_message(reason: str) -> str:
    from runtime.config import config

    url = hide_password(config().limits.redis_url)
    return (
        f"Cannot reach Redis at REDIS_URL={url}: {reason}\n"
        "Start it, or correct REDIS_URL (unset, one process runs with an in-memory "
        f"channel layer). {SETTINGS_HINT}"
    )


def redis_unreachable() -> str | None:
    """None when REDIS_URL is unset or answers a PING; otherwise the paragraph."""
    from runtime.config import config

    url = config().limits.redis_url
    if not url:
        return None
    import redis

    timeout = config().limits.redis_timeout
    try:
        client = redis.Redis.from_url(url, socket_connect_timeout=timeout, socket_timeout=timeout)
        try:
            client.ping()
        finally:
            client.close()
    except (redis.exceptions.RedisError, OSError, ValueError) as exc:
        return redis_unreachable_message(str(exc) or type(exc).__name__)
    return None


def port_in_use(host: str, port: int) -> str | None:
    """None when ``host:port`` can be listened on; otherwise a one-line message.

    "Address already in use" stays in the message: scripts that start the
    server look for it to try another port."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        # As the server will: SO_REUSEADDR lets a port in TIME_WAIT be
        # taken again, never one a process listens on.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return (
                    f"port {port} on {host} is already in use (Address already in use): "
                    f"another server is running there; stop it or choose another port, "
                    f"e.g. PORT={port + 1 if port < 65535 else 8001} make run"
                )
            return f"cannot listen on {host}:{port}: {exc.strerror or exc}"
    return None
