"""`python -m aitp_client`: the terminal chat, run as a real process."""
from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

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
    assert '[tool call] add_to_cart({"q": 1}): not run, no tools in the terminal' in output
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


async def approval_agent(peer: Peer) -> None:
    """Asks to approve a refund once the user wrote, then says what it was told."""
    await peer.accept_handshake()
    await peer.recv()  # CONTEXT_UPDATE
    await peer.recv()  # USER_INPUT
    await peer.send("APPROVAL_REQUEST", {
        "callId": "tc_9", "toolName": "refund", "args": {"order": "A1"}, "risk": "high",
        "message": "Refund order A1?",
    })
    answer = await peer.recv()
    told = "allowed" if answer["payload"]["approved"] else answer["payload"]["error"]
    await peer.send("AGENT_RESPONSE", {"chunk": f"told: {told}", "done": True})
    await peer.ws.wait_closed()


async def test_an_approval_request_asks_the_user_and_a_yes_approves(fake_server):
    server = await fake_server(approval_agent)

    code, output = await run_chat(server.url, "refund my order\ny\n")

    assert code == 0, output
    assert '[approval] Refund order A1?\n  refund({"order": "A1"}), high risk\nAllow refund? [y/n] ' in output
    assert "told: allowed" in output
    assert server.peers[0].received[3]["type"] == "APPROVAL_RESPONSE"
    assert server.peers[0].received[3]["payload"] == {"callId": "tc_9", "approved": True}


async def test_a_no_is_sent_as_the_users_refusal_and_reported_as_one(fake_server):
    server = await fake_server(approval_agent)

    code, output = await run_chat(server.url, "refund my order\nmaybe\nn\n")

    assert code == 0, output
    assert "Please answer y or n." in output
    assert "[approval] you declined refund" in output
    assert server.peers[0].received[3]["payload"] == {
        "callId": "tc_9", "approved": False, "error": "Action denied by user"}


async def test_an_approval_left_unanswered_at_end_of_input_is_refused_for_that_reason(fake_server):
    server = await fake_server(approval_agent)

    code, output = await run_chat(server.url, "refund my order\n")

    assert code == 0, output
    assert "[approval] refund refused: the terminal user gave no answer" in output
    assert server.peers[0].received[3]["payload"]["error"].startswith("the terminal user gave no answer")


async def test_quit_and_help_are_answered_by_the_terminal_never_sent_to_the_agent(fake_server):
    async def agent(peer: Peer) -> None:
        await peer.accept_handshake()
        await peer.recv()  # CONTEXT_UPDATE
        await peer.ws.wait_closed()

    server = await fake_server(agent)

    code, output = await run_chat(server.url, "/help\n/quit\nnever sent\n")

    assert code == 0, output
    assert "/quit (or ctrl-d) ends the chat" in output
    assert [f["type"] for f in server.peers[0].received] == ["HANDSHAKE_INIT", "CONTEXT_UPDATE"]


async def test_a_prompt_is_shown_when_the_chat_waits_for_a_line(fake_server):
    async def agent(peer: Peer) -> None:
        await peer.accept_handshake()
        await peer.recv()  # CONTEXT_UPDATE
        await peer.recv()
        await peer.send("AGENT_RESPONSE", {"chunk": "hi", "done": True})
        await peer.ws.wait_closed()

    server = await fake_server(agent)

    code, output = await run_chat(server.url, "hello\n")

    assert code == 0, output
    assert output.count("you> ") == 2  # at the start and after the answer


async def test_a_web_address_given_as_url_is_one_line_without_the_key():
    code, output = await run_chat("http://127.0.0.1:8000/", "", "--key", "pk_live_secretsecret")

    assert code == 2
    assert output.strip().count("\n") == 0, output
    assert "Traceback" not in output and "secretsecret" not in output
    assert "give the server's socket, e.g. ws://127.0.0.1:8000/owllayer" in output


async def test_a_server_that_cannot_be_reached_is_one_line_without_the_key():
    # A port nothing listens on: bind one, note it, close it.
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]

    code, output = await run_chat(f"ws://127.0.0.1:{port}/owllayer", "", "--key", "pk_live_secretsecret")

    assert code == 2
    assert output.startswith("cannot connect:") and output.count("\n") == 1, output
    assert "secretsecret" not in output


@pytest.mark.django_db(transaction=True)
async def test_against_a_real_server_an_approval_answered_yes_runs_the_tool(daphne_factory):
    from asgiref.sync import sync_to_async

    from aitp import tenancy
    from demo.order_tools import demo_tools_install

    server = await sync_to_async(daphne_factory)()

    def shop() -> str:
        tenant = tenancy.tenant_create(slug="acme", name="Acme Store")
        _key, raw_key = tenancy.key_create(tenant=tenant, name="terminal",
                                           allowed_origins=[server.http_url])
        demo_tools_install(tenant=tenant)  # cancel_order: high risk, the page user approves
        return raw_key

    raw_key = await sync_to_async(shop)()

    code, output = await run_chat(server.ws_url(), '/tool cancel_order {"number": "A1003"}\ny\n',
                                  "--key", raw_key, "--origin", server.http_url)
    print(output)

    assert code == 0, output + server.logs()
    assert "Allow cancel_order? [y/n] " in output
    assert "[approval] you allowed cancel_order" in output
    assert "cancel_order succeeded" in output
    assert raw_key not in output
