"""The agent turn, end to end inside one process: a page on a WebsocketCommunicator,
the real consumer and Agent, the real Anthropic SDK, and a fake Messages API
server scripted per test (tests/support/fake_anthropic.py).

Each test checks up to three things: what the model received (``fake.requests``),
what the page received (every frame passes the deployed client's check), and
what was stored (ConversationMessage, ToolCall, usage rows).
"""
from __future__ import annotations

import asyncio
import json

import pytest
from django.utils import timezone

from agent.store import AgentStore
from aitp.models import ConversationMessage, DailyUsage, Session, ToolCall
from llm import reset_backend
from llm.anthropic_backend import close_client
from runtime import model_access
from tests.aitp.conftest import ADD_TO_CART, Page
from tests.support.fake_anthropic import (
    FakeAnthropicServer,
    StreamedMessage,
    broken_stream,
    error_response,
    in_stream_error,
    text_response,
    tool_use_response,
)

pytestmark = [pytest.mark.django_db(transaction=True)]

API_KEY = "sk-ant-agent-tests"
EPHEMERAL = {"type": "ephemeral"}

GO_TO_CART = {"name": "go_to_cart", "description": "Open the cart page"}
CHECKOUT = {"name": "checkout", "description": "Start the checkout", "risk": "high"}
PAY = {
    "name": "pay",
    "description": "Pay with the saved card",
    "parameters": {"type": "OBJECT", "properties": {"amount": {"type": "NUMBER"}},
                   "required": ["amount"]},
    "risk": "critical",
}
SHOP_TOOLS = (ADD_TO_CART, GO_TO_CART, PAY)


# --- fixtures and helpers ----------------------------------------------------------


def nothing_scripted(body: dict):
    # A request the test did not plan for fails loudly instead of getting a
    # plausible answer.
    return error_response(400, message="no scripted response left")


@pytest.fixture
def fake():
    with FakeAnthropicServer(api_key=API_KEY, responder=nothing_scripted) as server:
        yield server


@pytest.fixture
async def llm(fake, settings):
    """The consumer's agent talks to the fake API through the real SDK."""
    settings.OWLLAYER_LLM = "anthropic"
    settings.ANTHROPIC_API_KEY = API_KEY
    settings.ANTHROPIC_BASE_URL = fake.base_url
    settings.OWLLAYER_MODEL = "claude-test-model"
    settings.OWLLAYER_LLM_MAX_RETRIES = 0
    settings.OWLLAYER_LLM_TIMEOUT = 5.0
    settings.OWLLAYER_TOOL_TIMEOUT = 5.0
    settings.OWLLAYER_APPROVAL_TIMEOUT = 5.0
    settings.OWLLAYER_STREAM_INTERVAL = 0.005
    reset_backend()
    yield fake
    await close_client()
    reset_backend()


async def open_shop(connect, api_key, tools=SHOP_TOOLS, url="/products/headphones",
                    title="Pro Headphones", context=None) -> Page:
    """A page that shook hands and declared its tools; ``page.session_id`` is set."""
    page = await connect()
    ack = await page.handshake(api_key.raw)
    assert ack["type"] == "HANDSHAKE_ACK", ack
    page.session_id = ack["payload"]["sessionId"]
    page.frames = []
    effective = await page.context(url=url, title=title, tools=list(tools),
                                   context=context or {"productId": "pro-headphones"})
    assert effective["payload"]["kind"] == "tools_effective", effective
    return page


async def turn(page: Page, text: str, on_tool_call=None, timeout: float = 10) -> list[dict]:
    """Send USER_INPUT and return every frame up to the done:true AGENT_RESPONSE.

    ``on_tool_call(page, frame)`` (async) answers each TOOL_CALL as it arrives.
    """
    await page.send("USER_INPUT", {"modality": "text", "content": text})
    return await until_done(page, on_tool_call, timeout)


async def until_done(page: Page, on_tool_call=None, timeout: float = 10) -> list[dict]:
    frames = []
    while True:
        frame = await page.recv(timeout)
        assert frame["type"] != "__close__", frames
        frames.append(frame)
        if frame["type"] == "TOOL_CALL" and on_tool_call is not None:
            await on_tool_call(page, frame)
        if frame["type"] == "AGENT_RESPONSE" and frame["payload"]["done"]:
            return frames


def answer_with(result=None, *, error: str | None = None):
    """An on_tool_call that answers every call the same way, as the browser does."""
    async def answer(page: Page, frame: dict) -> None:
        call_id = frame["payload"]["callId"]
        if error is None:
            payload = {"callId": call_id, "status": "success", "result": result}
        else:
            payload = {"callId": call_id, "status": "error", "result": None, "error": error}
        await page.send("TOOL_RESULT", payload)
    return answer


def of_type(frames: list[dict], type_: str) -> list[dict]:
    return [f for f in frames if f["type"] == type_]


def errors(frames: list[dict]) -> list[dict]:
    return [f["payload"] for f in frames
            if f["type"] == "SYSTEM_EVENT" and f["payload"]["kind"] == "error"]


def streamed(frames: list[dict]) -> tuple[str, str]:
    """(the done:false deltas joined, the done:true text); exactly one done:true, last."""
    responses = of_type(frames, "AGENT_RESPONSE")
    finals = [f for f in responses if f["payload"]["done"]]
    assert len(finals) == 1 and frames[-1] is finals[0], frames
    deltas = "".join(f["payload"]["chunk"] for f in responses if not f["payload"]["done"])
    return deltas, finals[0]["payload"]["chunk"]


def assert_failed_turn(frames: list[dict], code: str) -> None:
    """An upstream failure: an error event with data.code, then an empty done frame."""
    assert frames[-1]["payload"] == {"chunk": "", "done": True}, frames
    assert frames[-2]["type"] == "SYSTEM_EVENT", frames
    assert frames[-2]["payload"]["kind"] == "error"
    assert frames[-2]["payload"]["data"]["code"] == code
    assert frames[-2]["payload"]["message"]


def without_cache_control(block: dict) -> dict:
    return {k: v for k, v in block.items() if k != "cache_control"}


def blocks(message: dict) -> list[dict]:
    return [without_cache_control(b) for b in message["content"]]


def tool_results(message: dict) -> list[dict]:
    return [without_cache_control(b) for b in message["content"] if b["type"] == "tool_result"]


def assert_well_formed(body: dict) -> None:
    """The rules the Messages API enforces on a request (it answers 400 otherwise)."""
    messages = body["messages"]
    assert messages and messages[0]["role"] == "user" and messages[-1]["role"] == "user"
    uses_tools = False
    for index, message in enumerate(messages):
        assert message["role"] == ("user" if index % 2 == 0 else "assistant"), messages
        assert message["content"], f"message {index} is empty"
        for block in message["content"]:
            if block["type"] == "text":
                assert block["text"], f"message {index} has an empty text block"
            if block["type"] in ("tool_use", "tool_result"):
                uses_tools = True
        used = [b["id"] for b in message["content"] if b["type"] == "tool_use"]
        answered_here = [b for b in message["content"] if b["type"] == "tool_result"]
        if message["role"] == "assistant":
            assert not answered_here
            if used:
                following = messages[index + 1]["content"]
                # All results first, in one message, one per tool_use.
                leading = [b["tool_use_id"] for b in following[:len(used)]
                           if b["type"] == "tool_result"]
                assert leading == used, (used, following)
                later = [b for b in following[len(used):] if b["type"] == "tool_result"]
                assert not later, following
        elif index > 0:
            previous = [b["id"] for b in messages[index - 1]["content"] if b["type"] == "tool_use"]
            assert [b["tool_use_id"] for b in answered_here] == previous[:len(answered_here)]
            assert len(answered_here) == len(previous)
        else:
            assert not answered_here
    if uses_tools:
        assert body.get("tools"), "tool_use or tool_result blocks need tools defined"
    if body.get("tool_choice") is not None:
        assert body.get("tools"), "tool_choice needs tools"
    breakpoints = sum(1 for b in body.get("system", []) if "cache_control" in b)
    breakpoints += sum(1 for t in body.get("tools", []) if "cache_control" in t)
    breakpoints += sum(1 for m in messages for b in m["content"] if "cache_control" in b)
    assert breakpoints <= 4


