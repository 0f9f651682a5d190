from importlib import import_module

from django.apps import AppConfig


class DemoConfig(AppConfig):
    name = "demo"
    verbose_name = "Demo store"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Importing it registers the shop's Python server tools (order_status,
        # cancel_order); manage.py ensure_demo offers them to the demo tenant.
        import_module("demo.order_tools")
