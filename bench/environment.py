"""The run's database, settings environment, tenant and key.

By default everything lives in a throwaway SQLite file in the run's scratch
directory. With DATABASE_URL (and REDIS_URL) set, the run uses them as the
product would, and removes its own tenant at the end.
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


@dataclass(frozen=True)
class RunEnvironment:
    throwaway_database: bool
    database_dir: str = ""

    def describe(self) -> dict:
        """What the numbers were measured on, for the report."""
        from django.conf import settings
        from django.db import connection

        layer = settings.CHANNEL_LAYERS["default"]["BACKEND"].rsplit(".", 1)[-1]
        return {
            "database": connection.vendor + (
                f" (throwaway, {self.database_dir})" if self.throwaway_database else ""),
            "channel_layer": layer,
            "debug": settings.DEBUG,
            "llm": settings.OWLLAYER_LLM,
            "cpus": os.cpu_count(),
        }


def prepare(scratch: Path) -> RunEnvironment:
    """Set this process's environment before Django reads its settings.

    The servers are started with a copy of it, so the run, the product and
    the baseline agree on the database, the channel layer and the key secret.
    """
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
    throwaway = not os.environ.get("DATABASE_URL")
    if throwaway:
        os.environ["DATABASE_URL"] = f"sqlite:///{scratch / 'bench.sqlite3'}"
    os.environ["PYTHONUNBUFFERED"] = "1"
    # The servers must import this checkout, whatever the caller's cwd is.
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [str(PROJECT_ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
    )
    return RunEnvironment(throwaway_database=throwaway,
                          database_dir=str(scratch.parent) if throwaway else "")


def setup_database() -> None:
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", interactive=False, verbosity=0)


def create_key(*, max_sessions: int):
    """A fresh tenant and key for this run; returns (tenant, plaintext key)."""
    from aitp import services

    tenant = services.tenant_create(slug=f"bench-{secrets.token_hex(4)}", name="Benchmark")
    _key, raw_key = services.api_key_create(tenant=tenant, name="bench", max_sessions=max_sessions)
    return tenant, raw_key


def remove_tenant(tenant) -> None:
    """Delete the run's tenant (its keys, sessions and conversation go with it)."""
    from django.db import DatabaseError

    try:
        tenant.delete()
    except DatabaseError:
        logger.warning("could not remove the benchmark tenant %s; delete it by hand", tenant.slug,
                       exc_info=True)


def close_connections() -> None:
    from django.db import connections

    connections.close_all()