async def stored_messages(session_id: str) -> list[ConversationMessage]:
    return [m async for m in ConversationMessage.objects.filter(session_id=session_id).order_by("seq")]


async def stored_calls(session_id: str) -> list[ToolCall]:
    return [c async for c in ToolCall.objects.filter(session_id=session_id).order_by("created_at", "id")]


async def stored_call_once_sent(session_id: str, patience: float = 30.0) -> ToolCall:
    """The session's one call, once its sent mark (written behind the
    TOOL_CALL frame) has landed; the bound only stops a hang."""
    async with asyncio.timeout(patience):
        while True:
            (row,) = await stored_calls(session_id)
            if row.sent_at is not None:
                return row
            await asyncio.sleep(0.05)


def assert_stored_conversation_valid(messages: list[ConversationMessage]) -> None:
    """Every stored tool_use has exactly one tool_result, in the next stored message."""
    for index, message in enumerate(messages):
        used = [b["id"] for b in message.content if b["type"] == "tool_use"]
        if not used:
            continue
        assert index + 1 < len(messages), "the last stored message has unanswered tool_uses"
        following = messages[index + 1]
        assert following.role == "user"
        answered = [b["tool_use_id"] for b in following.content if b["type"] == "tool_result"]
        assert answered == used
    all_results = [b["tool_use_id"] for m in messages for b in m.content if b["type"] == "tool_result"]
    assert len(all_results) == len(set(all_results))


async def close(page: Page) -> None:
    await page.ws.disconnect(timeout=10)


# --- text --------------------------------------------------------------------------


async def test_a_watch_feed_that_fails_is_logged_and_the_page_is_answered_all_the_same(
    llm, connect, api_key, monkeypatch, caplog
):
    from aitp.watch_feed import WatcherFeed

    def broken(self, *args):
        raise RuntimeError("the watchers' feed broke")

    monkeypatch.setattr(WatcherFeed, "inbound", broken)
    monkeypatch.setattr(WatcherFeed, "outbound", broken)
    llm.enqueue(text_response("Still here."))
    page = await open_shop(connect, api_key)

    with caplog.at_level("ERROR", logger="connection"):
        frames = await turn(page, "are you there?")

    assert errors(frames) == []
    assert streamed(frames)[1] == "Still here."
    shown = [r for r in caplog.records if "the watchers could not be shown a frame" in r.getMessage()]
    assert shown and all(r.getMessage() == f"session {page.session_id}: the watchers could not be shown a frame"
                         for r in shown)
    await close(page)


async def test_a_text_answer_streams_deltas_that_add_up_to_the_complete_text(llm, connect, api_key):
    answer = "Hello! The Pro Headphones are in stock and ship tomorrow."
    llm.enqueue(text_response(answer, chunks=6))
    page = await open_shop(connect, api_key)

    frames = await turn(page, "Are these in stock?")

    deltas, final = streamed(frames)
    assert deltas == final == answer
    assert len(of_type(frames, "AGENT_RESPONSE")) >= 2
    messages = await stored_messages(page.session_id)
    assert [(m.role, m.turn) for m in messages] == [("user", 1), ("assistant", 1)]
    assert messages[0].content[0] == {"type": "text", "text": "Are these in stock?"}
    assert messages[1].content == [{"type": "text", "text": answer}]
    await close(page)


async def test_the_model_gets_the_user_text_then_the_page_description(llm, connect, api_key, settings):
    llm.enqueue(text_response("Yes."))
    page = await open_shop(connect, api_key, context={"productId": "pro-headphones", "price": 149.99})

    await turn(page, "Is it cheap?")

    (request,) = llm.requests
    assert request["model"] == settings.OWLLAYER_MODEL
    assert request["stream"] is True
    assert request["max_tokens"] == settings.OWLLAYER_MAX_TOKENS
    assert "tool_choice" not in request
    assert_well_formed(request)
    (message,) = request["messages"]
    text, page_block = blocks(message)
    assert text == {"type": "text", "text": "Is it cheap?"}
    assert page_block["text"].startswith("[page]\nurl: /products/headphones\ntitle: Pro Headphones")
    assert '"price": 149.99' in page_block["text"]
    # The conversation's cache breakpoint sits on the last block.
    assert message["content"][-1]["cache_control"] == EPHEMERAL
    await close(page)


async def test_system_and_last_tool_carry_cache_control_and_tools_come_in_canonical_order(
    llm, connect, api_key, tenant
):
    llm.enqueue(text_response("Hi."))
    declared = [dict(GO_TO_CART, name=name) for name in ("zeta", "alpha", "mid")] + [ADD_TO_CART]
    page = await open_shop(connect, api_key, tools=declared)

    await turn(page, "hello")

    (request,) = llm.requests
    assert [t["name"] for t in request["tools"]] == ["add_to_cart", "alpha", "mid", "zeta"]
    assert [("cache_control" in t) for t in request["tools"]] == [False, False, False, True]
    assert request["tools"][-1]["cache_control"] == EPHEMERAL
    add = request["tools"][0]
    assert add["input_schema"] == {
        "type": "object",
        "properties": {"quantity": {"type": "number", "description": "How many"}},
        "required": ["quantity"],
    }
    system = request["system"]
    assert system[-1]["cache_control"] == EPHEMERAL
    assert system[0]["text"].startswith(tenant.system_prompt)
    await close(page)


async def test_the_same_page_gives_byte_identical_tools_on_every_request(llm, connect, api_key):
    llm.enqueue(tool_use_response([("go_to_cart", {})]), text_response("Here is your cart."))
    page = await open_shop(connect, api_key)

    await turn(page, "show me the cart", answer_with({"ok": True}))

    first, second = llm.requests
    assert json.dumps(first["tools"]) == json.dumps(second["tools"])
    assert first["system"] == second["system"]
    await close(page)


# --- one tool, several tools ---------------------------------------------------------


async def test_one_tool_call_round_trips_and_its_result_reaches_the_model(llm, connect, api_key):
    llm.enqueue(
        tool_use_response([("toolu_add_1", "add_to_cart", {"quantity": 2})], text="Adding them now."),
        text_response("Two are in your cart."),
    )
    page = await open_shop(connect, api_key)

    frames = await turn(page, "Add 2 to my cart",
                                  answer_with({"added": True, "cartTotal": 299.98}))

    (call,) = of_type(frames, "TOOL_CALL")
    assert call["payload"]["name"] == "add_to_cart"
    assert call["payload"]["args"] == {"quantity": 2}
    deltas, final = streamed(frames)
    assert final == deltas == "Adding them now.\n\nTwo are in your cart."

    first, second = llm.requests
    assert_well_formed(second)
    assert blocks(second["messages"][1]) == [
        {"type": "text", "text": "Adding them now."},
        {"type": "tool_use", "id": "toolu_add_1", "name": "add_to_cart", "input": {"quantity": 2}},
    ]
    assert tool_results(second["messages"][2]) == [{
        "type": "tool_result", "tool_use_id": "toolu_add_1",
        "content": '{"added":true,"cartTotal":299.98}',
    }]

    (row,) = await stored_calls(page.session_id)
    assert row.call_id == call["payload"]["callId"]
    assert row.tool_use_id == "toolu_add_1"
    assert (row.status, row.result, row.risk, row.origin) == (
        "success", {"added": True, "cartTotal": 299.98}, "low", "client")
    assert row.sent_at is not None and row.finished_at is not None
    messages = await stored_messages(page.session_id)
    assert [m.role for m in messages] == ["user", "assistant", "user", "assistant"]
    assert_stored_conversation_valid(messages)
    await close(page)


