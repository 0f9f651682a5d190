"""A page's connection publishes its frames for watchers only while someone
watches its session (aitp.live.LivePublisher), on the channel layer the run
uses (in-memory, or Redis in the second pass)."""
from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
from channels.layers import get_channel_layer

from aitp import live

# How long a message already sent may take to reach a channel on a loaded
# machine; receives return as soon as it is there.
DELIVERY_PATIENCE = 10


class Describer:
    """A frame's text made on demand, counting how often it was made."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.made = 0

    def __call__(self) -> str:
        self.made += 1
        return self.text


@pytest.fixture
async def watcher_channel():
    layer = get_channel_layer()
    channel = await layer.new_channel()
    joined: list[str] = []

    async def join(session_id: str) -> None:
        group = live.session_watch_group(session_id)
        await layer.group_add(group, channel)
        joined.append(group)

    async def leave(session_id: str) -> None:
        group = live.session_watch_group(session_id)
        await layer.group_discard(group, channel)
        joined.remove(group)

    yield SimpleNamespace(layer=layer, name=channel, join=join, leave=leave)
    for group in joined:
        await layer.group_discard(group, channel)
    # The layer outlives this test's event loop. On Redis each receive leaves
    # a task that cleans its message's backup copy and holds a per-channel
    # lock until it ends; one still pending when the loop closes leaves that
    # lock bound to a dead loop, and the next test's receive fails on it.
    wait_received = getattr(layer, "wait_received", None)
    if wait_received is not None:
        await wait_received()


def a_session(session_id: str) -> SimpleNamespace:
    return SimpleNamespace(id=session_id, tenant_id=1)


async def received_text(layer, channel: str) -> str:
    message = await asyncio.wait_for(layer.receive(channel), DELIVERY_PATIENCE)
    assert message["type"] == "watch.frame"
    return message["text"]


async def test_a_frame_nobody_watches_is_never_made_nor_sent():
    publisher = live.LivePublisher(a_session("ses_unwatched"))
    describe = Describer('{"type": "USER_INPUT"}')
    publisher.frame("in", describe)
    publisher.frame("out", '{"type": "AGENT_RESPONSE"}')
    assert describe.made == 0
    assert publisher.task is None
    await publisher.aclose()


async def test_a_joined_watcher_gets_the_frames_that_follow_in_order(watcher_channel):
    publisher = live.LivePublisher(a_session("ses_watched"))
    publisher.frame("out", '{"n": 0}')
    await watcher_channel.join("ses_watched")
    publisher.watchers_joined()
    publisher.frame("in", Describer('{"n": 1}'))
    publisher.frame("out", '{"n": 2}')
    assert await received_text(watcher_channel.layer, watcher_channel.name) == '{"n": 1}'
    assert await received_text(watcher_channel.layer, watcher_channel.name) == '{"n": 2}'
    await publisher.aclose()


async def test_a_connection_opened_after_a_watcher_joined_finds_it(watcher_channel):
    await watcher_channel.join("ses_early")
    publisher = live.LivePublisher(a_session("ses_early"))
    publisher.start()
    # The group is asked once, in order before the first frame.
    await asyncio.wait_for(_until(lambda: publisher.watched), DELIVERY_PATIENCE)
    publisher.frame("out", '{"n": 1}')
    assert await received_text(watcher_channel.layer, watcher_channel.name) == '{"n": 1}'
    await publisher.aclose()


async def test_frames_stop_once_the_last_watcher_left(watcher_channel):
    publisher = live.LivePublisher(a_session("ses_left"))
    await watcher_channel.join("ses_left")
    publisher.watchers_joined()
    await watcher_channel.leave("ses_left")
    publisher.watchers_left()
    await asyncio.wait_for(_until(lambda: not publisher.watched), DELIVERY_PATIENCE)
    describe = Describer('{"n": 1}')
    publisher.frame("out", describe)
    assert describe.made == 0
    await publisher.aclose()


async def test_a_watcher_joining_while_the_group_is_checked_keeps_the_frames(watcher_channel):
    publisher = live.LivePublisher(a_session("ses_rejoined"))
    publisher.watchers_joined()
    # One watcher left (the group is empty when checked), another joined
    # before the check came back: the frames stay on.
    publisher.watchers_left()
    publisher.watchers_joined()
    await watcher_channel.join("ses_rejoined")
    publisher.frame("out", '{"n": 1}')
    assert await received_text(watcher_channel.layer, watcher_channel.name) == '{"n": 1}'
    assert publisher.watched
    await publisher.aclose()


async def test_the_connection_answers_a_joining_watcher_before_its_first_frame(watcher_channel):
    publisher = live.LivePublisher(a_session("ses_answer"))
    await watcher_channel.join("ses_answer")
    await publisher.watchers_changed({"watching": True, "reply_to": watcher_channel.name})
    publisher.frame("out", '{"n": 1}')
    layer, channel = watcher_channel.layer, watcher_channel.name
    ready = await asyncio.wait_for(layer.receive(channel), DELIVERY_PATIENCE)
    assert ready == {"type": live.WATCH_READY, "session_id": "ses_answer"}
    assert await received_text(layer, channel) == '{"n": 1}'
    await publisher.aclose()


async def _until(condition) -> None:
    while not condition():
        await asyncio.sleep(0.01)


async def test_a_session_event_of_a_tenant_known_to_have_no_watcher_queues_nothing(monkeypatch):
    from channels.layers import InMemoryChannelLayer

    from aitp import notify

    layer = get_channel_layer()
    monkeypatch.setattr(live, "_watch_presence", live.RecentAnswers(lambda: 3600))
    publisher = live.LivePublisher(SimpleNamespace(id="ses_unwatched_events", tenant_id=77))
    if not isinstance(layer, InMemoryChannelLayer):
        # Not known yet: the publisher asks the groups (and learns the answer).
        publisher.session_changed("opened")
        assert publisher.queue.qsize() == 1
        await publisher.aclose()
        assert live._watch_presence.known(notify.tenant_watch_group(77), None) is False
    publisher = live.LivePublisher(SimpleNamespace(id="ses_unwatched_events", tenant_id=77))
    publisher.session_changed("closed", code=1000)
    assert publisher.queue.qsize() == 0 and publisher.task is None
