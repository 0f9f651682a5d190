"""Built-in Python server tools of the demo shop: look up and cancel an order.

They act on ``DemoOrder`` rows of the calling session's tenant: the seeded
ones and those paid in the store. A tenant offers them with ``ServerTool``
rows of kind "python" (``demo_tools_install`` creates those and a few orders).
"""
from __future__ import annotations

from decimal import Decimal

from django.db import transaction

from approvals.models import Policy, ServerTool
from approvals.server_tools import ToolRunError, register_python_tool
from demo.models import DemoOrder

ORDER_NUMBER = {"type": "STRING", "description": "The order number, e.g. A1001"}
NOT_CANCELLABLE = (DemoOrder.Status.SHIPPED, DemoOrder.Status.DELIVERED, DemoOrder.Status.CANCELLED)


def _order_json(order: DemoOrder) -> dict:
    return {
        "number": order.number,
        "status": order.status,
        "items": order.items,
        "total": str(order.total),
    }


def _number(args: dict) -> str:
    number = args.get("number")
    if not isinstance(number, str) or not number.strip():
        raise ToolRunError("number is required")
    return number.strip()


@register_python_tool(
    "order_status",
    description="Look up an order of this shop by its number: status, items and total.",
    parameters={"type": "OBJECT", "properties": {"number": ORDER_NUMBER}, "required": ["number"]},
    risk="none",
)
def order_status(args: dict, *, session_id: str, tenant_id: int) -> dict:
    order = DemoOrder.objects.filter(tenant_id=tenant_id, number=_number(args)).first()
    if order is None:
        raise ToolRunError("no order with that number")
    return _order_json(order)


@register_python_tool(
    "cancel_order",
    description="Cancel an order of this shop that has not shipped yet.",
    parameters={"type": "OBJECT", "properties": {"number": ORDER_NUMBER}, "required": ["number"]},
    risk="high",
)
def cancel_order(args: dict, *, session_id: str, tenant_id: int) -> dict:
    number = _number(args)
    with transaction.atomic():
        order = DemoOrder.objects.select_for_update().filter(tenant_id=tenant_id, number=number).first()
        if order is None:
            raise ToolRunError("no order with that number")
        if order.status in NOT_CANCELLABLE:
            raise ToolRunError(f"order is already {order.status}")
        order.status = DemoOrder.Status.CANCELLED
        order.save(update_fields=["status", "updated_at"])
    return _order_json(order)


DEMO_ORDERS = [
    ("A1001", DemoOrder.Status.SHIPPED, [{"sku": "pro-headphones", "qty": 1}], "149.99"),
    ("A1002", DemoOrder.Status.PAID, [{"sku": "usb-c-cable", "qty": 2}], "19.98"),
    ("A1003", DemoOrder.Status.PENDING, [{"sku": "pro-headphones", "qty": 2}], "299.98"),
]


def demo_tools_install(*, tenant, policy: str = Policy.USER) -> list[ServerTool]:
    """Offer the demo tools to a tenant and give it a few orders. Idempotent:
    existing rows are kept as they are."""
    for number, status, items, total in DEMO_ORDERS:
        DemoOrder.objects.get_or_create(
            tenant=tenant, number=number,
            defaults={"status": status, "items": items, "total": Decimal(total)},
        )
    tools = []
    for handler in ("order_status", "cancel_order"):
        tool, _ = ServerTool.objects.get_or_create(
            tenant=tenant, name=handler,
            defaults={"kind": ServerTool.Kind.PYTHON, "python_handler": handler,
                      "risk": "high" if handler == "cancel_order" else "none",
                      "approval_policy": Policy(policy).value},
        )
        tools.append(tool)
    return tools
