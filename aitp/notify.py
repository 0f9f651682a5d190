"""Channel-layer notifications: the database holds the truth, these only say
"look again". Event types are built here, never copied from a client frame."""
from __future__ import annotations

import logging
import time

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer

from runtime import metrics

logger = logging.getLogger(__name__)


class _Timed:
    """A channel-layer call, timed for the process's figures (``runtime.metrics``)."""

    __slots__ = ("operation", "started")

    def __init__(self, operation: str) -> None:
        self.operation = operation
        self.started = 0.0

    def __enter__(self) -> None:
        self.started = time.monotonic()

    def __exit__(self, *exc: object) -> None:
        metrics.channel_layer_call(self.operation, time.monotonic() - self.started)


def key_group(key_id: int) -> str:
    return f"aitp.key.{key_id}"


def session_group(session_id: str) -> str:
    return f"aitp.session.{session_id}"


def tenant_watch_group(tenant_id: int) -> str:
    return f"aitp.watch.tenant.{tenant_id}"


ALL_WATCH_GROUP = "aitp.watch.all"


async def join(layer, groups: list[str], channel: str, *, ask: str | None = None) -> bool | None:
    """Add a channel to several groups: in one round trip on a layer that can
    (``groups_add``, the Redis layer), else one group after another. With
    ``ask``, such a layer also says, in that round trip, whether that group
    has members (once the channel joined its groups); None: not asked."""
    with _Timed("join"):
        many = getattr(layer, "groups_add", None)
        if many is not None:
            return await many(groups, channel, ask=ask)
        for group in groups:
            await layer.group_add(group, channel)
        return None


async def leave(layer, groups: list[str], channel: str) -> None:
    """Take a channel out of several groups (``groups_discard`` where the layer has it)."""
    with _Timed("leave"):
        many = getattr(layer, "groups_discard", None)
        if many is not None:
            await many(groups, channel)
            return
        for group in groups:
            await layer.group_discard(group, channel)


async def asend(group: str, event_type: str, **fields) -> None:
    layer = get_channel_layer()
    if layer is None:
        return
    with _Timed("send"):
        await layer.group_send(group, {"type": event_type, **fields})


def send(group: str, event_type: str, **fields) -> None:
    """From sync code (services, admin, management commands)."""
    layer = get_channel_layer()
    if layer is None:
        return
    async_to_sync(layer.group_send)(group, {"type": event_type, **fields})


def key_changed(key_id: int) -> None:
    send(key_group(key_id), "key.changed", key_id=key_id)


def session_command(session_id: str, command: str, **fields) -> None:
    """Ask the process holding a session to act on it (end, reload, redirect, re-read an approval)."""
    send(session_group(session_id), "session.command", command=command, **fields)
