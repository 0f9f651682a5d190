from django.apps import AppConfig


class DemoConfig(AppConfig):
    name = "demo"
    verbose_name = "Demo store"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Registers the shop's Python server tools (order_status, cancel_order).
        from demo import order_tools  # noqa: F401
