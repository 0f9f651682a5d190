from django.apps import AppConfig


class AitpConfig(AppConfig):
    name = "aitp"
    default_auto_field = "django.db.models.BigAutoField"
