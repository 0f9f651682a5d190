"""The demo store: a catalogue, product pages and a cart, each a Django
template carrying the widget's snippet, as a tenant's site does.

The cart lives in the visitor's Django session. The page's tools change it
through the small JSON API at the bottom (`/demo/api/cart/<action>`), the
same one the page's own buttons use, so what the agent does and what a
person clicks end in the same place.
"""
from __future__ import annotations

import json
import logging
import secrets
import time
from decimal import Decimal
from pathlib import Path

import jwt
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.urls import reverse
from django.utils.safestring import mark_safe
from django.views.decorators.http import require_GET, require_POST

from aitp import selectors
from aitp.store import keys
from demo import catalog, services
from demo.catalog import Cart, CartError
from runtime.config import config as current_config
from widget.assets import embed_snippet

logger = logging.getLogger(__name__)

# Written by `manage.py ensure_demo` (run by `make run`): .demo-key.
DEMO_KEY_FILE = current_config().console.demo_key_file
# A key given in a page's URL is remembered for the visitor's later pages.
SESSION_KEY = "owl_demo_api_key"
SESSION_CART = "owl_demo_cart"
SESSION_ORDER = "owl_demo_last_order"
MAX_API_BODY_BYTES = 4096
# The demo's visitor: this browser (its Django session), as a signed-in
# shopper would be a tenant's; its visitor token is valid this long.
SESSION_VISITOR = "owl_demo_visitor"
VISITOR_TOKEN_SECONDS = 3600


def read_demo_key(key_file: Path) -> str:
    """The demo key's plaintext, or "" when there is none to read."""
    try:
        return key_file.read_text().strip()
    except FileNotFoundError:
        return ""
    except OSError as exc:
        logger.warning("cannot read the demo key file %s: %s", key_file, exc.strerror)
        return ""


def page_api_key(request: HttpRequest) -> str:
    """The key from ?apiKey=..., else the one a previous page got that way, else the demo key."""
    from_url = request.GET.get("apiKey", "").strip()
    if from_url:
        request.session[SESSION_KEY] = from_url
        return from_url
    return request.session.get(SESSION_KEY, "") or read_demo_key(DEMO_KEY_FILE)


def visitor_token(request: HttpRequest, api_key: str) -> str:
    """What a tenant's backend does for a visitor it knows (docs/protocol.md
    §3c): a short token naming the visitor, signed with the tenant's visitor
    secret; "" for a key that is not one."""
    key = keys.api_key_lookup(api_key) if api_key else None
    if key is None:
        return ""
    visitor = request.session.setdefault(SESSION_VISITOR, "shopper-" + secrets.token_hex(8))
    claims = {"sub": visitor, "iat": int(time.time()), "exp": int(time.time()) + VISITOR_TOKEN_SECONDS}
    return jwt.encode(claims, selectors.visitor_secret(key.tenant_id), algorithm="HS256")


def load_cart(request: HttpRequest) -> Cart:
    return Cart.from_data(request.session.get(SESSION_CART))


def save_cart(request: HttpRequest, cart: Cart) -> None:
    request.session[SESSION_CART] = cart.to_data()


def product_url(slug: str) -> str:
    return reverse("demo:product", args=[slug])


def store_config(request: HttpRequest) -> dict:
    """What every page's script needs: the key, and where things are.
    ``demoKey``: the key is the demo's own (.demo-key), which `make run`
    replaces when it is refused, so the page can say so."""
    api_key = page_api_key(request)
    return {
        "apiKey": api_key,
        "demoKey": bool(api_key) and api_key == read_demo_key(DEMO_KEY_FILE),
        "urls": {
            "home": reverse("demo:home"),
            "cart": reverse("demo:cart"),
            "product": product_url("__slug__"),
            "api": reverse("demo:api", args=["__action__"]),
        },
        "products": [{"id": item.slug, "name": item.name} for item in catalog.PRODUCTS],
    }


def render_page(request: HttpRequest, template: str, *, cart: Cart, title: str, kind: str,
                context: dict, tools: list[str], extra: dict | None = None) -> HttpResponse:
    config = store_config(request)
    page = {"kind": kind, "title": title, "context": context, "tools": tools}
    # The assistant is the widget a tenant pastes, with the same snippet.
    api_key = config["apiKey"]
    snippet = embed_snippet(request, api_key, visitor_token=visitor_token(request, api_key)) if api_key else ""
    return render(request, template, {
        "config": config,
        "snippet": mark_safe(snippet),  # built by embed_snippet, every value escaped
        "page": page,
        "title": title,
        "has_key": bool(config["apiKey"]),
        "offline_agent": current_config().llm.name == "offline",
        "demo_agent": current_config().llm.name == "demo",
        "cart": cart,
        **(extra or {}),
    })


# --- pages ---------------------------------------------------------------------


@require_GET
def home(request: HttpRequest) -> HttpResponse:
    cart = load_cart(request)
    products = [
        {"item": item, "url": product_url(item.slug), "price": catalog.money(item.price_cents)}
        for item in catalog.PRODUCTS
    ]
    context = {
        "page": "catalog",
        "products": [
            {"productId": item.slug, "name": item.name, "price": catalog.dollars(item.price_cents),
             "summary": item.summary}
            for item in catalog.PRODUCTS
        ],
        "currency": catalog.CURRENCY,
        "cartItemCount": cart.count,
    }
    return render_page(request, "demo/home.html", cart=cart, title="Owl Store", kind="catalog",
                       context=context, tools=["open_product", "open_cart"],
                       extra={"products": products})


