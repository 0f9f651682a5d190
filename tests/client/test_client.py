"""AitpClient against a scripted peer: what it sends, what it accepts, how it fails."""
from __future__ import annotations

import json

import pytest
from websockets.asyncio.server import ServerConnection
from websockets.http11 import Request

from aitp_client import (
    AitpClient,
    AitpClosed,
    AitpProtocolError,
    AitpRefused,
    AitpUpgradeRefused,
    final_text,
    streamed_text,
    system_event,
)
from tests.client.conftest import ACK, Peer

KEY = "pk_test_abc/+="


async def hold_open(peer: Peer) -> None:
    await peer.accept_handshake()
    await peer.ws.wait_closed()


async def test_sends_the_key_in_the_query_and_in_the_handshake_like_the_browser(fake_server):
    server = await fake_server(hold_open)

    async with AitpClient(server.url, api_key=KEY) as client:
        ack = client.ack

    peer = server.peers[0]
    init = peer.received[0]
    assert peer.path == "/owllayer?apiKey=pk_test_abc%2F%2B%3D"
    assert init["payload"] == {
        "apiKey": KEY,
        "userAgent": client.user_agent,
        "viewport": "1440x900",
        "sdkVersion": "0.4.0",
        "protocolVersion": "1.0.0",
    }
    assert init["id"].startswith("msg_") and isinstance(init["timestamp"], int)
    assert ack == ACK


async def test_returns_the_handshake_ack_payload_and_remembers_the_session(fake_server):
    server = await fake_server(hold_open)
    client = AitpClient(server.url, api_key=KEY)

    ack = await client.connect()
    await client.close()

    assert ack == ACK
    assert client.session_id == "ses_test0001"


async def test_can_leave_the_key_out_of_the_query_or_out_of_the_handshake(fake_server):
    server = await fake_server(hold_open)

    first = AitpClient(server.url, api_key=KEY)
    await first.connect(key_in_query=False)
    await first.close()
    second = AitpClient(server.url, api_key=KEY)
    await second.connect(key_in_handshake=False)
    await second.close()

    assert server.peers[0].path == "/owllayer"
    assert server.peers[0].received[0]["payload"]["apiKey"] == KEY
    assert server.peers[1].path.endswith("?apiKey=pk_test_abc%2F%2B%3D")
    assert "apiKey" not in server.peers[1].received[0]["payload"]


async def test_sends_the_origin_header_it_was_given(fake_server):
    server = await fake_server(hold_open)

    async with AitpClient(server.url, api_key=KEY, origin="http://localhost:8000"):
        pass

    assert server.peers[0].headers["Origin"] == "http://localhost:8000"


async def test_opens_the_socket_without_a_handshake_when_asked(fake_server):
    async def echo_first_frame_type(peer: Peer) -> None:
        frame = await peer.recv()
        await peer.send("SYSTEM_EVENT", {"kind": "waiting", "message": frame["type"]})
        await peer.ws.wait_closed()

    server = await fake_server(echo_first_frame_type)
    client = AitpClient(server.url, api_key=KEY)

    assert await client.connect(send_handshake=False) == {}
    await client.send("USER_INPUT", {"modality": "text", "content": "too early"})
    answer = await client.recv()
    await client.close()

    assert answer["payload"]["message"] == "USER_INPUT"
    assert client.ack is None


async def test_raises_refused_with_the_error_code_and_the_close_code(fake_server):
    async def refuse(peer: Peer) -> None:
        await peer.recv()
        await peer.send(
            "SYSTEM_EVENT",
            {"kind": "error", "message": "Invalid API key.", "data": {"code": "invalid_key"}},
        )
        await peer.ws.close(1008, "invalid api key")

    server = await fake_server(refuse)
    client = AitpClient(server.url, api_key="pk_wrong")

    with pytest.raises(AitpRefused) as caught:
        await client.connect()

    assert caught.value.code == "invalid_key"
    assert caught.value.message == "Invalid API key."
    assert (caught.value.close_code, caught.value.close_reason) == (1008, "invalid api key")
    assert (client.close_code, client.close_reason) == (1008, "invalid api key")


async def test_raises_closed_not_refused_when_the_server_closes_without_an_error_event(fake_server):
    async def close_at_once(peer: Peer) -> None:
        await peer.recv()
        await peer.ws.close(1011, "boom")

    server = await fake_server(close_at_once)

    with pytest.raises(AitpClosed) as caught:
        await AitpClient(server.url, api_key=KEY).connect()

    assert not isinstance(caught.value, AitpRefused)
    assert caught.value.close_code == 1011