async def test_several_tool_uses_in_one_message_get_all_results_in_one_user_message(
    llm, connect, api_key
):
    llm.enqueue(
        tool_use_response([
            ("toolu_a", "add_to_cart", {"quantity": 1}),
            ("toolu_b", "add_to_cart", {"quantity": 5}),
            ("toolu_c", "go_to_cart", {}),
        ]),
        text_response("One added, five were out of stock, and here is the cart."),
    )
    page = await open_shop(connect, api_key)
    answered: list[str] = []

    async def answer(page: Page, frame: dict) -> None:
        payload = frame["payload"]
        answered.append(payload["callId"])
        if payload["args"].get("quantity") == 5:
            await page.send("TOOL_RESULT", {"callId": payload["callId"], "status": "error",
                                            "result": None, "error": "Out of stock"})
        else:
            await page.send("TOOL_RESULT", {"callId": payload["callId"], "status": "success",
                                            "result": {"ok": True}})

    frames = await turn(page, "Add one, then five, then show the cart", answer)

    calls = of_type(frames, "TOOL_CALL")
    assert [c["payload"]["name"] for c in calls] == ["add_to_cart", "add_to_cart", "go_to_cart"]
    assert len(set(answered)) == 3
    _, second = llm.requests
    assert_well_formed(second)
    assert len(second["messages"]) == 3
    results = tool_results(second["messages"][2])
    assert [r["tool_use_id"] for r in results] == ["toolu_a", "toolu_b", "toolu_c"]
    assert [r.get("is_error", False) for r in results] == [False, True, False]
    assert results[1]["content"] == "Out of stock"
    rows = await stored_calls(page.session_id)
    assert [(r.tool_use_id, r.status) for r in rows] == [
        ("toolu_a", "success"), ("toolu_b", "error"), ("toolu_c", "success")]
    assert rows[1].error == "Out of stock"
    await close(page)


@pytest.mark.parametrize("ensure_ascii", [False, True], ids=["utf8", "escaped"])
async def test_tool_input_split_at_every_byte_arrives_intact(llm, connect, api_key, ensure_ascii):
    args = {"quantity": 1, "note": "café ☕ – 日本 🎧 \"quoted\" \\ back"}
    encoded = json.dumps(args, ensure_ascii=ensure_ascii).encode("utf-8")
    llm.enqueue(
        tool_use_response([("toolu_note", "add_to_cart", args)], ensure_ascii=ensure_ascii,
                          split_json_at=list(range(1, len(encoded)))),
        text_response("Noted."),
    )
    page = await open_shop(connect, api_key)

    frames = await turn(page, "add one with a note", answer_with(None))

    (call,) = of_type(frames, "TOOL_CALL")
    assert call["payload"]["args"] == args
    tool_use = llm.requests[1]["messages"][1]["content"][0]
    assert tool_use["input"] == args
    (row,) = await stored_calls(page.session_id)
    assert row.arguments == args
    await close(page)


async def test_the_page_may_send_its_next_message_as_soon_as_it_reads_done(llm, connect, api_key):
    llm.enqueue(text_response("First."), text_response("Second."))
    page = await open_shop(connect, api_key)
    await turn(page, "one")

    await page.send("USER_INPUT", {"modality": "text", "content": "two"})
    frame = await page.recv()

    assert frame["type"] == "AGENT_RESPONSE", frame
    assert streamed([frame, *await until_done(page)])[1] == "Second."
    await close(page)


async def test_an_empty_answer_is_not_stored_so_the_next_request_stays_valid(
    llm, connect, api_key
):
    llm.enqueue(tool_use_response([("toolu_go", "go_to_cart", {})]),
                StreamedMessage(blocks=[]),
                text_response("Here is the cart."))
    page = await open_shop(connect, api_key)
    first = await turn(page, "go to the cart", answer_with({"ok": True}))
    assert streamed(first) == ("", "")

    second = await turn(page, "well?")

    assert streamed(second)[1] == "Here is the cart."
    assert_well_formed(llm.requests[2])
    assert all(m.content for m in await stored_messages(page.session_id))
    await close(page)


# --- upstream failures -----------------------------------------------------------------

FAILURES = [(429, "rate_limited"), (529, "overloaded"), (500, "upstream_error")]


@pytest.mark.parametrize("status, code", FAILURES, ids=[str(s) for s, _ in FAILURES])
async def test_a_failure_with_retry_after_is_retried_and_the_page_sees_only_the_answer(
    llm, connect, api_key, settings, status, code
):
    settings.OWLLAYER_LLM_MAX_RETRIES = 1
    llm.enqueue(error_response(status, retry_after_ms=10), text_response("Back with you."))
    page = await open_shop(connect, api_key)

    frames = await turn(page, "hello?")

    assert errors(frames) == []
    assert streamed(frames)[1] == "Back with you."
    assert llm.wait_for(lambda requests: requests[0].outcome == "error")
    first, second = llm.requests
    assert dict(first) == dict(second)
    await close(page)


@pytest.mark.parametrize("status, code", FAILURES, ids=[str(s) for s, _ in FAILURES])
async def test_a_failure_past_the_retries_gives_an_error_event_then_an_empty_done(
    llm, connect, api_key, settings, status, code
):
    settings.OWLLAYER_LLM_MAX_RETRIES = 1
    llm.enqueue(error_response(status, retry_after=0.01), error_response(status, retry_after=0.01))
    page = await open_shop(connect, api_key)

    frames = await turn(page, "hello?")

    assert len(llm.requests) == 2
    assert_failed_turn(frames, code)
    assert len(frames) == 2
    messages = await stored_messages(page.session_id)
    assert [m.role for m in messages] == ["user"]
    await close(page)


async def test_a_turn_whose_key_the_model_refuses_records_its_code_and_raises_the_admins_banner(
    llm, connect, api_key
):
    llm.enqueue(error_response(401), text_response("Back again."))
    page = await open_shop(connect, api_key)

    frames = await turn(page, "hello?")

    assert_failed_turn(frames, "auth_failed")
    (message,) = await stored_messages(page.session_id)
    # The question, and why it got no answer; the model's copy has no such block.
    assert message.role == "user"
    assert {"type": "text", "text": "hello?"} in message.content
    assert message.content[-1] == {"type": "turn_error", "code": "auth_failed",
                                   "message": frames[-2]["payload"]["message"]}
    assert model_access.current().state == model_access.REFUSED

    await turn(page, "and now?")

    assert all(block["type"] != "turn_error" for block in blocks(llm.requests[1]["messages"][0]))
    assert model_access.current().state == model_access.ACCEPTED
    await close(page)


async def test_a_failed_turn_after_a_tool_round_records_its_code_with_the_tool_results(
    llm, connect, api_key
):
    llm.enqueue(tool_use_response([("toolu_1", "add_to_cart", {"quantity": 1})]), error_response(529))
    page = await open_shop(connect, api_key)

    assert_failed_turn(await turn(page, "add one", answer_with({"added": True})), "overloaded")

    messages = await stored_messages(page.session_id)
    assert [m.role for m in messages] == ["user", "assistant", "user"]
    assert messages[-1].content[0]["type"] == "tool_result"
    assert messages[-1].content[-1]["type"] == "turn_error"
    assert messages[-1].content[-1]["code"] == "overloaded"
    assert_stored_conversation_valid(messages)
    # Not a matter of the key: what the admin's banner reads stays as it was.
    assert model_access.current().state == model_access.UNKNOWN
    await close(page)


@pytest.mark.parametrize(
    "response, code",
    [
        (broken_stream(6, response=text_response("one two three four five six", chunks=6)),
         "stream_interrupted"),
        (broken_stream(6, response=text_response("one two three four five six", chunks=6),
                       abrupt=False), "stream_interrupted"),
        (in_stream_error("overloaded_error", after_events=5,
                         response=text_response("one two three four five six", chunks=6)),
         "overloaded"),
    ],
    ids=["connection-dropped", "body-ended", "error-event"],
)
async def test_a_stream_that_stops_half_way_ends_with_an_error_event_and_an_empty_done(
    llm, connect, api_key, settings, response, code
):
    settings.OWLLAYER_LLM_MAX_RETRIES = 2  # once text flowed nothing is retried
    llm.enqueue(response)
    page = await open_shop(connect, api_key)

    frames = await turn(page, "count to six")

    assert_failed_turn(frames, code)
    deltas = "".join(f["payload"]["chunk"] for f in of_type(frames, "AGENT_RESPONSE")
                     if not f["payload"]["done"])
    assert "one two three four five six".startswith(deltas)
    assert len(llm.requests) == 1
    assert [m.role for m in await stored_messages(page.session_id)] == ["user"]
    await close(page)


