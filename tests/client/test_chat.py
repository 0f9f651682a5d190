"""`python -m aitp_client`: the terminal chat, run as a real process."""
from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from tests.client.conftest import Peer

PROJECT_ROOT = Path(__file__).resolve().parents[2]


async def run_chat(url: str, stdin: str, *extra: str) -> tuple[int, str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "aitp_client", "--url", url, "--key", "pk_test_1", *extra,
        cwd=PROJECT_ROOT,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    output, _ = await asyncio.wait_for(process.communicate(stdin.encode()), 60)
    return process.returncode, output.decode()


async def test_prints_the_streamed_answer_and_refuses_tool_calls(fake_server):
    async def agent(peer: Peer) -> None:
        await peer.accept_handshake()
        context = await peer.recv()
        assert context["type"] == "CONTEXT_UPDATE"
        await peer.send("SYSTEM_EVENT", {"kind": "tools_effective", "data": {"effectiveTools": []}})
        said = await peer.recv()
        await peer.send("TOOL_CALL", {"callId": "tc_1", "name": "add_to_cart", "args": {"q": 1}})
        answer = await peer.recv()
        await peer.send("AGENT_RESPONSE", {"chunk": "You said ", "done": False})
        await peer.send("AGENT_RESPONSE", {"chunk": said["payload"]["content"], "done": False})
        await peer.send(
            "AGENT_RESPONSE",
            {"chunk": f"You said {said['payload']['content']}; {answer['payload']['error']}", "done": True},
        )
        await peer.ws.wait_closed()

    server = await fake_server(agent)

    code, output = await run_chat(server.url, "hello owl\n", "--origin", "http://localhost:8000")

    assert code == 0, output
    assert "connected, session ses_test0001" in output
    assert '[tool call] add_to_cart({"q": 1}): no tools in the terminal' in output
    assert "You said hello owl; no tools in the terminal\n" in output
    tool_result = server.peers[0].received[3]["payload"]
    assert tool_result == {
        "callId": "tc_1",
        "status": "error",
        "result": None,
        "error": "no tools in the terminal",
    }
    assert server.peers[0].headers["Origin"] == "http://localhost:8000"


async def test_says_why_the_server_refused_and_exits_non_zero(fake_server):
    async def refuse(peer: Peer) -> None:
        await peer.recv()
        await peer.send("SYSTEM_EVENT", {"kind": "error", "message": "Origin not allowed."})
        await peer.ws.close(1008, "origin not allowed")

    server = await fake_server(refuse)

    code, output = await run_chat(server.url, "")

    assert code == 2
    assert "refused: Origin not allowed. (close 1008 origin not allowed)" in output


async def test_sends_the_next_line_only_after_the_turn_is_done(fake_server):
    async def agent(peer: Peer) -> None:
        await peer.accept_handshake()
        await peer.recv()  # CONTEXT_UPDATE
        first = await peer.recv()
        await peer.send("TOOL_CALL", {"callId": "tc_1", "name": "look", "args": {}})
        # Both lines are already on stdin: a client that did not wait for
        # the turn would have sent the second one before this answer.
        answer = await peer.recv()
        await peer.send("AGENT_RESPONSE", {"chunk": "one", "done": True})
        second = await peer.recv()
        await peer.send("AGENT_RESPONSE", {"chunk": "two", "done": True})
        assert answer["type"] == "TOOL_RESULT"
        assert [first["payload"]["content"], second["payload"]["content"]] == ["first", "second"]
        await peer.ws.wait_closed()

    server = await fake_server(agent)

    code, output = await run_chat(server.url, "first\nsecond\n")

    assert code == 0, output
    assert [f["type"] for f in server.peers[0].received] == [
        "HANDSHAKE_INIT", "CONTEXT_UPDATE", "USER_INPUT", "TOOL_RESULT", "USER_INPUT",
    ]
    assert "one\n" in output and "two\n" in output


async def test_an_error_event_lets_the_next_line_go(fake_server):
    async def agent(peer: Peer) -> None:
        await peer.accept_handshake()
        await peer.recv()  # CONTEXT_UPDATE
        await peer.recv()
        await peer.send("SYSTEM_EVENT", {"kind": "error", "message": "busy, try again"})
        await peer.recv()
        await peer.send("AGENT_RESPONSE", {"chunk": "done now", "done": True})
        await peer.ws.wait_closed()

    server = await fake_server(agent)

    code, output = await run_chat(server.url, "first\nsecond\n")

    assert code == 0, output
    assert "[error] busy, try again" in output
    assert "done now" in output
