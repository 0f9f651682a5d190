"""What the model writes is checked as a page's frame is, before anything
else holds it.

- A tool_use whose input no later layer could hold (U+0000, a lone
  surrogate, nesting deeper than a TOOL_CALL frame's arguments may, a number
  beyond 64 bits) ends ``invalid_args``: no TOOL_CALL, the model told why in
  general terms, the row final with an empty input, and the conversation
  stays valid for the next request.
- The real SDK refuses a tool input with a lone surrogate itself: the turn
  ends as for any upstream error, and the next one works.
- Text with U+0000 or a lone surrogate reaches the page, the stored
  conversation and the next model request with each such character as
  U+FFFD, the same everywhere.

Each through the real consumer, the real SDK and the fake Messages API
(tests/support/fake_anthropic.py), on both database back ends.
"""
from __future__ import annotations

import logging

import pytest
from asgiref.sync import sync_to_async

from agent.loop import Agent, AgentConfig
from agent.store import AgentStore
from aitp.ledger import unusable_arguments
from aitp.llm import MessageComplete, TextDelta, Usage
from aitp.models import ToolCall
from tests.aitp.conftest import open_session_row
from tests.aitp.test_agent import (  # noqa: F401  (fake and llm are fixtures)
    CuttingPage,
    add_to_cart_surface,
    assert_failed_turn,
    assert_stored_conversation_valid,
    assert_well_formed,
    blocks,
    close,
    errors,
    fake,
    llm,
    of_type,
    open_shop,
    stored_calls,
    stored_messages,
    streamed,
    tool_results,
    turn,
)
from tests.support.fake_anthropic import text_response, tool_use_response

pytestmark = [pytest.mark.django_db(transaction=True)]


def nested(levels: int) -> dict:
    value: dict = {}
    for _ in range(levels - 1):
        value = {"more": value}
    return value


# The input the model writes, and the code the check refuses it with.
UNUSABLE_INPUTS = {
    "a_nul_in_a_value": ({"quantity": 1, "note": "gift\x00wrap"}, "invalid_text"),
    "a_nul_in_a_name": ({"quantity": 1, "gift\x00wrap": True}, "invalid_text"),
    # A TOOL_CALL's arguments may nest 30 levels (32 in the frame).
    "nested_too_deep": ({"quantity": 1, "note": nested(31)}, "too_deep"),
    "a_number_beyond_64_bits": ({"quantity": 2**80}, "invalid_number"),
}


def no_traceback(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]


@pytest.mark.parametrize("kind", sorted(UNUSABLE_INPUTS))
async def test_a_tool_use_whose_input_cannot_be_stored_ends_invalid_args_and_never_reaches_the_page(
        llm, connect, api_key, caplog, kind):
    args, code = UNUSABLE_INPUTS[kind]
    llm.enqueue(tool_use_response([("toolu_bad", "add_to_cart", args)]),
                text_response("That did not work."), text_response("Here I am."))
    page = await open_shop(connect, api_key)

    frames = await turn(page, "add one with a note")

    assert of_type(frames, "TOOL_CALL") == []
    assert errors(frames) == []
    assert streamed(frames)[1] == "That did not work."
    # The model's message as recorded, and what it is told.
    assert blocks(llm.requests[1]["messages"][1]) == [
        {"type": "tool_use", "id": "toolu_bad", "name": "add_to_cart", "input": {}}]
    (result,) = tool_results(llm.requests[1]["messages"][2])
    assert result == {"type": "tool_result", "tool_use_id": "toolu_bad",
                      "content": unusable_arguments(code), "is_error": True}
    (row,) = await stored_calls(page.session_id)
    assert (row.status, row.arguments, row.error, row.sent_at) == (
        "invalid_args", {}, unusable_arguments(code), None)
    assert row.finished_at is not None
    # The next turn works, on a conversation the API takes.
    assert streamed(await turn(page, "are you there?"))[1] == "Here I am."
    assert_well_formed(llm.requests[2])
    assert_stored_conversation_valid(await stored_messages(page.session_id))
    assert no_traceback(caplog) == []
    await close(page)


