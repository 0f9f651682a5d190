"""Writes of the demo shop: recording an order paid in the store, so that the
shop's ``order_status`` tool and the admin's demo orders know it."""
from __future__ import annotations

import logging
import secrets
from decimal import Decimal

from django.db import IntegrityError, transaction
from django.utils import timezone

from aitp.store import admission, keys
from demo.models import DemoOrder
from tenants.models import Tenant

logger = logging.getLogger(__name__)

# Seeded orders are A1001...; paid ones get seven digits, so they never meet.
ORDER_NUMBER_DIGITS = 7
NUMBER_ATTEMPTS = 5


def new_order_number() -> str:
    low = 10 ** (ORDER_NUMBER_DIGITS - 1)
    return f"A{low + secrets.randbelow(9 * low)}"


def order_tenant(*, raw_key: str, origin: str) -> Tenant | None:
    """The tenant whose assistant the page uses, when its key may be used from
    `origin`; None for a page without a usable key (the order is then only in
    the visitor's session)."""
    key = keys.api_key_lookup(raw_key)
    if admission.api_key_refusal(key, origin=origin, now=timezone.now()) is not None:
        return None
    return key.tenant


def demo_order_record_paid(*, tenant: Tenant, lines: list[dict], total: Decimal) -> DemoOrder:
    """A paid order of the tenant's shop, under a new order number."""
    items = [{"sku": line["productId"], "name": line["name"], "qty": line["quantity"]}
             for line in lines]
    for _ in range(NUMBER_ATTEMPTS):
        try:
            with transaction.atomic():
                return DemoOrder.objects.create(
                    tenant=tenant, number=new_order_number(), status=DemoOrder.Status.PAID,
                    items=items, total=total,
                )
        except IntegrityError:
            continue  # that number is taken: draw another
    raise RuntimeError("no free order number after several draws")
