"""The run's database, settings environment, tenant and key.

Two backends, each with a database of its own that the run creates and
removes:

- ``embedded`` (the default configuration): a throwaway SQLite file in the
  run's scratch directory and the in-memory channel layer;
- ``postgres``: a fresh PostgreSQL database ``owl_bench_<pid>`` on the
  server of ``--postgres`` (dropped at the end) and the Redis of ``--redis``
  under a channel prefix of the run's own (its keys deleted at the end).

The caller's DATABASE_URL and REDIS_URL are never used: the run must not
touch a database it did not create.
"""
from __future__ import annotations

import logging
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

PROJECT_ROOT = Path(__file__).resolve().parent.parent
SETTINGS_MODULE = "owllayer_site.settings"


BACKENDS = ("embedded", "postgres")
DEFAULT_POSTGRES = "postgres://postgres@127.0.0.1:5432"
DEFAULT_REDIS = "redis://127.0.0.1:6379/0"


RAISED_LIMITS = {
    "OWLLAYER_FRAMES_PER_SECOND": "1000000",
    "OWLLAYER_USER_INPUTS_PER_MINUTE": "1000000",
    "OWLLAYER_SESSION_OPENS_PER_KEY_PER_MINUTE": "100000000",
    # The voice line sends each utterance at once, turn after turn.
    "OWLLAYER_VOICE_BYTES_PER_SECOND": "100000000",
    # Its sessions share one key, and their speech jobs wait for the
    # process's workers however many there are: the line measures how the
    # wait grows, not where the queue refuses (speech_busy).
    "OWLLAYER_VOICE_JOBS_PER_KEY": "0",
    "OWLLAYER_VOICE_SECONDS_PER_KEY_PER_MINUTE": "0",
    "OWLLAYER_VOICE_QUEUE": "100000",
}


@dataclass(frozen=True)
class RunEnvironment:
    database_dir: str = ""
    backend: str = "embedded"
    postgres_database: str = ""
    postgres_server: str = ""
    redis_url: str = ""
    channel_prefix: str = ""

    def describe_short(self) -> str:
        if self.backend == "embedded":
            return "throwaway sqlite, in-memory channel layer"
        return (f"scratch PostgreSQL database {self.postgres_database}, Redis "
                f"{self.redis_url} under {self.channel_prefix}")

    def describe(self) -> dict:
        """What the numbers were measured on, for the report."""
        from django.conf import settings
        from django.db import connection

        layer = settings.CHANNEL_LAYERS["default"]["BACKEND"].rsplit(".", 1)[-1]
        where = self.database_dir if self.backend == "embedded" else self.postgres_database
        return {
            "backend": self.backend,
            "database": connection.vendor + f" (throwaway, {where})",
            "channel_layer": layer,
            "debug": settings.DEBUG,
            "llm": settings.OWLLAYER_LLM,
            "cpus": os.cpu_count(),
        }


def prepare(scratch: Path, backend: str = "embedded", *, postgres: str = DEFAULT_POSTGRES,
            redis: str = DEFAULT_REDIS) -> RunEnvironment:
    """Set this process's environment before Django reads its settings (and,
    for ``postgres``, create the run's database).

    The servers are started with a copy of it, so the run, the product and
    the baseline agree on the database, the channel layer and the key secret.
    """
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}")
    os.environ["DJANGO_SETTINGS_MODULE"] = SETTINGS_MODULE
    # No tokens are spent and no network is touched beyond 127.0.0.1.
    os.environ["OWLLAYER_LLM"] = "offline"
    if not os.environ.get("DJANGO_SECRET_KEY"):
        # Settings refuse a missing secret outside debug mode. Debug mode
        # keeps every query in memory, which the product would not do in
        # production, so the run keeps it off and accepts the development
        # secret instead (keys are created and checked within the run).
        os.environ.setdefault("DJANGO_DEBUG", "false")
        os.environ["OWLLAYER_INSECURE_DEV_SECRET"] = "1"
    # The run sends frames, turns and opens back to back on purpose: it
    # measures capacity, not the rate limits a page meets. The limits are
    # raised far above what it sends rather than turned off, so the product
    # still pays for its checks (a caller may still set them).
    for limit, value in RAISED_LIMITS.items():
        os.environ.setdefault(limit, value)
    os.environ.pop("DATABASE_URL", None)
    os.environ.pop("REDIS_URL", None)
    os.environ.pop("OWLLAYER_CHANNEL_PREFIX", None)
    os.environ["PYTHONUNBUFFERED"] = "1"
    # Each of the run's processes serves its figures on a port of its own.
    os.environ.setdefault("OWLLAYER_METRICS_ADDRESS", "127.0.0.1:0")
    # The servers must import this checkout, whatever the caller's cwd is.
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [str(PROJECT_ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
    )
    if backend == "embedded":
        os.environ["DATABASE_URL"] = f"sqlite:///{scratch / 'bench.sqlite3'}"
        return RunEnvironment(database_dir=str(scratch.parent))
    name = f"owl_bench_{os.getpid()}"
    server = postgres.rstrip("/")
    create_postgres_database(server, name)
    prefix = f"owl-bench-{os.getpid()}-{secrets.token_hex(3)}"
    os.environ["DATABASE_URL"] = f"{server}/{name}"
    os.environ["REDIS_URL"] = redis
    os.environ["OWLLAYER_CHANNEL_PREFIX"] = prefix
    return RunEnvironment(backend="postgres", postgres_database=name,
                          postgres_server=server, redis_url=redis, channel_prefix=prefix)


def _admin_connection(server: str):
    import psycopg

    return psycopg.connect(f"{server}/postgres", autocommit=True, connect_timeout=5)


class BackendUnavailable(RuntimeError):
    """The postgres backend's server does not answer (or refuses the database)."""


def create_postgres_database(server: str, name: str) -> None:
    import psycopg
    from psycopg import sql

    try:
        with _admin_connection(server) as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                sql.Identifier(name)))
            admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    except psycopg.Error as exc:
        raise BackendUnavailable(f"cannot create the scratch database {name} on {server}: "
                                 f"{str(exc).strip() or type(exc).__name__}") from None


def remove_backend(run_env: RunEnvironment) -> None:
    """Drop the run's PostgreSQL database and its Redis keys (postgres backend)."""
    if run_env.backend != "postgres":
        return
    close_connections()
    try:
        from psycopg import sql

        with _admin_connection(run_env.postgres_server) as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                sql.Identifier(run_env.postgres_database)))
    except Exception:
        logger.warning("could not drop the benchmark database %s; drop it by hand",
                       run_env.postgres_database, exc_info=True)
    try:
        import redis

        client = redis.Redis.from_url(run_env.redis_url, socket_timeout=5)
        try:
            for key in client.scan_iter(match=f"{run_env.channel_prefix}*", count=1000):
                client.delete(key)
        finally:
            client.close()
    except Exception:
        logger.warning("could not delete the Redis keys under %s", run_env.channel_prefix,
                       exc_info=True)


def setup_database() -> None:
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", interactive=False, verbosity=0)


def create_key(*, max_sessions: int):
    """A fresh tenant and key for this run; returns (tenant, plaintext key)."""
    from aitp import tenancy

    # The run's sessions all belong to this one tenant: its key's cap alone bounds them.
    tenant = tenancy.tenant_create(slug=f"bench-{secrets.token_hex(4)}", name="Benchmark",
                                   max_sessions=None)
    _key, raw_key = tenancy.key_create(tenant=tenant, name="bench", max_sessions=max_sessions)
    return tenant, raw_key


def close_connections() -> None:
    from django.db import connections

    connections.close_all()