def test_the_model_is_told_why_its_input_was_refused_in_general_terms():
    assert unusable_arguments("invalid_text") == (
        "Invalid arguments: the input contains text that is not valid Unicode (a NUL character "
        "or a lone surrogate); the call did not run.")
    assert unusable_arguments("too_deep") == (
        "Invalid arguments: the input is nested too deeply; the call did not run.")
    assert unusable_arguments("invalid_number") == (
        "Invalid arguments: the input contains a number that is not finite or is too large; "
        "the call did not run.")


async def test_input_nested_as_deep_as_a_frame_allows_still_reaches_the_page(llm, connect, api_key):
    args = {"quantity": 1, "note": nested(29)}
    llm.enqueue(tool_use_response([("toolu_deep", "add_to_cart", args)]), text_response("Added."))
    page = await open_shop(connect, api_key)

    async def answer(page, frame):
        await page.send("TOOL_RESULT", {"callId": frame["payload"]["callId"], "status": "success",
                                        "result": None})

    frames = await turn(page, "add one", answer)

    (call,) = of_type(frames, "TOOL_CALL")
    assert call["payload"]["args"] == args
    (row,) = await stored_calls(page.session_id)
    assert (row.status, row.arguments) == ("success", args)
    await close(page)


@pytest.mark.parametrize("escaped", [False, True], ids=["raw", "escaped"])
async def test_a_tool_input_with_a_lone_surrogate_is_refused_upstream_and_the_next_turn_works(
        llm, connect, api_key, caplog, escaped):
    # The SDK parses a tool's input as UTF-8, which has no lone surrogate:
    # it refuses the stream, and the turn ends as for any upstream error.
    llm.enqueue(tool_use_response([("toolu_bad", "add_to_cart", {"quantity": 1, "note": "a\ud800b"})],
                                  ensure_ascii=escaped),
                text_response("Here I am."))
    page = await open_shop(connect, api_key)

    frames = await turn(page, "add one with a note")

    assert_failed_turn(frames, "upstream_error")
    assert of_type(frames, "TOOL_CALL") == []
    assert await stored_calls(page.session_id) == []
    assert streamed(await turn(page, "are you there?"))[1] == "Here I am."
    assert_well_formed(llm.requests[1])
    assert_stored_conversation_valid(await stored_messages(page.session_id))
    assert no_traceback(caplog) == []
    await close(page)


class ScriptedBackend:
    """A model backend other than the SDK, handing over what it was given."""

    name = "scripted"

    def __init__(self, *answers: list[dict]) -> None:
        self.answers = list(answers)
        self.requests: list = []

    async def stream(self, request):
        self.requests.append(request)
        content = self.answers.pop(0)
        for block in content:
            if block["type"] == "text":
                yield TextDelta(block["text"])
        yield MessageComplete(content=content, stop_reason="end_turn", usage=Usage())


BAD_TEXT = {"nul": "\x00", "high_surrogate": "\ud800", "low_surrogate": "\udc00"}


async def scripted_turn(tool_use: dict) -> tuple[CuttingPage, ScriptedBackend, str]:
    """One turn of a real Agent (real store) whose backend answers
    ``tool_use``, then text: (the page, the backend, the session id)."""
    page = CuttingPage(add_to_cart_surface(), answers={})
    session = await sync_to_async(open_session_row)()
    backend = ScriptedBackend([tool_use], [{"type": "text", "text": "That did not work."}])
    agent = page.agent = Agent(
        session_id=session.id, tenant_id=session.tenant_id, system_prompt="", backend=backend,
        config=AgentConfig(model="scripted", stream_interval=0.001), io=page,
        store=AgentStore(session_id=session.id, tenant_id=session.tenant_id),
    )
    await agent.run_turn("add one with a note")
    return page, backend, session.id


