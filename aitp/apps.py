from django.apps import AppConfig


class AitpConfig(AppConfig):
    name = "aitp"
    verbose_name = "Sessions and keys"
    default_auto_field = "django.db.models.BigAutoField"
