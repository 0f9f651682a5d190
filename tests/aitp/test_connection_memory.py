"""What a closed connection leaves in memory: nothing the cycle collector has
to find. A connection's objects (the consumer, its session machine, agent,
ledger, row writer, watcher feed, tools) are freed by reference counting the
moment it ends; left in a reference cycle, thousands of them would wait for
the collector, whose passes stall every other page of the process."""
from __future__ import annotations

import asyncio
import gc
import weakref

import pytest

from aitp.consumer import AitpConsumer
from aitp.models import Session
from tests.aitp.conftest import ADD_TO_CART, CONSUMER_PATIENCE, open_page

pytestmark = [pytest.mark.django_db(transaction=True)]


def consumers() -> weakref.WeakSet:
    gc.collect()
    return weakref.WeakSet(o for o in gc.get_objects() if isinstance(o, AitpConsumer))


def the_new_consumer(before: weakref.WeakSet) -> AitpConsumer:
    """The consumer that serves the page opened since ``before`` (another
    test's page may still be open in this process)."""
    new = [consumer for consumer in consumers() if consumer not in before]
    assert len(new) == 1
    return new[0]


async def test_a_closed_connection_is_freed_without_the_cycle_collector(connect, api_key):
    before = consumers()
    page = await open_page(connect, api_key, tools=[ADD_TO_CART])
    await page.send("USER_INPUT", {"modality": "text", "content": "hello"})
    await page.recv_until("AGENT_RESPONSE", done=True)
    consumer = weakref.ref(the_new_consumer(before))
    agent = weakref.ref(consumer().runner.turns.agent)
    gc.disable()
    try:
        await page.close()
        assert (consumer(), agent()) == (None, None)
    finally:
        gc.enable()


async def test_a_connection_whose_heartbeats_fired_is_freed_without_the_cycle_collector(
        connect, api_key, settings):
    settings.OWLLAYER_HEARTBEAT_INTERVAL = 0.05
    before = consumers()
    page = await open_page(connect, api_key)
    consumer = weakref.ref(the_new_consumer(before))
    opened = consumer().runner.session_row
    async with asyncio.timeout(CONSUMER_PATIENCE):  # a heartbeat was written
        while (await Session.objects.aget(pk=opened.id)).last_seen_at == opened.last_seen_at:
            await asyncio.sleep(0.05)
    del opened
    gc.disable()
    try:
        await page.close()
        assert consumer() is None
    finally:
        gc.enable()
