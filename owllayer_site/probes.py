"""``/healthz`` and ``/readyz``, answered before anything reads the request's Host.

A load balancer or a Kubernetes probe asks each process on its own address
(``127.0.0.1:8001``, a pod's IP) over plain HTTP: that address need not be
in ALLOWED_HOSTS, and through the rest of the middleware the request would
be refused (400, DisallowedHost) or redirected to HTTPS, and a healthy
process would look down. First in MIDDLEWARE, this answers the two paths
itself; every other request goes on unchanged.
"""
from __future__ import annotations

from aitp import views

PROBES = {"/healthz": views.healthz, "/readyz": views.readyz}


def probes(get_response):
    def middleware(request):
        view = PROBES.get(request.path_info)
        return get_response(request) if view is None else view(request)

    return middleware