@require_GET
def product_page(request: HttpRequest, slug: str) -> HttpResponse:
    item = catalog.product(slug)
    if item is None:
        raise Http404("no such product")
    cart = load_cart(request)
    context = {
        "page": "product_detail",
        "productId": item.slug,
        "name": item.name,
        "price": catalog.dollars(item.price_cents),
        "currency": catalog.CURRENCY,
        "description": item.description,
        "inCart": cart.items.get(item.slug, 0),
    }
    return render_page(request, "demo/product.html", cart=cart, title=f"{item.name} - Owl Store",
                       kind="product", context=context,
                       tools=["add_to_cart", "open_product", "open_cart"],
                       extra={"product": item, "price": catalog.money(item.price_cents)})


@require_GET
def cart_page(request: HttpRequest) -> HttpResponse:
    cart = load_cart(request)
    last_order = request.session.get(SESSION_ORDER)
    context = {"page": "cart", **cart.summary()}
    if last_order:
        context["lastOrder"] = {k: last_order[k] for k in ("orderId", "amount", "currency")}
    lines = [
        {**line, "url": product_url(line["productId"]),
         "price_text": catalog.money(catalog.cents_of(line["price"])),
         "total_text": catalog.money(catalog.cents_of(line["lineTotal"]))}
        for line in cart.lines()
    ]
    return render_page(request, "demo/cart.html", cart=cart, title="Your cart - Owl Store", kind="cart",
                       context=context,
                       tools=["set_quantity", "apply_coupon", "process_payment", "open_product"],
                       extra={
                           "lines": lines,
                           "subtotal": catalog.money(cart.subtotal_cents),
                           "discount": catalog.money(cart.discount_cents),
                           "total": catalog.money(cart.total_cents),
                           "total_amount": catalog.dollars(cart.total_cents),
                           "coupon": catalog.COUPONS.get(cart.coupon or ""),
                           "last_order": last_order,
                           "last_order_amount": (catalog.money(catalog.cents_of(last_order["amount"]))
                                                 if last_order else ""),
                       })


# --- the cart API -----------------------------------------------------------------


def _add(request: HttpRequest, cart: Cart, body: dict) -> dict:
    cart.add(body.get("productId"), body.get("quantity"))
    # A new purchase starts: the previous order's confirmation has been seen.
    request.session.pop(SESSION_ORDER, None)
    return {"added": True, "productId": body["productId"], "quantity": int(body["quantity"])}


def _quantity(request: HttpRequest, cart: Cart, body: dict) -> dict:
    cart.set_quantity(body.get("productId"), body.get("quantity"))
    return {"updated": True}


def _coupon(request: HttpRequest, cart: Cart, body: dict) -> dict:
    coupon = cart.apply_coupon(body.get("code"))
    return {"applied": True, "coupon": coupon.code, "label": coupon.label}


def _pay(request: HttpRequest, cart: Cart, body: dict) -> dict:
    order = cart.pay(body.get("amount"), order_id="")
    # The shop of the page's key keeps the order, so its order_status tool
    # and the admin's demo orders know it; without a usable key only this
    # visitor's session does.
    tenant = services.order_tenant(raw_key=page_api_key(request),
                                   origin=f"{request.scheme}://{request.get_host()}")
    if tenant is None:
        order["orderId"] = services.new_order_number()
    else:
        row = services.demo_order_record_paid(
            tenant=tenant, lines=order["items"],
            total=Decimal(catalog.cents_of(order["amount"])) / 100,
        )
        order["orderId"] = row.number
    request.session[SESSION_ORDER] = order
    logger.info("demo order %s paid: %s %s", order["orderId"], order["amount"], order["currency"])
    return {"paid": True, "orderId": order["orderId"], "amount": order["amount"],
            "currency": order["currency"]}


CART_ACTIONS = {"add": _add, "quantity": _quantity, "coupon": _coupon, "pay": _pay}


def _not_json(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


@require_POST
def cart_api(request: HttpRequest, action: str) -> JsonResponse:
    """POST a JSON object; 200 {..., "cart": summary} or 400 {"error": sentence}."""
    handler = CART_ACTIONS.get(action)
    if handler is None:
        raise Http404("no such cart action")
    if len(request.body) > MAX_API_BODY_BYTES:
        return JsonResponse({"error": "The request is too large."}, status=400)
    try:
        # NaN and Infinity are not JSON (and no cart number); nesting too
        # deep for the decoder is no request either.
        body = json.loads(request.body or b"{}", parse_constant=_not_json)
    except (ValueError, RecursionError):
        return JsonResponse({"error": "The request is not valid JSON."}, status=400)
    if not isinstance(body, dict):
        return JsonResponse({"error": "The request must be a JSON object."}, status=400)
    cart = load_cart(request)
    try:
        outcome = handler(request, cart, body)
    except CartError as exc:
        return JsonResponse({"error": str(exc)}, status=400)
    save_cart(request, cart)
    return JsonResponse({**outcome, "cart": cart.summary()})
