from django.core.management.base import BaseCommand

from aitp import processes


class Command(BaseCommand):
    help = (
        "Tidy up after server processes that are gone (stopped, killed, or silent for three "
        "heartbeat intervals): close their sessions' rows whatever their age, give their tool "
        "calls a final status, close the approvals of ended sessions, and expire approvals past "
        "their deadline. Safe to run at any time, from several processes."
    )

    def handle(self, *args, **options):
        result = processes.sweep()
        self.stdout.write(
            f"closed {result.sessions} stale sessions of {result.processes} gone processes, "
            f"closed {result.approvals} approvals of ended sessions, "
            f"expired {result.expired} overdue approvals"
        )
