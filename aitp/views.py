"""Liveness and readiness, as Kubernetes names them, for the load balancer
or orchestrator in front of several server processes.

``/healthz`` (liveness): the process answers HTTP. It asks nothing else, so
an outage of the database or Redis never gets every process restarted.

``/readyz`` (readiness): 200 only when this process can serve a page now --
its database answers, Redis answers (when the channel layer is Redis's:
``REDIS_URL``), every migration is applied, and it is not draining (SIGTERM,
``aitp.processes.drain``); otherwise 503. Either way the body names each
check and its state::

    {"status": "ready", "checks": {"database": "ok", "redis": "ok",
     "migrations": "ok", "process": "serving"}}
"""
from __future__ import annotations

import logging
import threading
from typing import Any

from django.db import DatabaseError, connection
from django.http import JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from aitp import processes
from runtime.config import config

logger = logging.getLogger(__name__)

OK = "ok"
# The states of a check that passes.
PASSING = frozenset({OK, "not used", "serving"})


@never_cache
@require_GET
def healthz(request):
    """200 while the process answers."""
    return JsonResponse({"status": "ok"})


@never_cache
@require_GET
def readyz(request):
    """200 when every check passes, 503 naming the ones that do not."""
    checks = {
        "database": _database(),
        "redis": _redis(),
        "migrations": _migrations(),
        "process": "draining" if processes.draining() else "serving",
    }
    ready = all(state in PASSING for state in checks.values())
    return JsonResponse({"status": "ready" if ready else "not ready", "checks": checks},
                        status=200 if ready else 503)


def _database() -> str:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
    except DatabaseError:
        logger.warning("readiness: database unreachable", exc_info=True)
        return "unreachable"
    return OK


# One client per Redis address, kept between checks: its pool reconnects by itself.
_redis_lock = threading.Lock()
_redis_clients: dict[tuple[str, float], Any] = {}


def _redis() -> str:
    url = config().limits.redis_url
    if not url:
        return "not used"
    import redis

    timeout = config().limits.redis_timeout
    with _redis_lock:
        client = _redis_clients.get((url, timeout))
        if client is None:
            client = _redis_clients[(url, timeout)] = redis.Redis.from_url(
                url, socket_connect_timeout=timeout, socket_timeout=timeout)
    try:
        client.ping()
    except (redis.exceptions.RedisError, OSError) as exc:
        logger.warning("readiness: Redis unreachable (%s)", exc)
        return "unreachable"
    return OK


# Once every migration is found applied it stays so for the life of the
# process: from then on the check costs nothing.
_migrated = False


def _migrations() -> str:
    global _migrated
    if _migrated:
        return OK
    try:
        count = unapplied_migrations()
    except DatabaseError:
        return "unknown"  # the database check says why
    if count:
        return f"{count} unapplied"
    _migrated = True
    return OK


def unapplied_migrations() -> int:
    """How many migrations of the installed apps the database lacks."""
    from django.db.migrations.executor import MigrationExecutor

    executor = MigrationExecutor(connection)
    return len(executor.migration_plan(executor.loader.graph.leaf_nodes()))
