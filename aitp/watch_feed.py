"""The watcher feed of one connection: what operators watching it live see.

Every frame in (as the page sent it, rebuilt from the session machine's
event) and out, and every change of the session (opened, context, state,
closed), queued on the connection's ``aitp.live.LivePublisher`` so the
connection never waits on the channel layer, and published only while
someone watches. The consumer owns one per open
session.
"""
from __future__ import annotations

import json

from aitp import live
from aitp.session import (
    ApprovalRequestReceived,
    ContextChanged,
    ToolResultReceived,
    UserTextReceived,
)


class WatcherFeed:
    def __init__(self, session) -> None:
        self.publisher = live.LivePublisher(session)

    def start(self) -> None:
        """Once the connection is in its session's group (``LivePublisher.start``)."""
        self.publisher.start()

    def inbound(self, event) -> None:
        # Described only when someone watches.
        self.publisher.frame("in", lambda: describe_inbound(event))

    async def watchers_changed(self, event: dict) -> None:
        """A watcher joined or left (the ``live.WATCHERS_COMMAND`` session command)."""
        await self.publisher.watchers_changed(event)

    def outbound(self, frame: str) -> None:
        self.publisher.frame("out", frame)

    def session_changed(self, what: str, **fields) -> None:
        self.publisher.session_changed(what, **fields)

    async def aclose(self) -> None:
        await self.publisher.aclose()


def describe_inbound(event) -> str:
    """The inbound message behind an event, as JSON text for watchers."""
    if isinstance(event, ContextChanged):
        body = {"type": "CONTEXT_UPDATE", "payload": {
            "url": event.url, "title": event.title, "context": event.context,
            "activeTools": [tool.to_wire() for tool in event.tools]}}
    elif isinstance(event, UserTextReceived):
        body = {"type": "USER_INPUT", "payload": {"modality": "text", "content": event.text}}
    elif isinstance(event, ToolResultReceived):
        body = {"type": "TOOL_RESULT", "payload": event.result.model_dump(exclude_none=True)}
    elif isinstance(event, ApprovalRequestReceived):
        body = {"type": "APPROVAL_REQUEST", "payload": event.request.model_dump(exclude_none=True)}
    else:
        body = {"type": "APPROVAL_RESPONSE", "payload": event.response.model_dump(exclude_none=True)}
    return json.dumps(body, ensure_ascii=False, default=str)
