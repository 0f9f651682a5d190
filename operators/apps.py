from django.apps import AppConfig


class OperatorsConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "operators"
    verbose_name = "Operators"

    def ready(self) -> None:
        from operators.access import connect_receivers

        connect_receivers()
