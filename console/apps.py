from django.apps import AppConfig


class ConsoleConfig(AppConfig):
    name = "console"
    verbose_name = "Tenant console"
    default_auto_field = "django.db.models.BigAutoField"
