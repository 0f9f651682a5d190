"""What a server tool answers is checked as a page's answer is in its frame.

A webhook (a real HTTP receiver on 127.0.0.1) or a Python tool answering a
value no later layer could hold -- NaN, Infinity, a NUL, a lone surrogate in
a value or in a name, nesting 200 levels deep, 2**80, a Python object --
ends the call as an error: its ToolCall row is final, the model is told in
a plain sentence that the answer could not be used (never the value, never
a repr), nothing is logged as an error or a traceback, and the session's
next turn works (the conversation holds nothing the next request could not
carry).

Driven through the real consumer (WebsocketCommunicator), the real SDK and
the fake Messages API, as tests/aitp/test_agent.py is.
"""
from __future__ import annotations

import logging

import pytest

from aitp.ledger import UNUSABLE_ERROR, unusable_answer
from aitp.models import ToolCall
from tests.aitp.conftest import api_key, connect, in_db, tenant  # noqa: F401 (fixtures)
from tests.aitp.hostile import HOSTILE_RETURNS, HOSTILE_WEBHOOK_BODIES
from tests.aitp.test_agent import (  # noqa: F401 (fixtures)
    assert_well_formed,
    close,
    errors,
    fake,
    llm,
    open_shop,
    streamed,
    tool_results,
    turn,
)
from tests.approvals.hostile_tools import PYTHON_TOOL, HostileReceiver, offer_hostile_tools
from tests.support.fake_anthropic import text_response, tool_use_response

pytestmark = [pytest.mark.django_db(transaction=True)]

WEBHOOK_TOOL = "hostile_webhook_answer"

# Why each answer is refused, as the check's code.
REFUSED_AS = {
    "nan": "invalid_number",
    "infinity": "invalid_number",
    "-infinity": "invalid_number",
    "integer_2_80": "invalid_number",
    "nul": "invalid_text",
    "surrogate_in_a_value": "invalid_text",
    "surrogate_in_a_key": "invalid_text",
    "nested_200_levels": "too_deep",
    "python_object": "invalid_value",
}


@pytest.fixture
def hostile_tools_offered(tenant):
    with HostileReceiver() as receiver:
        offer_hostile_tools(tenant, receiver.url)
        yield receiver


def problems_logged(caplog) -> list[str]:
    """Records at ERROR or above, and any record carrying a traceback."""
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]


async def a_tool_answers_then_the_session_goes_on(llm, connect, api_key, caplog, tool: str,
                                                  kind: str) -> tuple[dict, ToolCall]:
    """One turn whose call of ``tool`` answers ``kind``, then the next turn;
    (what the model was told of the call, the call's row)."""
    caplog.set_level(logging.INFO)
    llm.enqueue(tool_use_response([("toolu_hostile", tool, {"kind": kind})]),
                text_response("That did not work."), text_response("Still here."))
    page = await open_shop(connect, api_key)

    first = await turn(page, "try it")
    second = await turn(page, "and now?")
    await close(page)

    assert errors(first) == errors(second) == []
    assert streamed(first)[1] == "That did not work."
    assert streamed(second)[1] == "Still here."
    assert len(llm.requests) == 3
    assert_well_formed(llm.requests[2])
    assert problems_logged(caplog) == []
    (told,) = tool_results(llm.requests[1]["messages"][-1])
    row = await ToolCall.objects.aget(tool_use_id="toolu_hostile")
    return told, row


def assert_refused(told: dict, row: ToolCall, kind: str) -> None:
    expected = unusable_answer(REFUSED_AS[kind])
    assert told == {"type": "tool_result", "tool_use_id": "toolu_hostile", "is_error": True,
                    "content": expected}
    assert expected.startswith("The tool ran, but its answer could not be used: ")
    assert (row.status, row.result, row.error) == ("error", None, expected)
    assert row.finished_at is not None


@pytest.mark.parametrize("kind", sorted(HOSTILE_WEBHOOK_BODIES))
async def test_a_webhook_answering_a_value_no_layer_holds_ends_its_call_as_an_error_the_model_is_told(
    llm, connect, api_key, hostile_tools_offered, caplog, kind
):
    told, row = await a_tool_answers_then_the_session_goes_on(
        llm, connect, api_key, caplog, WEBHOOK_TOOL, kind)
    assert_refused(told, row, kind)


@pytest.mark.parametrize("kind", sorted(HOSTILE_RETURNS))
async def test_a_python_tool_returning_a_value_no_layer_holds_ends_its_call_as_an_error_the_model_is_told(
    llm, connect, api_key, hostile_tools_offered, caplog, kind
):
    told, row = await a_tool_answers_then_the_session_goes_on(
        llm, connect, api_key, caplog, PYTHON_TOOL, kind)
    assert_refused(told, row, kind)
    assert "NotJson" not in told["content"] and "secret" not in told["content"]


async def test_a_good_answer_still_reaches_the_model_as_it_was_given(
    llm, connect, api_key, hostile_tools_offered, caplog
):
    told, row = await a_tool_answers_then_the_session_goes_on(
        llm, connect, api_key, caplog, WEBHOOK_TOOL, "good")
    assert told == {"type": "tool_result", "tool_use_id": "toolu_hostile",
                    "content": '{"ok":true,"total":12.5}'}
    assert (row.status, row.result) == ("success", {"ok": True, "total": 12.5})


async def test_a_webhook_nested_deeper_than_json_can_read_is_told_as_a_plain_fact(
    llm, connect, api_key, hostile_tools_offered, caplog
):
    told, row = await a_tool_answers_then_the_session_goes_on(
        llm, connect, api_key, caplog, WEBHOOK_TOOL, "nested_100000_levels")
    assert told["content"] == "webhook returned JSON nested too deeply"
    assert (row.status, row.error) == ("error", "webhook returned JSON nested too deeply")


async def test_an_error_message_no_layer_holds_is_replaced_by_a_plain_sentence(
    llm, connect, api_key, hostile_tools_offered, caplog
):
    told, row = await a_tool_answers_then_the_session_goes_on(
        llm, connect, api_key, caplog, PYTHON_TOOL, "fails_in_bad_words")
    assert told["content"] == UNUSABLE_ERROR
    assert (row.status, row.error) == ("error", UNUSABLE_ERROR)