async def test_a_slow_first_token_still_gives_the_whole_answer(llm, connect, api_key):
    llm.enqueue(text_response("Sorry for the wait, here it is.", first_event_delay=0.5))
    page = await open_shop(connect, api_key)

    frames = await turn(page, "hello")

    assert errors(frames) == []
    deltas, final = streamed(frames)
    assert deltas == final == "Sorry for the wait, here it is."
    await close(page)


async def test_a_first_token_slower_than_the_llm_timeout_ends_the_turn_with_a_timeout(
    llm, connect, api_key, settings
):
    settings.OWLLAYER_LLM_TIMEOUT = 0.3
    llm.enqueue(text_response("Too late.", first_event_delay=3))
    page = await open_shop(connect, api_key)

    frames = await turn(page, "hello")

    assert_failed_turn(frames, "timeout")
    await close(page)


async def test_the_conversation_stays_valid_for_the_next_turn_after_an_upstream_failure(
    llm, connect, api_key
):
    llm.enqueue(
        tool_use_response([("toolu_first", "add_to_cart", {"quantity": 1})], text="On it."),
        error_response(529),
        text_response("All good now."),
    )
    page = await open_shop(connect, api_key)

    failed = await turn(page, "add one", answer_with({"added": True}))
    assert_failed_turn(failed, "overloaded")
    frames = await turn(page, "did it work?")

    assert streamed(frames)[1] == "All good now."
    third = llm.requests[2]
    assert_well_formed(third)
    roles = [m["role"] for m in third["messages"]]
    assert roles == ["user", "assistant", "user"]
    last = blocks(third["messages"][-1])
    assert last[0]["type"] == "tool_result" and last[0]["tool_use_id"] == "toolu_first"
    assert {"type": "text", "text": "did it work?"} in last
    assert_stored_conversation_valid(await stored_messages(page.session_id))
    await close(page)


# --- tool paths -----------------------------------------------------------------------


async def test_a_page_error_reaches_the_model_as_is_error(llm, connect, api_key):
    llm.enqueue(tool_use_response([("toolu_e", "add_to_cart", {"quantity": 1})]),
                text_response("It is out of stock."))
    page = await open_shop(connect, api_key)

    await turn(page, "add one", answer_with(error="Out of stock"))

    (result,) = tool_results(llm.requests[1]["messages"][-1])
    assert result == {"type": "tool_result", "tool_use_id": "toolu_e",
                      "content": "Out of stock", "is_error": True}
    (row,) = await stored_calls(page.session_id)
    assert (row.status, row.error) == ("error", "Out of stock")
    await close(page)


async def test_a_tool_that_does_not_answer_in_time_times_out(llm, connect, api_key, settings):
    settings.OWLLAYER_TOOL_TIMEOUT = 0.2
    llm.enqueue(tool_use_response([("toolu_slow", "add_to_cart", {"quantity": 1})]),
                text_response("The page did not answer."))
    page = await open_shop(connect, api_key)

    frames = await turn(page, "add one")

    (call,) = of_type(frames, "TOOL_CALL")
    call_id = call["payload"]["callId"]
    (timeout_error,) = errors(frames)
    assert timeout_error["data"] == {"code": "tool_timeout", "callId": call_id}
    (result,) = tool_results(llm.requests[1]["messages"][-1])
    assert result["is_error"] is True and result["tool_use_id"] == "toolu_slow"
    (row,) = await stored_calls(page.session_id)
    assert row.status == "timeout"

    # The answer that comes too late is refused and changes nothing.
    await page.send("TOOL_RESULT", {"callId": call_id, "status": "success", "result": 1})
    late = await page.recv()
    assert late["payload"]["data"] == {"code": "unknown_call", "callId": call_id}
    await row.arefresh_from_db()
    assert row.status == "timeout"
    await close(page)


async def test_invalid_arguments_never_reach_the_page_and_the_model_is_told_why(
    llm, connect, api_key
):
    llm.enqueue(tool_use_response([("toolu_bad", "add_to_cart", {"quantity": "two"})]),
                text_response("Let me fix that."))
    page = await open_shop(connect, api_key)

    frames = await turn(page, "add two")

    assert of_type(frames, "TOOL_CALL") == []
    (result,) = tool_results(llm.requests[1]["messages"][-1])
    assert result["is_error"] is True
    assert "quantity" in result["content"]
    (row,) = await stored_calls(page.session_id)
    assert row.status == "invalid_args"
    assert row.sent_at is None
    await close(page)


async def test_a_tool_unknown_to_the_page_is_unavailable(llm, connect, api_key):
    llm.enqueue(tool_use_response([("toolu_ghost", "delete_account", {})]),
                text_response("I cannot do that here."))
    page = await open_shop(connect, api_key)

    frames = await turn(page, "delete my account")

    assert of_type(frames, "TOOL_CALL") == []
    (result,) = tool_results(llm.requests[1]["messages"][-1])
    assert result["is_error"] is True
    (row,) = await stored_calls(page.session_id)
    assert row.status == "unavailable"
    await close(page)


async def test_a_tool_removed_by_a_navigation_is_not_called_on_the_new_page(llm, connect, api_key):
    llm.enqueue(
        tool_use_response([("toolu_nav", "go_to_cart", {}),
                           ("toolu_add", "add_to_cart", {"quantity": 1})]),
        text_response("You are on the cart page now."),
    )
    page = await open_shop(connect, api_key)

    async def navigate(page: Page, frame: dict) -> None:
        # The page flushes its new context before the result (protocol.md §4).
        await page.send("CONTEXT_UPDATE", {"url": "/cart", "title": "Cart",
                                           "activeTools": [CHECKOUT], "context": {"items": 1}})
        await page.send("TOOL_RESULT", {"callId": frame["payload"]["callId"],
                                        "status": "success", "result": {"url": "/cart"}})

    frames = await turn(page, "go to the cart and add one", navigate)

    assert [c["payload"]["name"] for c in of_type(frames, "TOOL_CALL")] == ["go_to_cart"]
    second = llm.requests[1]
    assert_well_formed(second)
    last = blocks(second["messages"][-1])
    assert [b.get("tool_use_id") for b in last[:2]] == ["toolu_nav", "toolu_add"]
    assert "is_error" not in last[0] and last[1]["is_error"] is True
    assert last[2]["type"] == "text" and last[2]["text"].startswith("[page]\nurl: /cart")
    assert [t["name"] for t in second["tools"]] == ["checkout"]
    rows = await stored_calls(page.session_id)
    assert [r.status for r in rows] == ["success", "unavailable"]
    await close(page)


async def test_a_navigation_to_a_page_without_tools_keeps_the_next_request_valid(
    llm, connect, api_key
):
    llm.enqueue(tool_use_response([("toolu_nav", "go_to_cart", {})]),
                text_response("Here is the cart."))
    page = await open_shop(connect, api_key)

    async def navigate(page: Page, frame: dict) -> None:
        await page.send("CONTEXT_UPDATE", {"url": "/cart", "title": "Cart", "activeTools": [],
                                           "context": {}})
        await page.send("TOOL_RESULT", {"callId": frame["payload"]["callId"],
                                        "status": "success", "result": None})

    frames = await turn(page, "show me the cart", navigate)

    assert errors(frames) == []
    # The history holds a tool_use and its result: the API refuses that
    # request unless tools are defined, even when the page offers none now.
    second = llm.requests[1]
    assert_well_formed(second)
    assert second["tool_choice"] == {"type": "none"}, "no tool of the old page may be called"
    await close(page)