@pytest.mark.parametrize("kind", sorted(BAD_TEXT))
async def test_a_tool_use_with_such_text_from_any_backend_ends_invalid_args(kind):
    page, backend, session_id = await scripted_turn(
        {"type": "tool_use", "id": "toolu_bad", "name": "add_to_cart",
         "input": {"quantity": 1, "note": f"a{BAD_TEXT[kind]}b"}})

    assert [m.type.value for m in page.frames] == ["AGENT_RESPONSE"]
    row = await ToolCall.objects.aget(session_id=session_id)
    assert (row.status, row.arguments) == ("invalid_args", {})
    [tool_result] = backend.requests[1].messages[-1]["content"]
    assert tool_result["content"] == unusable_arguments("invalid_text")
    assert_stored_conversation_valid(await stored_messages(session_id))


@pytest.mark.parametrize("kind", sorted(BAD_TEXT))
async def test_a_tool_use_named_with_such_text_is_recorded_as_the_replacement_character(kind):
    bad = BAD_TEXT[kind]
    page, backend, session_id = await scripted_turn(
        {"type": "tool_use", "id": f"toolu_{bad}1", "name": f"add_to{bad}cart", "input": {"quantity": 1}})

    # No tool has that name: the call is unavailable, and never sent.
    assert [m.type.value for m in page.frames] == ["AGENT_RESPONSE"]
    row = await ToolCall.objects.aget(session_id=session_id)
    assert (row.status, row.name, row.tool_use_id) == ("unavailable", "add_to\ufffdcart", "toolu_\ufffd1")
    [tool_result] = backend.requests[1].messages[-1]["content"]
    assert tool_result["tool_use_id"] == "toolu_\ufffd1"
    assert_stored_conversation_valid(await stored_messages(session_id))


@pytest.mark.parametrize("kind", sorted(BAD_TEXT))
async def test_text_the_layers_cannot_hold_reaches_page_and_record_as_the_replacement_character(
        llm, connect, api_key, caplog, kind):
    llm.enqueue(text_response(f"Your total{BAD_TEXT[kind]} is 42.", chunks=3),
                text_response("Anything else?"))
    page = await open_shop(connect, api_key)

    frames = await turn(page, "what is my total?")

    shown = "Your total\ufffd is 42."
    assert streamed(frames) == (shown, shown)
    messages = await stored_messages(page.session_id)
    assert messages[1].content == [{"type": "text", "text": shown}]
    # The next turn works, and the model reads what the page was shown.
    assert streamed(await turn(page, "thanks"))[1] == "Anything else?"
    assert blocks(llm.requests[1]["messages"][1]) == [{"type": "text", "text": shown}]
    assert_well_formed(llm.requests[1])
    assert no_traceback(caplog) == []
    await close(page)


@pytest.mark.parametrize("kind", sorted(BAD_TEXT))
async def test_such_text_before_a_tool_call_is_stored_with_the_call_as_shown(
        llm, connect, api_key, kind):
    llm.enqueue(tool_use_response([("toolu_go", "go_to_cart", {})],
                                  text=f"Opening{BAD_TEXT[kind]} the cart."),
                text_response("Here it is."))
    page = await open_shop(connect, api_key)

    async def answer(page, frame):
        await page.send("TOOL_RESULT", {"callId": frame["payload"]["callId"], "status": "success",
                                        "result": None})

    frames = await turn(page, "open the cart", answer)

    assert streamed(frames)[1] == "Opening\ufffd the cart.\n\nHere it is."
    messages = await stored_messages(page.session_id)
    assert messages[1].content[0] == {"type": "text", "text": "Opening\ufffd the cart."}
    assert (await stored_calls(page.session_id))[0].status == "success"
    assert_well_formed(llm.requests[1])
    await close(page)
