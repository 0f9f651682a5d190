from django.apps import AppConfig


class ApprovalsConfig(AppConfig):
    name = "approvals"
    verbose_name = "Approvals and tools"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from aitp import ports
        from approvals.provider import ApprovalsProvider, TenantWebhooksProvider

        # The protocol app reaches approvals and server tools only through this.
        ports.provide(approvals=ApprovalsProvider(), webhooks=TenantWebhooksProvider())
