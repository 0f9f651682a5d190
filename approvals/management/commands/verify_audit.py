"""Check the audit chain end to end; exit 1 when any link is broken."""
from __future__ import annotations

from django.core.management.base import BaseCommand

from approvals.audit import verify_chain


class Command(BaseCommand):
    help = "Verify the approval audit chain: every event's hash and its link to the previous one."

    def handle(self, *args, **options) -> None:
        result = verify_chain()
        if result.ok:
            self.stdout.write(f"audit chain ok: {result.count} events")
            return
        where = f" at event #{result.first_bad_seq}" if result.first_bad_seq is not None else ""
        self.stderr.write(f"audit chain broken{where}: {result.problem}")
        # SystemExit rather than CommandError: CommandError would print its
        # own "CommandError:" line; the exit code is what scripts check.
        raise SystemExit(1)