async def test_raises_upgrade_refused_when_the_server_answers_the_upgrade_with_403(fake_server):
    def forbid(connection: ServerConnection, request: Request):
        return connection.respond(403, "no\n")

    server = await fake_server(hold_open, process_request=forbid)

    with pytest.raises(AitpUpgradeRefused) as caught:
        await AitpClient(server.url, api_key=KEY).connect()

    assert caught.value.status == 403


async def test_times_out_when_no_handshake_ack_comes(fake_server):
    async def say_nothing(peer: Peer) -> None:
        await peer.ws.wait_closed()

    server = await fake_server(say_nothing)
    client = AitpClient(server.url, api_key=KEY)

    with pytest.raises(TimeoutError, match="no HANDSHAKE_ACK"):
        await client.connect(timeout=0.2)
    await client.close()


async def test_refuses_a_frame_the_browser_client_would_drop(fake_server):
    async def send_a_null_message(peer: Peer) -> None:
        await peer.accept_handshake()
        await peer.send("SYSTEM_EVENT", {"kind": "waiting", "message": None})
        await peer.ws.wait_closed()

    server = await fake_server(send_a_null_message)

    async with AitpClient(server.url, api_key=KEY) as client:
        with pytest.raises(AitpProtocolError) as caught:
            await client.recv()

    assert caught.value.problems == ["payload.message: None is not of type 'string'"]


async def test_refuses_a_handshake_ack_with_a_max_active_tools_of_zero(fake_server):
    async def bad_ack(peer: Peer) -> None:
        await peer.accept_handshake({**ACK, "maxActiveTools": 0})
        await peer.ws.wait_closed()

    server = await fake_server(bad_ack)
    client = AitpClient(server.url, api_key=KEY)

    with pytest.raises(AitpProtocolError, match="maxActiveTools"):
        await client.connect()
    await client.close()


async def test_a_lenient_client_accepts_what_the_browser_would_drop(fake_server):
    async def send_a_null_message(peer: Peer) -> None:
        await peer.accept_handshake()
        await peer.send("SYSTEM_EVENT", {"kind": "waiting", "message": None})
        await peer.ws.wait_closed()

    server = await fake_server(send_a_null_message)

    async with AitpClient(server.url, api_key=KEY, strict=False) as client:
        frame = await client.recv()

    assert frame["payload"] == {"kind": "waiting", "message": None}


async def test_refuses_text_that_is_not_json(fake_server):
    async def send_garbage(peer: Peer) -> None:
        await peer.accept_handshake()
        await peer.ws.send("{not json")
        await peer.ws.wait_closed()

    server = await fake_server(send_garbage)

    async with AitpClient(server.url, api_key=KEY) as client:
        with pytest.raises(AitpProtocolError, match="not json"):
            await client.recv()


async def test_recv_until_returns_the_match_and_keeps_the_frames_it_skipped(fake_server):
    async def three_events(peer: Peer) -> None:
        await peer.accept_handshake()
        await peer.send("SYSTEM_EVENT", {"kind": "waiting"})
        await peer.send("AGENT_RESPONSE", {"chunk": "a", "done": False})
        await peer.send("SYSTEM_EVENT", {"kind": "tools_effective", "data": {"effectiveTools": []}})
        await peer.ws.wait_closed()

    server = await fake_server(three_events)

    async with AitpClient(server.url, api_key=KEY) as client:
        match = await client.recv_until(system_event("tools_effective"))

    assert match["payload"]["kind"] == "tools_effective"
    assert [f["type"] for f in client.received] == ["SYSTEM_EVENT", "AGENT_RESPONSE"]
    assert len(client.history) == 4  # the ACK, then three events


async def test_recv_until_names_what_it_saw_when_it_times_out(fake_server):
    async def one_event(peer: Peer) -> None:
        await peer.accept_handshake()
        await peer.send("SYSTEM_EVENT", {"kind": "waiting"})
        await peer.ws.wait_closed()

    server = await fake_server(one_event)

    async with AitpClient(server.url, api_key=KEY) as client:
        with pytest.raises(TimeoutError, match=r"saw SYSTEM_EVENT:waiting"):
            await client.recv_until("TOOL_CALL", timeout=0.3)


