"""One more server process appending to the audit chain, for
tests/approvals/test_anchors.py: ``python -m tests.approvals.anchor_appender
TENANT_ID EVENTS LINES``.

It appends EVENTS events, one transaction each, through the product's path
(so its own checkpoint thread anchors them to OWLLAYER_AUDIT_ANCHOR_FILE),
then appends LINES more checkpoint lines of event #1 straight to the file
as fast as it can, waits for its checkpoints and exits. The database, the
file and the anchoring settings come from the environment.
"""
from __future__ import annotations

import os
import sys


def main(tenant_id: int, events: int, lines: int) -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "owllayer_site.settings")
    import django

    django.setup()
    from django.conf import settings
    from django.db import transaction

    from approvals import anchors
    from approvals.audit import append_event
    from approvals.models import AuditEvent

    for _ in range(events):
        with transaction.atomic():
            append_event(tenant_id=tenant_id, action="requested", actor_kind="system",
                         actor=f"pid {os.getpid()}", channel="system")
    first = AuditEvent.objects.get(seq=1)
    line = anchors.checkpoint_line(seq=1, hash=first.hash, keyed_from=1)
    for _ in range(lines):
        anchors.append_line(settings.OWLLAYER_AUDIT_ANCHOR_FILE, line)
    if not anchors.flush(timeout=60):
        sys.exit("the checkpoints were not written in time")


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]))
