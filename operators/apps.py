from django.apps import AppConfig


class OperatorsConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "operators"
    verbose_name = "Operators"
