"""What operators watching live sessions are told (a notification, never the
record: the watcher re-reads the database for anything it shows in full)."""
from __future__ import annotations

import logging

from django.utils import timezone

from aitp import notify

logger = logging.getLogger(__name__)


def session_watch_group(session_id: str) -> str:
    return f"aitp.watch.session.{session_id}"


async def publish_frame(session, direction: str, text: str) -> None:
    """One AITP frame of a session as JSON text ("in" from the page, "out" to
    it), for operators watching that session live."""
    if session is None:
        return
    await notify.asend(
        session_watch_group(session.id), "watch.frame",
        session_id=session.id, direction=direction, text=text,
    )


async def publish_session(session, what: str, **fields) -> None:
    """Tell watchers of this session's tenant (and superusers) that it changed."""
    if session is None:
        return
    event = {
        "session_id": session.id,
        "tenant_id": session.tenant_id,
        "what": what,
        "at": timezone.now().isoformat(),
        **fields,
    }
    await notify.asend(notify.tenant_watch_group(session.tenant_id), "watch.event", event=event)
    await notify.asend(notify.ALL_WATCH_GROUP, "watch.event", event=event)
