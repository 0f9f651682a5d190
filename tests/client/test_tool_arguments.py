"""The Python client checks a TOOL_CALL's arguments against the tool it
declared, with the server's own function, as the browser client does with
its own: the handler never sees arguments that do not fit."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from aitp_client import AitpClient
from tests.client.conftest import Peer

KEY = "pk_test_abc"
ADD_TO_CART = {
    "name": "add_to_cart",
    "description": "Add the product to the cart",
    "parameters": {"type": "OBJECT", "properties": {"quantity": {"type": "NUMBER"}},
                   "required": ["quantity"]},
}


def agent_calling_with(args: dict):
    async def script(peer: Peer) -> None:
        await peer.accept_handshake()
        await peer.recv()  # CONTEXT_UPDATE
        await peer.recv()  # USER_INPUT
        await peer.send("TOOL_CALL", {"callId": "tc_1", "name": "add_to_cart", "args": args})
        await peer.recv()  # TOOL_RESULT
        await peer.send("AGENT_RESPONSE", {"chunk": "done", "done": True})
        await peer.ws.wait_closed()

    return script


async def _turn(server, handler) -> dict:
    async with AitpClient(server.url, api_key=KEY) as client:
        await client.context_update("/", "Shop", tools=[ADD_TO_CART])
        await client.say("add two", on_tool_call=handler)
    return server.peers[0].received[3]["payload"]


async def test_a_tool_call_whose_arguments_do_not_fit_is_answered_without_the_handler(fake_server):
    server = await fake_server(agent_calling_with({"quantity": "two"}))
    calls = []

    result = await _turn(server, lambda name, args: calls.append(args))

    assert calls == []
    assert result == {"callId": "tc_1", "status": "error", "result": None,
                      "error": "invalid arguments: quantity: expected number"}


async def test_a_tool_call_whose_arguments_fit_reaches_the_handler(fake_server):
    server = await fake_server(agent_calling_with({"quantity": 2}))

    result = await _turn(server, lambda name, args: {"added": args["quantity"]})

    assert result == {"callId": "tc_1", "status": "success", "result": {"added": 2}}


def test_the_client_imports_without_django():
    code = ("import sys, aitp_client; "
            "print(sorted(m for m in sys.modules if m == 'django' or m.startswith('django.')))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin"}, cwd=Path(__file__).resolve().parents[2],
                          check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