async def test_context_update_sends_a_full_snapshot(fake_server):
    server = await fake_server(hold_open)
    tool = {"name": "add_to_cart", "description": "Add it", "risk": "low"}

    async with AitpClient(server.url, api_key=KEY) as client:
        await client.context_update("/products/1", "Product", [tool], {"productId": "1"})
        await client.context_update("/", "Home")

    peer = server.peers[0]
    while len(peer.received) < 3:
        await peer.recv()
    assert [f["payload"] for f in peer.received[1:]] == [
        {"url": "/products/1", "title": "Product", "activeTools": [tool], "context": {"productId": "1"}},
        {"url": "/", "title": "Home", "activeTools": [], "context": {}},
    ]


async def agent_with_one_tool(peer: Peer) -> None:
    """Answers a USER_INPUT with a TOOL_CALL, then streams what the tool said."""
    await peer.accept_handshake()
    said = await peer.recv()
    assert said["payload"] == {"modality": "text", "content": "add two"}
    await peer.send("TOOL_CALL", {"callId": "tc_1", "name": "add_to_cart", "args": {"quantity": 2}})
    answer = await peer.recv()
    text = json.dumps(answer["payload"].get("result") or answer["payload"]["error"])
    await peer.send("AGENT_RESPONSE", {"chunk": "Tool said: ", "done": False})
    await peer.send("AGENT_RESPONSE", {"chunk": text, "done": False})
    await peer.send("AGENT_RESPONSE", {"chunk": "Tool said: " + text, "done": True})
    await peer.ws.wait_closed()


async def test_say_answers_tool_calls_and_returns_every_frame_of_the_turn(fake_server):
    server = await fake_server(agent_with_one_tool)
    calls = []

    async def add_to_cart(name: str, args: dict) -> dict:
        calls.append((name, args))
        return {"added": args["quantity"]}

    async with AitpClient(server.url, api_key=KEY) as client:
        frames = await client.say("add two", on_tool_call=add_to_cart)

    assert calls == [("add_to_cart", {"quantity": 2})]
    assert server.peers[0].received[2]["payload"] == {
        "callId": "tc_1",
        "status": "success",
        "result": {"added": 2},
    }
    assert [f["type"] for f in frames] == ["TOOL_CALL"] + ["AGENT_RESPONSE"] * 3
    assert final_text(frames) == 'Tool said: {"added": 2}'
    assert streamed_text(frames) == final_text(frames)


async def test_say_turns_a_failing_tool_handler_into_an_error_result(fake_server):
    server = await fake_server(agent_with_one_tool)

    def broken(name: str, args: dict) -> None:
        raise RuntimeError("cart is closed")

    async with AitpClient(server.url, api_key=KEY) as client:
        frames = await client.say("add two", on_tool_call=broken)

    assert server.peers[0].received[2]["payload"] == {
        "callId": "tc_1",
        "status": "error",
        "result": None,
        "error": "cart is closed",
    }
    assert final_text(frames) == 'Tool said: "cart is closed"'


async def test_say_denies_a_server_approval_request_when_the_handler_says_no(fake_server):
    async def ask_first(peer: Peer) -> None:
        await peer.accept_handshake()
        await peer.recv()
        await peer.send(
            "APPROVAL_REQUEST",
            {"callId": "tc_9", "toolName": "refund", "risk": "high", "args": {}, "message": "Refund?"},
        )
        decision = await peer.recv()
        await peer.send("AGENT_RESPONSE", {"chunk": str(decision["payload"]), "done": True})
        await peer.ws.wait_closed()

    server = await fake_server(ask_first)

    async with AitpClient(server.url, api_key=KEY) as client:
        frames = await client.say("refund me", on_approval=lambda payload: False)

    assert server.peers[0].received[2]["payload"] == {
        "callId": "tc_9",
        "approved": False,
        "error": "Action denied by user",
    }
    assert frames[0]["type"] == "APPROVAL_REQUEST"


async def test_wait_closed_reports_the_code_and_reason_the_server_closed_with(fake_server):
    async def end_session(peer: Peer) -> None:
        await peer.accept_handshake()
        await peer.send("SYSTEM_EVENT", {"kind": "disconnect", "message": "Ended by an operator."})
        await peer.ws.close(1008, "session ended")

    server = await fake_server(end_session)

    async with AitpClient(server.url, api_key=KEY) as client:
        code, reason = await client.wait_closed()

    assert (code, reason) == (1008, "session ended")
    assert client.received[-1]["payload"]["kind"] == "disconnect"
    with pytest.raises(AitpClosed):
        await client.recv()
