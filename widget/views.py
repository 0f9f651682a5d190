"""Serving the widget's files to any site (docs/widget.md).

Each answer may be loaded by a page of any origin (``crossorigin="anonymous"``
needs ``Access-Control-Allow-Origin``). A release's files never change (the
path names the release), so they are kept for a year and carry an ETag, the
file's hash. ``/widget/v<major>/<name>`` sends a page that does not pin a
release to the newest one of that major version, by a short-lived redirect:
the module's imports then come from that same release.
"""
from __future__ import annotations

from django.http import Http404, HttpRequest, HttpResponse, HttpResponseNotModified, HttpResponseRedirect
from django.urls import reverse
from django.views.decorators.http import require_safe

from widget import assets

# A year: a release's files never change (docs/widget.md, versions).
CACHE_CONTROL = "public, max-age=31536000, immutable"
# Where /widget/v1/ leads changes when a release is cut: five minutes.
ALIAS_CACHE_CONTROL = "public, max-age=300"


def _shareable(response: HttpResponse, cache_control: str) -> HttpResponse:
    response["Cache-Control"] = cache_control
    response["Access-Control-Allow-Origin"] = "*"
    # A host page that isolates itself (COEP) may still load it.
    response["Cross-Origin-Resource-Policy"] = "cross-origin"
    return response


@require_safe
def asset(request: HttpRequest, release: str, name: str) -> HttpResponse:
    found = assets.asset(name, release)
    if found is None:
        raise Http404("not a file of a served widget release")
    response = (HttpResponseNotModified() if request.headers.get("If-None-Match") == found.etag
                else HttpResponse(found.body, content_type=found.content_type))
    response["ETag"] = found.etag
    return _shareable(response, CACHE_CONTROL)


@require_safe
def latest(request: HttpRequest, major: int, name: str) -> HttpResponse:
    release = assets.manifest().latest_of_major(major)
    if release is None or assets.asset(name, release) is None:
        raise Http404("not a file of a served widget release")
    return _shareable(HttpResponseRedirect(reverse("widget:asset", args=[release, name])), ALIAS_CACHE_CONTROL)
