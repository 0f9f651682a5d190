from django.core.management.base import BaseCommand

from aitp import services
from approvals import services as approvals


class Command(BaseCommand):
    help = (
        "Tidy up after server processes that died: close their sessions' rows and expire "
        "approvals past their deadline. Safe to run at any time, from several processes."
    )

    def handle(self, *args, **options):
        closed = services.sessions_close_stale()
        expired = approvals.approval_expire_overdue()
        self.stdout.write(f"closed {closed} stale sessions, expired {expired} overdue approvals")
