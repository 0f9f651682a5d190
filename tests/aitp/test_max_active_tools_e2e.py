"""OWLLAYER_MAX_ACTIVE_TOOLS, end to end: a real daphne process started with
the setting changed tells the page its limit in HANDSHAKE_ACK, refuses a
CONTEXT_UPDATE over it with ``too_many_tools`` and keeps the page's previous
tools, and never offers the model more than that many page tools.

The page is the project's own client over a real socket; the model is the
fake Messages API behind the real SDK."""
from __future__ import annotations

import pytest

from aitp_client import AitpClient, final_text, system_event
from tests.aitp.conftest import ORIGIN
from tests.support.fake_anthropic import FakeAnthropicServer, text_response

pytestmark = [pytest.mark.django_db(transaction=True)]

API_KEY = "sk-ant-max-tools-tests"
MAX_TOOLS = 3


def page_tool(name: str) -> dict:
    return {"name": name, "description": f"Do {name}", "risk": "low"}


@pytest.fixture
def fake():
    with FakeAnthropicServer(api_key=API_KEY) as server:
        yield server


async def test_a_server_with_a_lower_tool_limit_says_it_refuses_more_and_offers_the_model_no_more(
    daphne_factory, fake, api_key
):
    server = daphne_factory(
        OWLLAYER_MAX_ACTIVE_TOOLS=MAX_TOOLS, OWLLAYER_LLM="anthropic", ANTHROPIC_API_KEY=API_KEY,
        ANTHROPIC_BASE_URL=fake.base_url, OWLLAYER_MODEL="claude-test-model",
        OWLLAYER_LLM_MAX_RETRIES=0, OWLLAYER_LLM_TIMEOUT=10,
    )
    kept = [page_tool(f"kept_{i}") for i in range(MAX_TOOLS)]
    over = [page_tool(f"over_{i}") for i in range(MAX_TOOLS + 1)]
    fake.enqueue(text_response("Here is what I can do."))
    client = AitpClient(server.ws_url(), api_key=api_key.raw, origin=ORIGIN)
    ack = await client.connect()
    try:
        await client.context_update("/kept", "Kept", tools=kept, context={"page": "kept"})
        accepted = await client.recv_until(system_event("tools_effective"))
        await client.context_update("/over", "Over", tools=over, context={"page": "over"})
        refused = await client.recv_until(system_event("error"))
        frames = await client.say("what can you do?")
    finally:
        await client.close()

    assert ack["maxActiveTools"] == MAX_TOOLS
    assert [t["name"] for t in accepted["payload"]["data"]["clientTools"]] == [
        t["name"] for t in kept]
    assert refused["payload"]["data"]["code"] == "too_many_tools"
    assert refused["payload"]["message"] == (
        f"{MAX_TOOLS + 1} tools declared; at most {MAX_TOOLS} are allowed")
    assert final_text(frames) == "Here is what I can do."
    (request,) = fake.requests
    assert [t["name"] for t in request["tools"]] == [t["name"] for t in kept]
    page_said = [b["text"] for b in request["messages"][-1]["content"]
                 if b["type"] == "text" and b["text"].startswith("[page]")]
    assert len(page_said) == 1 and "url: /kept" in page_said[0]
