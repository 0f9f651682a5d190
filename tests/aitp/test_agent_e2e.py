"""The agent turn over a real socket: a real daphne process, configured like
production through its environment, talks to the fake Messages API through
the real SDK, and the project's own client (aitp_client) plays the page."""
from __future__ import annotations

import pytest

from aitp.models import ConversationMessage, ToolCall
from aitp_client import AitpClient, final_text, streamed_text, system_event
from tests.aitp.conftest import ADD_TO_CART, ORIGIN
from tests.support.fake_anthropic import (
    FakeAnthropicServer,
    error_response,
    text_response,
    tool_use_response,
)

pytestmark = [pytest.mark.django_db(transaction=True)]

API_KEY = "sk-ant-e2e-tests"


@pytest.fixture
def fake():
    with FakeAnthropicServer(api_key=API_KEY) as server:
        yield server


@pytest.fixture
def server(daphne_factory, fake):
    return daphne_factory(
        OWLLAYER_LLM="anthropic",
        ANTHROPIC_API_KEY=API_KEY,
        ANTHROPIC_BASE_URL=fake.base_url,
        OWLLAYER_MODEL="claude-test-model",
        OWLLAYER_LLM_MAX_RETRIES=0,
        OWLLAYER_LLM_TIMEOUT=10,
    )


async def open_client(server, api_key) -> AitpClient:
    client = AitpClient(server.ws_url(), api_key=api_key.raw, origin=ORIGIN)
    await client.connect()
    await client.context_update("/products/headphones", "Pro Headphones", tools=[ADD_TO_CART],
                                context={"productId": "pro-headphones"})
    await client.recv_until(system_event("tools_effective"))
    return client


async def test_a_turn_with_one_tool_call_round_trips_through_a_real_server(server, fake, api_key):
    fake.enqueue(
        tool_use_response([("toolu_e2e", "add_to_cart", {"quantity": 2})], text="Adding them."),
        text_response("Two are in your cart.", chunks=4),
    )
    calls: list[tuple[str, dict]] = []

    def add_to_cart(name: str, args: dict) -> dict:
        calls.append((name, args))
        return {"added": True, "cartTotal": 299.98}

    client = await open_client(server, api_key)
    try:
        frames = await client.say("Add 2 to my cart", on_tool_call=add_to_cart, timeout=20)
    finally:
        await client.close()

    assert calls == [("add_to_cart", {"quantity": 2})]
    assert final_text(frames) == streamed_text(frames) == "Adding them.\n\nTwo are in your cart."
    first, second = fake.requests
    assert second["messages"][-1]["content"][0] == {
        "type": "tool_result", "tool_use_id": "toolu_e2e",
        "content": '{"added":true,"cartTotal":299.98}',
        "cache_control": {"type": "ephemeral"},
    }
    row = await ToolCall.objects.aget(session_id=client.session_id)
    assert (row.tool_use_id, row.status, row.result) == (
        "toolu_e2e", "success", {"added": True, "cartTotal": 299.98})
    roles = [m.role async for m in
             ConversationMessage.objects.filter(session_id=client.session_id).order_by("seq")]
    assert roles == ["user", "assistant", "user", "assistant"]


async def test_an_overloaded_upstream_gives_the_error_event_then_the_done_frame(server, fake, api_key):
    fake.enqueue(error_response(529, retry_after_ms=10), text_response("Back again."))

    client = await open_client(server, api_key)
    try:
        failed = await client.say("hello", timeout=20)
        # The connection stays usable: the next turn gets an answer.
        again = await client.say("hello again", timeout=20)
    finally:
        await client.close()

    error, done = failed[-2:]
    assert error["type"] == "SYSTEM_EVENT" and error["payload"]["kind"] == "error"
    assert error["payload"]["data"]["code"] == "overloaded"
    assert done["payload"] == {"chunk": "", "done": True}
    assert final_text(again) == "Back again."
    assert len(fake.requests) == 2


async def test_a_process_stopped_after_streamed_turns_exits_cleanly_with_nothing_left_unclosed(
        server, fake, api_key):
    fake.enqueue(text_response("First answer.", chunks=3), text_response("Second answer.", chunks=3))
    client = await open_client(server, api_key)
    try:
        assert final_text(await client.say("one", timeout=20)) == "First answer."
        assert final_text(await client.say("two", timeout=20)) == "Second answer."
    finally:
        await client.close()

    exit_code = server.stop()

    assert exit_code == 0, server.logs()
    logs = server.logs()
    assert "Unclosed" not in logs and "Traceback" not in logs, logs
