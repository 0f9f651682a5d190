"""The demo store: two pages of a pretend shop with the chat widget, wired to
this server's AITP endpoint with the demo key.

The store itself lives in the browser (the cart is in localStorage); these
views only hand the page its key and the endpoint path.
"""
from __future__ import annotations

import logging
from pathlib import Path

from django.conf import settings
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.http import require_GET
from django.views.static import serve

logger = logging.getLogger(__name__)

# Written by `manage.py ensure_demo` (run by `make run`).
DEMO_KEY_FILE = Path(settings.BASE_DIR) / ".demo-key"
# The page's scripts. Served by this app so that the demo works under plain
# daphne, which serves no static files (they also collect as usual).
ASSET_ROOT = Path(__file__).resolve().parent / "static" / "demo"
ASSETS = frozenset({"owllayer-client.js", "store.js", "demo.css"})


def read_demo_key(key_file: Path) -> str:
    """The demo key's plaintext, or "" when there is none to read."""
    try:
        return key_file.read_text().strip()
    except FileNotFoundError:
        return ""
    except OSError as exc:
        logger.warning("cannot read the demo key file %s: %s", key_file, exc.strerror)
        return ""


@require_GET
def store_page(request: HttpRequest, *, route: str) -> HttpResponse:
    # A key in the URL wins: tests and other tenants' keys use it.
    api_key = request.GET.get("apiKey", "").strip() or read_demo_key(DEMO_KEY_FILE)
    config = {
        "apiKey": api_key,
        "wsPath": settings.OWLLAYER_WS_PATH,
        "route": route,
        "routes": {"product": reverse("demo:product"), "cart": reverse("demo:cart")},
    }
    return render(request, "demo/store.html", {"config": config, "has_key": bool(api_key)})


@require_GET
def asset(request: HttpRequest, name: str) -> HttpResponse:
    # A fixed list: nothing else in (or above) the folder is ever served.
    if name not in ASSETS:
        raise Http404("no such asset")
    return serve(request, name, document_root=ASSET_ROOT)