async def test_unknown_and_duplicate_tool_results_get_unknown_call_and_change_nothing(
    llm, connect, api_key
):
    llm.enqueue(tool_use_response([("toolu_once", "add_to_cart", {"quantity": 1})]),
                text_response("Added."))
    page = await open_shop(connect, api_key)
    await page.send("USER_INPUT", {"modality": "text", "content": "add one"})
    call = await page.recv_until("TOOL_CALL")
    call_id = call["payload"]["callId"]

    await page.send("TOOL_RESULT", {"callId": "tc_not_a_real_call", "status": "success",
                                    "result": {"added": True}})
    unknown = await page.recv()
    assert unknown["payload"]["data"] == {"code": "unknown_call", "callId": "tc_not_a_real_call"}
    # The sent mark is written behind the TOOL_CALL frame: once it is there,
    # the unknown answer must not have moved the row on.
    row = await stored_call_once_sent(page.session_id)
    assert row.status == "sent"  # still waiting for the real answer

    await page.send("TOOL_RESULT", {"callId": call_id, "status": "success", "result": {"n": 1}})
    await page.send("TOOL_RESULT", {"callId": call_id, "status": "error", "result": None,
                                    "error": "changed my mind"})
    frames = await until_done(page)

    (duplicate,) = errors(frames)
    assert duplicate["data"] == {"code": "unknown_call", "callId": call_id}
    (result,) = tool_results(llm.requests[1]["messages"][-1])
    assert result == {"type": "tool_result", "tool_use_id": "toolu_once", "content": '{"n":1}'}
    await row.arefresh_from_db()
    assert (row.status, row.result) == ("success", {"n": 1})
    await close(page)


async def test_the_model_gets_tool_choice_none_after_the_tool_round_limit(
    llm, connect, api_key, settings
):
    settings.OWLLAYER_MAX_TOOL_ROUNDS = 2
    llm.enqueue(
        tool_use_response([("toolu_r1", "go_to_cart", {})]),
        tool_use_response([("toolu_r2", "go_to_cart", {})]),
        text_response("Enough tools."),
    )
    page = await open_shop(connect, api_key)

    frames = await turn(page, "keep going", answer_with({"ok": True}))

    assert len(of_type(frames, "TOOL_CALL")) == 2
    requests = llm.requests
    assert [r.get("tool_choice") for r in requests] == [None, None, {"type": "none"}]
    assert requests[2]["tools"], "tools stay declared so the history's tool_use blocks are valid"
    for request in requests:
        assert_well_formed(request)
    await close(page)


async def test_a_tool_use_past_the_round_limit_is_never_sent_to_the_page(
    llm, connect, api_key, settings
):
    settings.OWLLAYER_MAX_TOOL_ROUNDS = 1
    llm.enqueue(
        tool_use_response([("toolu_r1", "go_to_cart", {})]),
        tool_use_response([("toolu_r2", "go_to_cart", {})]),  # ignores tool_choice none
        text_response("Never asked for."),
    )
    page = await open_shop(connect, api_key)

    frames = await turn(page, "keep going", answer_with({"ok": True}))

    assert len(of_type(frames, "TOOL_CALL")) == 1
    assert len(llm.requests) == 2
    rows = await stored_calls(page.session_id)
    assert [(r.tool_use_id, r.status) for r in rows] == [("toolu_r1", "success"),
                                                         ("toolu_r2", "cancelled")]
    assert_stored_conversation_valid(await stored_messages(page.session_id))
    await close(page)


# --- usage ---------------------------------------------------------------------------------


async def test_usage_of_every_request_is_summed_on_the_session_and_the_day(
    llm, connect, api_key, tenant
):
    usage_1 = {"input_tokens": 100, "output_tokens": 20, "cache_read_input_tokens": 30,
               "cache_creation_input_tokens": 7}
    usage_2 = {"input_tokens": 150, "output_tokens": 40, "cache_read_input_tokens": 90,
               "cache_creation_input_tokens": 0}
    llm.enqueue(tool_use_response([("go_to_cart", {})], usage=usage_1),
                text_response("Done.", usage=usage_2))
    page = await open_shop(connect, api_key)

    await turn(page, "go", answer_with(None))

    # Recorded by the time the page reads the done frame (the turn's state
    # is written behind, on its own schedule: not part of this promise).
    session = await Session.objects.aget(id=page.session_id)
    assert session.turns == 1
    assert (session.input_tokens, session.output_tokens) == (250, 60)
    assert (session.cache_read_tokens, session.cache_write_tokens) == (120, 7)
    day = await DailyUsage.objects.aget(tenant=tenant, date=timezone.localdate())
    assert (day.turns, day.input_tokens, day.output_tokens) == (1, 250, 60)
    assert (day.cache_read_tokens, day.cache_write_tokens) == (120, 7)
    await close(page)


# --- disconnects -----------------------------------------------------------------------------


def leftover_tasks() -> list[asyncio.Task]:
    return [t for t in asyncio.all_tasks() if t is not asyncio.current_task() and not t.done()]


async def test_a_disconnect_mid_turn_ends_every_pending_call_as_disconnected(llm, connect, api_key):
    llm.enqueue(tool_use_response([("toolu_1", "add_to_cart", {"quantity": 1}),
                                   ("toolu_2", "go_to_cart", {})]))
    page = await open_shop(connect, api_key)
    await page.send("USER_INPUT", {"modality": "text", "content": "add one and go"})
    await page.recv_until("TOOL_CALL")

    await close(page)

    assert leftover_tasks() == []
    rows = await stored_calls(page.session_id)
    assert [(r.tool_use_id, r.status) for r in rows] == [("toolu_1", "disconnected"),
                                                         ("toolu_2", "disconnected")]
    messages = await stored_messages(page.session_id)
    assert_stored_conversation_valid(messages)
    results = tool_results({"content": messages[-1].content})
    assert [r["is_error"] for r in results] == [True, True]
    assert len(llm.requests) == 1, "nobody is left to answer: the model is not asked again"
    session = await Session.objects.aget(id=page.session_id)
    assert session.ended_at is not None


async def test_a_disconnect_while_the_answer_streams_leaves_no_task_behind(llm, connect, api_key):
    llm.enqueue(text_response("a slow answer " * 10, chunks=20, event_delay=0.05))
    page = await open_shop(connect, api_key)
    await page.send("USER_INPUT", {"modality": "text", "content": "talk slowly"})
    await page.recv_until("AGENT_RESPONSE", done=False)

    await close(page)

    assert leftover_tasks() == []
    messages = await stored_messages(page.session_id)
    assert [m.role for m in messages] == ["user", "assistant"]
    # The answer as far as it was streamed to the page before it left.
    [block] = messages[1].content
    assert block["text"] and ("a slow answer " * 10).startswith(block["text"])


async def test_a_disconnect_while_the_tool_use_message_is_stored_still_answers_it(
    llm, connect, api_key, monkeypatch
):
    """The cancel can land on any await, including the write of the assistant
    message itself: its tool_uses must still get their results."""
    llm.enqueue(tool_use_response([("toolu_held", "add_to_cart", {"quantity": 1})]))
    stored = asyncio.Event()
    original = AgentStore.checkpoint

    async def slow_checkpoint(self, **kwargs):
        await original(self, **kwargs)
        carries_tool_use = any(
            b.get("type") == "tool_use" for m in kwargs["messages"] for b in m["content"])
        if carries_tool_use and not stored.is_set():
            stored.set()
            await asyncio.Event().wait()  # the write is done, the await not yet

    monkeypatch.setattr(AgentStore, "checkpoint", slow_checkpoint)
    page = await open_shop(connect, api_key)
    await page.send("USER_INPUT", {"modality": "text", "content": "add one"})
    await asyncio.wait_for(stored.wait(), 10)

    await close(page)

    assert leftover_tasks() == []
    messages = await stored_messages(page.session_id)
    assert_stored_conversation_valid(messages)
    rows = await stored_calls(page.session_id)
    assert [(r.tool_use_id, r.status) for r in rows] == [("toolu_held", "disconnected")]


