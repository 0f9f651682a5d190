"""The embedded default's channel layer (owllayer_site.channel_layer): Channels'
in-memory layer whose sweep for expired messages runs once per interval, not
on every message."""
from __future__ import annotations

import asyncio

from owllayer_site.channel_layer import InMemoryChannelLayer

# A bound against a hang only.
PATIENCE = 10


async def test_a_message_reaches_a_channel_of_its_group():
    layer = InMemoryChannelLayer()
    channel = await layer.new_channel()
    await layer.group_add("watchers", channel)
    await layer.group_send("watchers", {"type": "hello"})
    assert await asyncio.wait_for(layer.receive(channel), PATIENCE) == {"type": "hello"}


async def test_expired_messages_are_swept_once_per_interval_not_per_message():
    # Messages expire as they are sent (expiry -1); the sweep runs at the
    # first group send, then not for an hour.
    layer = InMemoryChannelLayer(expiry=-1, sweep_interval=3600)
    gone = await layer.new_channel()
    await layer.group_add("watchers", gone)
    await layer.group_send("watchers", {"type": "first"})
    await layer.group_send("watchers", {"type": "second"})
    assert layer.channels[gone].qsize() == 2
    assert gone in layer.groups["watchers"]
    layer.swept_at -= 3600
    await layer.group_send("watchers", {"type": "third"})
    # The sweep dropped the channel's expired messages and its membership.
    assert gone not in layer.groups["watchers"]
    assert gone not in layer.channels
