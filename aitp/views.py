"""A health check for load balancers in front of several server processes."""
from __future__ import annotations

import logging

from django.db import DatabaseError, connection
from django.http import JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from aitp import processes

logger = logging.getLogger(__name__)


@never_cache
@require_GET
def healthz(request):
    """200 when this process can reach its database, 503 when it cannot or
    when it is stopping (the proxy then sends new pages elsewhere)."""
    if processes.draining():
        return JsonResponse({"status": "stopping"}, status=503)
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
    except DatabaseError:
        logger.warning("health check: database unreachable", exc_info=True)
        return JsonResponse({"status": "unavailable", "database": "unreachable"}, status=503)
    return JsonResponse({"status": "ok"})
