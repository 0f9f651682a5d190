"""Serving the widget's files to any site (docs/widget.md).

Each answer may be loaded by a page of any origin (``crossorigin="anonymous"``
needs ``Access-Control-Allow-Origin``). A release's files never change (the
path names the release), so they are kept for a year and carry an ETag, the
file's hash. ``/widget/v<major>/<name>`` sends a page that does not pin a
release to the newest one of that major version, by a short-lived redirect:
the module's imports then come from that same release.

``/widget/appearance?key=<publishable key>`` answers how that key's widget
looks and speaks (widget/appearance.py), and nothing else about the key or
its tenant, to any page, for a minute; 404 for a key that is unknown,
revoked, disabled or expired.
"""
from __future__ import annotations

from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponseNotModified,
    HttpResponseRedirect,
    JsonResponse,
)
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_safe

from aitp.store import admission, keys
from widget import appearance as appearances
from widget import assets

# A year: a release's files never change (docs/widget.md, versions).
CACHE_CONTROL = "public, max-age=31536000, immutable"
# Where /widget/v1/ leads changes when a release is cut: five minutes.
ALIAS_CACHE_CONTROL = "public, max-age=300"
# A key's appearance changed in the console reaches new pages within a minute.
APPEARANCE_CACHE_CONTROL = "public, max-age=60"


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


@require_safe
def appearance(request: HttpRequest) -> HttpResponse:
    key = keys.api_key_lookup(request.GET.get("key", ""))
    refused = admission.api_key_refusal(key, origin=None, now=timezone.now())
    # Any page may read a usable key's appearance: its allowed origins limit sessions, not this.
    if key is None or (refused is not None and refused.code != "origin_not_allowed"):
        response: HttpResponse = JsonResponse({"error": "not a usable key"}, status=404)
    else:
        response = JsonResponse(appearances.public(key.widget_appearance))
    return _shareable(response, APPEARANCE_CACHE_CONTROL)
