"""Check the audit trail end to end; exit 1 when anything does not check out."""
from __future__ import annotations

from django.core.management.base import BaseCommand

from approvals.audit_check import audit_report


class Command(BaseCommand):
    help = (
        "Verify the approval audit chain: every event's hash (keyed with the audit key) and its "
        "link to the previous one, and every signed checkpoint of the anchor file against it."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument(
            "--anchors", action="append", metavar="FILE",
            help="an anchor file to check the chain against, instead of OWLLAYER_AUDIT_ANCHOR_FILE "
                 "(e.g. a copy kept elsewhere); may be given more than once",
        )

    def handle(self, *args, **options) -> None:
        report = audit_report(anchor_files=options["anchors"])
        for finding in report.findings:
            (self.stderr if finding.failed else self.stdout).write(finding.text + "\n")
        if not report.ok:
            # SystemExit rather than CommandError: CommandError would print its
            # own "CommandError:" line; the exit code is what scripts check.
            raise SystemExit(1)
