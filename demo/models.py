"""The demo shop's orders: the rows its server tools look up and cancel, and
where a payment made in the store is recorded.

The table is still the one the approvals app created (``approvals_demoorder``):
the model moved here without moving the data.
"""
from __future__ import annotations

from django.db import models


class DemoOrder(models.Model):
    """Orders of the demo shop, so the built-in order tools act on real rows."""

    class Status(models.TextChoices):
        PENDING = "pending", "Pending"
        PAID = "paid", "Paid"
        SHIPPED = "shipped", "Shipped"
        DELIVERED = "delivered", "Delivered"
        CANCELLED = "cancelled", "Cancelled"

    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.CASCADE, related_name="demo_orders")
    number = models.CharField(max_length=32)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    items = models.JSONField(default=list, blank=True)
    total = models.DecimalField(max_digits=10, decimal_places=2, default=0)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        db_table = "approvals_demoorder"
        ordering = ["tenant", "number"]
        verbose_name = "order"
        verbose_name_plural = "orders"
        constraints = [
            models.UniqueConstraint(fields=["tenant", "number"], name="uniq_demoorder_tenant_number")
        ]

    def __str__(self) -> str:
        return self.number
