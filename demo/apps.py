from django.apps import AppConfig


class DemoConfig(AppConfig):
    name = "demo"
    verbose_name = "Demo store"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from aitp import ports

        # Registers the shop's Python server tools (order_status, cancel_order).
        from demo import order_tools

        # manage.py ensure_demo (in the protocol app) offers them through this.
        ports.provide(demo_tools=order_tools.demo_tools_install)
