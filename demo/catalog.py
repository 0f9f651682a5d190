"""What the demo store sells, its coupons, and the cart's arithmetic.

Pure: no Django, no I/O. Money is kept in integer cents and shown to the
agent in dollars (the page context and tool results say 149.99, as a page
built on the SDK would).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from decimal import ROUND_HALF_UP, Decimal, InvalidOperation

CURRENCY = "USD"
MAX_QUANTITY = 99
# Far above any cart this store can hold (99 of each product), far below
# where Decimal's 28 digits run out.
MAX_AMOUNT_DOLLARS = 1_000_000_000


@dataclass(frozen=True)
class Product:
    slug: str
    name: str
    price_cents: int
    summary: str
    description: str
    picture: str  # which inline drawing the page shows


@dataclass(frozen=True)
class Coupon:
    code: str
    label: str
    percent_off: int = 0
    cents_off: int = 0

    def discount_cents(self, subtotal_cents: int) -> int:
        if self.percent_off:
            exact = Decimal(subtotal_cents) * self.percent_off / 100
            return int(exact.quantize(Decimal(1), rounding=ROUND_HALF_UP))
        return min(self.cents_off, subtotal_cents)


PRODUCTS: tuple[Product, ...] = (
    Product(
        "pro-headphones", "Pro Headphones", 14999,
        "Wireless, noise cancelling, 30 hours of battery.",
        "Closed-back wireless headphones with active noise cancelling, "
        "30 hours of battery and a fold-flat travel case.",
        "headphones",
    ),
    Product(
        "travel-speaker", "Travel Speaker", 8900,
        "Waterproof, fits a backpack pocket.",
        "A waterproof Bluetooth speaker the size of a paperback, with 12 hours of sound "
        "and a strap for your backpack.",
        "speaker",
    ),
    Product(
        "charging-dock", "Charging Dock", 3950,
        "Charges headphones and phone together.",
        "A weighted aluminium dock that charges your headphones and your phone at once.",
        "dock",
    ),
)
COUPONS: dict[str, Coupon] = {
    coupon.code: coupon
    for coupon in (
        Coupon("OWL10", "10% off your order", percent_off=10),
        Coupon("WELCOME5", "$5 off your order", cents_off=500),
    )
}
_BY_SLUG = {product.slug: product for product in PRODUCTS}


class CartError(ValueError):
    """A request the cart refuses; the message is shown to the user and the agent."""


def product(slug: str) -> Product | None:
    return _BY_SLUG.get(slug)


def dollars(cents: int) -> float:
    return round(cents / 100, 2)


def money(cents: int) -> str:
    return f"${cents / 100:,.2f}"


def cents_of(amount: object) -> int:
    """An amount in dollars (a JSON number) as exact cents; CartError if it is not one.

    Goes through the number's shortest text, so 299.98 is 29998 cents, not
    the 29997.999... of its binary value.
    """
    if isinstance(amount, bool) or not isinstance(amount, (int, float)):
        raise CartError("The amount must be a number.")
    if isinstance(amount, float) and not math.isfinite(amount):
        raise CartError("The amount must be a finite number.")
    # Checked before any Decimal arithmetic: 1e300 would overflow its context.
    if abs(amount) > MAX_AMOUNT_DOLLARS:
        raise CartError(f"The amount must be at most {MAX_AMOUNT_DOLLARS:,} dollars.")
    try:
        exact = Decimal(str(amount))
        if not exact.is_finite() or exact != exact.quantize(Decimal("0.01")):
            raise CartError("The amount must be in dollars and cents.")
    except InvalidOperation as exc:
        raise CartError("The amount must be in dollars and cents.") from exc
    return int(exact * 100)


def whole_quantity(value: object, *, minimum: int) -> int:
    # JSON has one number type: 2.0 is a fine 2, 2.5 is not. NaN and the
    # infinities are no whole number (and int() of them raises).
    if (isinstance(value, bool) or not isinstance(value, (int, float))
            or (isinstance(value, float) and not math.isfinite(value)) or value != int(value)):
        raise CartError("The quantity must be a whole number.")
    quantity = int(value)
    if not minimum <= quantity <= MAX_QUANTITY:
        raise CartError(f"The quantity must be from {minimum} to {MAX_QUANTITY}.")
    return quantity


@dataclass
class Cart:
    """Quantities by product slug and an optional coupon code."""

    items: dict[str, int] = field(default_factory=dict)
    coupon: str | None = None

    @classmethod
    def from_data(cls, data: object) -> Cart:
        """Rebuild from what `to_data` stored; anything damaged or stale is dropped."""
        if not isinstance(data, dict):
            return cls()
        items = data.get("items") if isinstance(data.get("items"), dict) else {}
        kept = {
            slug: quantity for slug, quantity in items.items()
            if product(slug) and isinstance(quantity, int) and 0 < quantity <= MAX_QUANTITY
        }
        coupon = data.get("coupon") if data.get("coupon") in COUPONS else None
        return cls(kept, coupon)

    def to_data(self) -> dict:
        return {"items": dict(self.items), "coupon": self.coupon}

    # --- changes --------------------------------------------------------------

    def add(self, slug: str, quantity: object) -> None:
        wanted = whole_quantity(quantity, minimum=1)
        found = self._product(slug)
        total = self.items.get(found.slug, 0) + wanted
        if total > MAX_QUANTITY:
            raise CartError(f"The cart holds at most {MAX_QUANTITY} of each product.")
        self.items[found.slug] = total

    def set_quantity(self, slug: str, quantity: object) -> None:
        wanted = whole_quantity(quantity, minimum=0)
        found = self._product(slug)
        if wanted == 0:
            self.items.pop(found.slug, None)
        else:
            self.items[found.slug] = wanted

    def apply_coupon(self, code: object) -> Coupon:
        normalized = code.strip().upper() if isinstance(code, str) else ""
        coupon = COUPONS.get(normalized)
        if coupon is None:
            raise CartError(f"There is no coupon called {str(code).strip()[:40]!r}.")
        if not self.items:
            raise CartError("The cart is empty: add something before applying a coupon.")
        self.coupon = coupon.code
        return coupon

    def pay(self, amount: object, *, order_id: str) -> dict:
        """Charge the total: the amount must be exactly the total. Empties the cart."""
        if not self.items:
            raise CartError("The cart is empty: there is nothing to pay.")
        cents = cents_of(amount)
        total = self.total_cents
        if cents != total:
            raise CartError(
                f"The amount {money(cents)} does not match the cart total {money(total)}."
            )
        order = {
            "orderId": order_id,
            "amount": dollars(total),
            "currency": CURRENCY,
            "items": self.lines(),
        }
        self.items.clear()
        self.coupon = None
        return order

    @staticmethod
    def _product(slug: object) -> Product:
        found = product(slug) if isinstance(slug, str) else None
        if found is None:
            raise CartError(f"There is no product {str(slug)[:40]!r} in this store.")
        return found

    # --- reading ----------------------------------------------------------------

    @property
    def count(self) -> int:
        return sum(self.items.values())

    @property
    def subtotal_cents(self) -> int:
        return sum(product(slug).price_cents * quantity for slug, quantity in self.items.items())

    @property
    def discount_cents(self) -> int:
        return COUPONS[self.coupon].discount_cents(self.subtotal_cents) if self.coupon else 0

    @property
    def total_cents(self) -> int:
        return self.subtotal_cents - self.discount_cents

    def lines(self) -> list[dict]:
        """The cart's lines, in catalogue order."""
        return [
            {
                "productId": item.slug,
                "name": item.name,
                "price": dollars(item.price_cents),
                "quantity": self.items[item.slug],
                "lineTotal": dollars(item.price_cents * self.items[item.slug]),
            }
            for item in PRODUCTS
            if item.slug in self.items
        ]

    def summary(self) -> dict:
        """The cart as the agent sees it (and as tool results report it)."""
        data = {
            "items": self.lines(),
            "itemCount": self.count,
            "subtotal": dollars(self.subtotal_cents),
            "discount": dollars(self.discount_cents),
            "total": dollars(self.total_cents),
            "currency": CURRENCY,
        }
        if self.coupon:
            data["coupon"] = {"code": self.coupon, "label": COUPONS[self.coupon].label}
        return data