# --- approvals ---------------------------------------------------------------------------------


def approval_request(call: dict, **overrides) -> dict:
    payload = call["payload"]
    return {"callId": payload["callId"], "toolName": payload["name"], "risk": "critical",
            "args": payload["args"], "message": "Pay 42 USD with the saved card?", **overrides}


# The page asks for approval as soon as the call arrives; the tool timeout
# leaves that round trip (a database write on PostgreSQL, on a loaded
# machine) a wide margin, and the waits below are multiples of it.
TOOL_TIMEOUT = 2.0


async def start_payment(llm, connect, api_key, settings,
                        approval_timeout: float = 10.0) -> tuple[Page, dict]:
    """A turn waiting on the page's critical ``pay`` call; the tool timeout is
    short, though far above the time the page takes to ask for approval."""
    settings.OWLLAYER_TOOL_TIMEOUT = TOOL_TIMEOUT
    settings.OWLLAYER_APPROVAL_TIMEOUT = approval_timeout
    llm.enqueue(tool_use_response([("toolu_pay", "pay", {"amount": 42})]),
                text_response("Payment handled."))
    page = await open_shop(connect, api_key)
    await page.send("USER_INPUT", {"modality": "text", "content": "pay for it"})
    call = await page.recv_until("TOOL_CALL")
    assert call["payload"]["name"] == "pay"
    return page, call


async def test_an_approval_request_keeps_the_call_alive_past_the_tool_timeout(
    llm, connect, api_key, settings
):
    page, call = await start_payment(llm, connect, api_key, settings)
    await page.send("APPROVAL_REQUEST", approval_request(call))

    # Two tool timeouts go by while the user decides: no timeout, no frame.
    assert await page.ws.receive_nothing(timeout=2 * TOOL_TIMEOUT)
    await page.send("APPROVAL_RESPONSE", {"callId": call["payload"]["callId"], "approved": True,
                                          "result": {"paid": True}})
    frames = await until_done(page)

    assert errors(frames) == []
    (result,) = tool_results(llm.requests[1]["messages"][-1])
    assert result == {"type": "tool_result", "tool_use_id": "toolu_pay", "content": '{"paid":true}'}
    (row,) = await stored_calls(page.session_id)
    assert (row.status, row.result) == ("success", {"paid": True})
    await close(page)


@pytest.mark.parametrize("how", ["approval_request", "pending_approval"])
async def test_a_refusal_is_never_a_success_even_with_a_result(
    llm, connect, api_key, settings, how
):
    page, call = await start_payment(llm, connect, api_key, settings)
    call_id = call["payload"]["callId"]
    if how == "approval_request":
        await page.send("APPROVAL_REQUEST", approval_request(call))
    else:
        await page.send("TOOL_RESULT", {"callId": call_id, "status": "pending_approval",
                                        "result": None})
    assert await page.ws.receive_nothing(timeout=TOOL_TIMEOUT)

    await page.send("APPROVAL_RESPONSE", {"callId": call_id, "approved": False,
                                          "error": "Action denied by user",
                                          "result": {"paid": True}})
    frames = await until_done(page)

    assert errors(frames) == []
    (result,) = tool_results(llm.requests[1]["messages"][-1])
    assert result["is_error"] is True
    assert "declined" in result["content"]
    (row,) = await stored_calls(page.session_id)
    assert row.status == "denied"
    assert row.result is None
    await close(page)


async def test_a_pending_approval_result_extends_the_deadline_like_an_approval_request(
    llm, connect, api_key, settings
):
    page, call = await start_payment(llm, connect, api_key, settings)
    call_id = call["payload"]["callId"]
    await page.send("TOOL_RESULT", {"callId": call_id, "status": "pending_approval", "result": None})

    assert await page.ws.receive_nothing(timeout=2 * TOOL_TIMEOUT)
    await page.send("APPROVAL_RESPONSE", {"callId": call_id, "approved": True,
                                          "result": {"paid": True}})
    frames = await until_done(page)

    assert errors(frames) == []
    (row,) = await stored_calls(page.session_id)
    assert row.status == "success"
    await close(page)


async def test_an_approval_nobody_decides_in_time_expires(llm, connect, api_key, settings):
    page, call = await start_payment(llm, connect, api_key, settings,
                                     approval_timeout=TOOL_TIMEOUT / 2)
    await page.send("APPROVAL_REQUEST", approval_request(call))
    frames = await until_done(page, timeout=20)

    (expired,) = errors(frames)
    assert expired["data"]["code"] == "approval_expired"
    (row,) = await stored_calls(page.session_id)
    assert row.status == "expired"
    await close(page)


# --- a decided page call's end is written with its audit event ------------------------------


@pytest.fixture
def written_behind(monkeypatch) -> list[str]:
    """The call ids whose final outcome the turn writes behind (the path of
    a call that has no approval)."""
    from aitp import store

    written: list[str] = []
    original = store.current().tool_call_finish

    def tool_call_finish(**outcome):
        written.append(outcome["call_id"])
        return original(**outcome)

    monkeypatch.setattr(store.current(), "tool_call_finish", tool_call_finish)
    return written


async def the_calls_end(session_id: str) -> tuple[tuple, tuple]:
    """(the call's row: status, result, error), (its approval's last event: action, data)."""
    from approvals.models import AuditEvent

    (row,) = await stored_calls(session_id)
    event = await AuditEvent.objects.filter(call_id=row.call_id).order_by("seq").alast()
    return (row.status, row.result, row.error), (event.action, event.data)


async def approval_opened(call: dict) -> None:
    """Once the page's APPROVAL_REQUEST is recorded (the consumer writes it
    before it reads the next frame, or a close)."""
    from approvals.models import Approval

    async with asyncio.timeout(30):
        while not await Approval.objects.filter(
                tool_call__call_id=call["payload"]["callId"]).aexists():
            await asyncio.sleep(0.05)


@pytest.mark.parametrize(("answer", "end"), [
    ({"approved": True, "result": {"paid": True}},
     (("success", {"paid": True}, ""), ("executed", {"call": "success"}))),
    ({"approved": True, "result": None, "error": "card declined"},
     (("error", None, "card declined"), ("failed", {"error": "card declined", "call": "error"}))),
], ids=["executed", "failed"])
async def test_an_approved_page_call_ends_with_its_executed_or_failed_event(
    llm, connect, api_key, settings, written_behind, answer, end
):
    page, call = await start_payment(llm, connect, api_key, settings)
    await page.send("APPROVAL_REQUEST", approval_request(call))
    await page.send("APPROVAL_RESPONSE", {"callId": call["payload"]["callId"], **answer})
    frames = await until_done(page)

    assert errors(frames) == []
    assert await the_calls_end(page.session_id) == end
    assert call["payload"]["callId"] not in written_behind
    await close(page)


async def test_an_expired_page_approval_ends_the_call_with_its_expired_event(
    llm, connect, api_key, settings, written_behind
):
    page, call = await start_payment(llm, connect, api_key, settings,
                                     approval_timeout=TOOL_TIMEOUT / 2)
    await page.send("APPROVAL_REQUEST", approval_request(call))
    await until_done(page, timeout=20)

    assert await the_calls_end(page.session_id) == (
        ("expired", None, "The user did not decide in time; the action was not approved."),
        ("expired", {"call": "expired"}))
    assert call["payload"]["callId"] not in written_behind
    await close(page)


async def waiting_for_its_user(llm, connect, api_key, settings) -> tuple[Page, dict]:
    """A turn whose critical ``pay`` call waits for its user's decision (recorded)."""
    page, call = await start_payment(llm, connect, api_key, settings)
    await page.send("APPROVAL_REQUEST", approval_request(call))
    await approval_opened(call)
    return page, call


async def test_a_page_that_leaves_while_its_user_decides_ends_the_call_with_its_event(
    llm, connect, api_key, settings, written_behind
):
    page, call = await waiting_for_its_user(llm, connect, api_key, settings)

    await close(page)

    assert await the_calls_end(page.session_id) == (
        ("disconnected", None, "The user left the page before the tool answered."),
        ("disconnected", {"call": "disconnected"}))
    assert call["payload"]["callId"] not in written_behind


