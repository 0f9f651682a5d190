from django.apps import AppConfig


class ApprovalsConfig(AppConfig):
    name = "approvals"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Registers the built-in Python server tools.
        from approvals import builtin_tools  # noqa: F401
