"""The baseline consumer: an ACK the client accepts, and a plain echo."""
from __future__ import annotations

import json

import pytest
from channels.testing import WebsocketCommunicator

from aitp_client import check_frame, envelope
from bench.baseline import REPLY_FIELD, BaselineConsumer


@pytest.fixture(autouse=True)
def no_database_between_frames(monkeypatch):
    """Channels closes stale database connections around every frame it
    dispatches. The baseline has no database; but a test that ran earlier
    (the browser tests do) may have left a connection open in the thread
    that does this, and closing it there is database access, which
    pytest-django refuses outside a database test. These tests are about
    frames only, so they run the same in any order."""

    async def nothing() -> None:
        return None

    monkeypatch.setattr("channels.consumer.aclose_old_connections", nothing)
    monkeypatch.setattr("channels.generic.websocket.aclose_old_connections", nothing)


async def connected() -> WebsocketCommunicator:
    communicator = WebsocketCommunicator(BaselineConsumer.as_asgi(), "/owllayer")
    connected, _ = await communicator.connect()
    assert connected
    return communicator


async def test_the_baseline_answers_a_handshake_with_an_ack_the_browser_accepts():
    communicator = await connected()
    init = envelope("HANDSHAKE_INIT", {"apiKey": "pk_live_x", "protocolVersion": "1.0.0"})

    await communicator.send_to(text_data=json.dumps(init))
    ack = json.loads(await communicator.receive_from())

    check_frame(ack, sender="server")
    assert ack["type"] == "HANDSHAKE_ACK"
    await communicator.disconnect()


async def test_the_baseline_echoes_any_other_frame_unchanged():
    communicator = await connected()
    text = json.dumps(envelope("CONTEXT_UPDATE", {"url": "/", "title": "t", "activeTools": [],
                                                  "context": {"n": 1}}))

    await communicator.send_to(text_data=text)
    echoed = await communicator.receive_from()
    await communicator.send_to(text_data="not json")
    echoed_garbage = await communicator.receive_from()

    assert echoed == text
    assert echoed_garbage == "not json"
    await communicator.disconnect()


async def test_the_baseline_answers_with_the_frame_sizes_it_is_asked_for():
    communicator = await connected()
    frame = envelope("USER_INPUT", {"modality": "text", "content": "hi",
                                    REPLY_FIELD: [120, 400]})

    await communicator.send_to(text_data=json.dumps(frame))
    first = await communicator.receive_from()
    last = await communicator.receive_from()

    assert [len(first.encode()), len(last.encode())] == [120, 400]
    assert json.loads(last)["id"] == frame["id"]
    await communicator.disconnect()