async def test_a_barge_in_while_the_user_decides_ends_the_call_and_its_approval_as_cancelled(
    llm, connect, api_key, settings, written_behind
):
    page, call = await waiting_for_its_user(llm, connect, api_key, settings)

    await page.send("VOICE_INTERRUPT", {"reason": "barge_in"})
    await page.recv_until("VOICE_STATE_EVENT", event="interrupted")

    assert await the_calls_end(page.session_id) == (
        ("cancelled", None, "The turn was cancelled before the tool answered."),
        ("cancelled", {"call": "cancelled"}))
    assert call["payload"]["callId"] not in written_behind
    await close(page)


async def test_a_cut_call_whose_approval_cannot_be_closed_still_ends_and_the_log_names_it(
    llm, connect, api_key, settings, monkeypatch, caplog
):
    async def refused(self, call, status, outcome):
        raise RuntimeError("the database refused the approval's close")

    monkeypatch.setattr(AgentStore, "approval_close", refused)
    page, call = await waiting_for_its_user(llm, connect, api_key, settings)

    with caplog.at_level("ERROR", logger="agent"):
        await close(page)
        async with asyncio.timeout(30):
            # The page's socket is closed before its session's teardown ends.
            while (await stored_calls(page.session_id))[0].status not in ToolCall.FINAL_STATUSES:
                await asyncio.sleep(0.05)

    (row,) = await stored_calls(page.session_id)
    assert (row.status, row.error) == ("disconnected", "The user left the page before the tool answered.")
    (line,) = [r for r in caplog.records if "could not be written with its approval" in r.getMessage()]
    assert line.getMessage() == (f"session {page.session_id}: the end of call {call['payload']['callId']} "
                                 "could not be written with its approval")
    assert line.exc_info is not None and "refused the approval's close" in str(line.exc_info[1])


async def test_a_page_asking_about_other_arguments_ends_the_call_with_the_approvals_close(
    llm, connect, api_key, settings, written_behind
):
    page, call = await start_payment(llm, connect, api_key, settings)
    await page.send("APPROVAL_REQUEST", approval_request(call))
    await page.send("APPROVAL_REQUEST", approval_request(call, args={"amount": 4200}))
    frames = await until_done(page)

    assert [e["data"]["code"] for e in errors(frames)] == ["approval_mismatch"]
    (status, _, error), event = await the_calls_end(page.session_id)
    assert (status, event) == ("denied", ("cancelled", {"call": "denied"}))
    assert error.startswith("The action was not approved: the page asked its user about different")
    assert call["payload"]["callId"] not in written_behind
    await close(page)


# --- a turn cancelled after some of its calls finished ----------------------------------------

# The first call is answered by the page, the second refused by the server
# (its arguments do not fit: it never reaches the page), the third is cut.
THREE_ADDS = [("toolu_1", "add_to_cart", {"quantity": 1}), ("toolu_2", "add_to_cart", {"quantity": "two"}),
              ("toolu_3", "add_to_cart", {"quantity": 3})]
SECOND_REFUSED = "Invalid arguments: quantity: expected number"


async def three_calls_cut_at_the_third(llm, connect, api_key) -> Page:
    """A turn of three calls: the first answered with a result, the second
    refused for its arguments, the third sent and waiting when the test
    cuts the turn."""
    llm.enqueue(tool_use_response(THREE_ADDS))
    page = await open_shop(connect, api_key)
    await page.send("USER_INPUT", {"modality": "text", "content": "add one, two, three"})
    first = await page.recv_until("TOOL_CALL")
    await answer_with({"added": 1})(page, first)
    third = await page.recv_until("TOOL_CALL")
    assert third["payload"]["args"] == {"quantity": 3}
    return page


def results_told(message_content: list[dict]) -> list[tuple[str, bool, str]]:
    return [(b["tool_use_id"], b.get("is_error", False), b["content"])
            for b in message_content if b["type"] == "tool_result"]


async def test_a_barge_in_during_the_third_call_keeps_the_first_two_outcomes_for_the_model(
    llm, connect, api_key
):
    page = await three_calls_cut_at_the_third(llm, connect, api_key)
    await page.send("VOICE_INTERRUPT", {"reason": "barge_in"})
    await page.recv_until("VOICE_STATE_EVENT", event="interrupted")
    llm.enqueue(text_response("One is in the cart."))

    frames = await turn(page, "what happened?")

    assert errors(frames) == []
    told = [results_told(blocks(m)) for m in llm.requests[-1]["messages"]
            if results_told(blocks(m))]
    assert told == [[
        ("toolu_1", False, '{"added":1}'),
        ("toolu_2", True, SECOND_REFUSED),
        ("toolu_3", True, "The turn was cancelled before the tool answered."),
    ]]
    assert_well_formed(llm.requests[-1])
    rows = await stored_calls(page.session_id)
    assert [(r.tool_use_id, r.status, r.result, r.error) for r in rows] == [
        ("toolu_1", "success", {"added": 1}, ""),
        ("toolu_2", "invalid_args", None, SECOND_REFUSED),
        ("toolu_3", "cancelled", None, "The turn was cancelled before the tool answered."),
    ]
    messages = await stored_messages(page.session_id)
    assert_stored_conversation_valid(messages)
    assert [results_told(m.content) for m in messages if results_told(m.content)] == told
    await close(page)


async def test_a_disconnect_during_the_third_call_keeps_the_first_two_outcomes_in_the_record(
    llm, connect, api_key
):
    page = await three_calls_cut_at_the_third(llm, connect, api_key)

    await close(page)

    assert leftover_tasks() == []
    rows = await stored_calls(page.session_id)
    assert [(r.tool_use_id, r.status, r.result, r.error) for r in rows] == [
        ("toolu_1", "success", {"added": 1}, ""),
        ("toolu_2", "invalid_args", None, SECOND_REFUSED),
        ("toolu_3", "disconnected", None, "The user left the page before the tool answered."),
    ]
    messages = await stored_messages(page.session_id)
    assert_stored_conversation_valid(messages)
    assert [results_told(m.content) for m in messages if results_told(m.content)] == [[
        ("toolu_1", False, '{"added":1}'),
        ("toolu_2", True, SECOND_REFUSED),
        ("toolu_3", True, "The user left the page before the tool answered."),
    ]]
    assert len(llm.requests) == 1, "nobody is left to answer: the model is not asked again"


class CuttingPage:
    """The connection's side of a turn run here, without a consumer: it
    answers each TOOL_CALL through the agent as the consumer would, and cuts
    the turn (as a barge-in does) the moment the answer it names is in --
    before the turn has read it -- or, for a call it has no answer for, as
    soon as the call is out."""

    def __init__(self, surface, answers: dict[int, dict], cut_after: int | None = None) -> None:
        self._surface = surface
        self.answers = answers
        self.cut_after = cut_after
        self.agent = None
        self.task: asyncio.Task | None = None
        self.cut = False
        self.frames: list = []
        self.tasks: list[asyncio.Task] = []

    def cut_the_turn(self, *_) -> None:
        self.cut = True
        self.task.cancel()

    async def send(self, message) -> None:
        from aitp import protocol as p

        if not isinstance(message, p.Message):
            return  # where the turn is, and its end
        self.frames.append(message)
        if message.type is not p.MessageType.TOOL_CALL:
            return
        quantity = message.payload.args["quantity"]
        if quantity not in self.answers:
            asyncio.get_running_loop().call_soon(self.cut_the_turn)
            return
        answer = asyncio.ensure_future(self.agent.on_tool_result(p.ToolResult(
            callId=message.payload.callId, **self.answers[quantity])))
        self.tasks.append(answer)
        if quantity == self.cut_after:
            answer.add_done_callback(self.cut_the_turn)

    def surface(self):
        return self._surface

    def page(self):
        from agent.loop import PageSnapshot

        return PageSnapshot(url="/products/headphones", title="Pro Headphones", context={})


