from django.core.management.base import BaseCommand
from django.utils import timezone

from aitp.budgets import budgets_check


class Command(BaseCommand):
    help = (
        "Tell the tenants whose model cost this month (UTC) passed 80% or 100% of their monthly "
        "budget, once per month and threshold, by e-mail to their owners and to their alert "
        "webhook. Every serving process does this on its own (OWLLAYER_BUDGET_CHECK_INTERVAL); "
        "this is for hosts that prefer cron. Safe to run from several places at once."
    )

    def handle(self, *args, **options):
        sent = budgets_check(timezone.now())
        for alert in sent:
            self.stdout.write(f"{alert.tenant.slug}: {alert.threshold}% of the {alert.month} budget")
        self.stdout.write(f"sent {len(sent)} budget alerts")
