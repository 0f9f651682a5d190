"""Write a checkpoint of the audit chain's head now (cron, or before a backup)."""
from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from approvals import anchors
from approvals.models import AuditChainHead


class Command(BaseCommand):
    help = (
        "Append a signed checkpoint of the audit chain's newest event to OWLLAYER_AUDIT_ANCHOR_FILE "
        "(and POST it to OWLLAYER_AUDIT_ANCHOR_URL when set)."
    )

    def handle(self, *args, **options) -> None:
        if not anchors.enabled():
            raise CommandError("anchoring is off: set OWLLAYER_AUDIT_ANCHOR_FILE or OWLLAYER_AUDIT_ANCHOR_URL")
        head = AuditChainHead.objects.filter(pk=AuditChainHead.SINGLETON_PK).first()
        if head is None or head.last_seq == 0:
            self.stdout.write("the audit chain is empty: nothing to anchor")
            return
        try:
            anchors.write_checkpoint(seq=head.last_seq, hash=head.last_hash, keyed_from=head.keyed_from)
        except Exception as exc:
            raise CommandError(f"the checkpoint could not be written: {exc}") from None
        self.stdout.write(f"checkpoint written: event #{head.last_seq}")