ANSWERED_ONE_AND_TWO = {1: {"status": "success", "result": {"added": 1}},
                        2: {"status": "error", "error": "out of stock"}}
ALL_ANSWERED_ADDS = [("toolu_1", "add_to_cart", {"quantity": 1}),
                     ("toolu_2", "add_to_cart", {"quantity": 2}),
                     ("toolu_3", "add_to_cart", {"quantity": 3})]


async def agent_on(page: CuttingPage):
    """A real Agent (real SDK and store) whose connection is ``page``; (agent, session)."""
    from asgiref.sync import sync_to_async

    from agent.loop import Agent, AgentConfig
    from llm import get_backend
    from tests.aitp.conftest import open_session_row

    session = await sync_to_async(open_session_row)()
    agent = page.agent = Agent(
        session_id=session.id, tenant_id=session.tenant_id, system_prompt="", backend=get_backend(),
        config=AgentConfig(model="claude-test-model", stream_interval=0.001), io=page,
        store=AgentStore(session_id=session.id, tenant_id=session.tenant_id),
    )
    return agent, session


async def run_until_cut(page: CuttingPage, agent, text: str) -> None:
    """Run a turn on ``page`` until it is cut, and the page's answers in flight land."""
    page.task = asyncio.ensure_future(agent.run_turn(text))
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(asyncio.shield(page.task), 30)
    await asyncio.gather(*page.tasks)


def add_to_cart_surface():
    from aitp.tools import ToolSurface, parse_client_tools

    return ToolSurface.build([], parse_client_tools([ADD_TO_CART]))


async def test_an_answer_that_arrived_as_the_turn_was_cancelled_keeps_its_real_outcome(llm):
    page = CuttingPage(add_to_cart_surface(), cut_after=3, answers={
        **ANSWERED_ONE_AND_TWO, 3: {"status": "success", "result": {"added": 3}}})
    agent, session = await agent_on(page)
    llm.enqueue(tool_use_response(ALL_ANSWERED_ADDS))
    await run_until_cut(page, agent, "add one, two, three")

    told = [results_told(m["content"]) for m in agent.conversation.history if results_told(m["content"])]
    assert told == [[("toolu_1", False, '{"added":1}'), ("toolu_2", True, "out of stock"),
                     ("toolu_3", False, '{"added":3}')]]
    rows = await stored_calls(session.id)
    assert [(r.tool_use_id, r.status, r.result) for r in rows] == [
        ("toolu_1", "success", {"added": 1}), ("toolu_2", "error", None),
        ("toolu_3", "success", {"added": 3})]
    messages = await stored_messages(session.id)
    assert [results_told(m.content) for m in messages if results_told(m.content)] == told


async def test_a_cut_as_the_second_answer_lands_keeps_it_and_ends_the_call_not_yet_sent(llm):
    """The turn is cut the moment the second call's answer is in: that
    answer stands, and the third call, never sent, ends cancelled."""
    page = CuttingPage(add_to_cart_surface(), cut_after=2, answers=ANSWERED_ONE_AND_TWO)
    agent, session = await agent_on(page)
    llm.enqueue(tool_use_response(ALL_ANSWERED_ADDS))
    await run_until_cut(page, agent, "add one, two, three")

    told = [("toolu_1", False, '{"added":1}'), ("toolu_2", True, "out of stock"),
            ("toolu_3", True, "The turn was cancelled before the tool answered.")]
    assert [results_told(m["content"]) for m in agent.conversation.history if results_told(m["content"])] == [told]
    rows = await stored_calls(session.id)
    assert [(r.tool_use_id, r.status) for r in rows] == [
        ("toolu_1", "success"), ("toolu_2", "error"), ("toolu_3", "cancelled")]
    messages = await stored_messages(session.id)
    assert [results_told(m.content) for m in messages if results_told(m.content)] == [told]


@pytest.mark.parametrize("second_cut", ["while_the_calls_are_settled", "at_the_turns_last_write"])
async def test_a_turn_cut_twice_during_a_call_still_ends_every_call_and_answers_every_tool_use(
    llm, monkeypatch, second_cut
):
    """A barge-in cuts the turn during its third call, and the page leaves
    while that cut is being written down (or as the turn makes its last
    write): the second cancel loses none of the calls' results."""
    page = CuttingPage(add_to_cart_surface(), answers=ANSWERED_ONE_AND_TWO)
    agent, session = await agent_on(page)
    original = AgentStore.checkpoint
    cut_again: list[bool] = []

    async def checkpoint_while_the_page_leaves(self, **kwargs):
        last_write = kwargs.get("usage") is not None
        due = last_write if second_cut == "at_the_turns_last_write" else not last_write
        if page.cut and due and not cut_again:
            cut_again.append(True)
            page.task.cancel()
        await original(self, **kwargs)

    monkeypatch.setattr(AgentStore, "checkpoint", checkpoint_while_the_page_leaves)
    llm.enqueue(tool_use_response(ALL_ANSWERED_ADDS))
    await run_until_cut(page, agent, "add one, two, three")

    assert cut_again == [True]
    told = [("toolu_1", False, '{"added":1}'), ("toolu_2", True, "out of stock"),
            ("toolu_3", True, "The turn was cancelled before the tool answered.")]
    assert [results_told(m["content"]) for m in agent.conversation.history if results_told(m["content"])] == [told]
    rows = await stored_calls(session.id)
    assert [(r.tool_use_id, r.status) for r in rows] == [
        ("toolu_1", "success"), ("toolu_2", "error"), ("toolu_3", "cancelled")]
    messages = await stored_messages(session.id)
    assert_stored_conversation_valid(messages)
    assert [results_told(m.content) for m in messages if results_told(m.content)] == [told]


class CutWhileAsking(CuttingPage):
    """Answers every call, and cuts the turn once it asks the model again
    after its tool round."""

    async def send(self, message) -> None:
        from aitp.turn import TurnEvent

        await super().send(message)
        if message is TurnEvent.ANSWERING and self.tasks and all(t.done() for t in self.tasks):
            asyncio.get_running_loop().call_soon(self.cut_the_turn)


async def test_a_turn_cut_twice_after_its_tool_round_still_writes_its_calls_end(llm, monkeypatch):
    """The call was answered and its round is over; the turn is cut while
    the model is asked again, and cut once more as it makes its last write:
    the call's outcome, kept for that write, still reaches its row."""
    page = CutWhileAsking(add_to_cart_surface(), answers={1: {"status": "success", "result": {"added": 1}}})
    agent, session = await agent_on(page)
    original = AgentStore.checkpoint
    cut_again: list[bool] = []

    async def checkpoint_while_the_page_leaves(self, **kwargs):
        if page.cut and kwargs.get("usage") is not None and not cut_again:
            cut_again.append(True)
            page.task.cancel()
        await original(self, **kwargs)

    monkeypatch.setattr(AgentStore, "checkpoint", checkpoint_while_the_page_leaves)
    llm.enqueue(tool_use_response([("toolu_1", "add_to_cart", {"quantity": 1})]),
                text_response("Added.", first_event_delay=30))
    page.task = asyncio.ensure_future(agent.run_turn("add one"))

    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(asyncio.shield(page.task), 30)

    assert page.cut and cut_again == [True]
    rows = await stored_calls(session.id)
    assert [(r.tool_use_id, r.status, r.result) for r in rows] == [("toolu_1", "success", {"added": 1})]


async def test_settling_a_cut_round_runs_to_its_end_and_says_whether_another_cancel_came():
    from agent.loop import _to_the_end

    async def quick() -> None:
        await asyncio.sleep(0)

    assert await _to_the_end(quick()) is False

    started, release, finished = asyncio.Event(), asyncio.Event(), []

    async def slow() -> None:
        started.set()
        await release.wait()
        finished.append(True)

    settling = asyncio.ensure_future(_to_the_end(slow()))
    await started.wait()
    settling.cancel()
    await asyncio.sleep(0)
    release.set()

    assert await settling is True
    assert finished == [True]
