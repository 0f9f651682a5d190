"""The baseline consumer: an ACK the client accepts, and a plain echo."""
from __future__ import annotations

import json

from channels.testing import WebsocketCommunicator

from aitp_client import check_frame, envelope
from bench.baseline import BaselineConsumer


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
