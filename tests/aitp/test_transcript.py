"""Stored conversation content -> what the session and approval pages show (pure)."""
from __future__ import annotations

from datetime import UTC, datetime
from types import SimpleNamespace

from aitp.transcript import Block, content_block, conversation_rows, message_blocks, pretty_json, result_text


def test_a_tool_use_is_titled_with_the_tool_it_calls_and_shows_its_input_as_json():
    block = content_block({"type": "tool_use", "id": "toolu_1", "name": "refund", "input": {"order": "A1"}})
    assert block == Block(kind="tool_use", text='{\n  "order": "A1"\n}', name="refund", ref="toolu_1")
    assert block.title == "calls refund"


def test_a_tool_use_without_a_name_is_still_titled():
    assert content_block({"type": "tool_use", "input": {}}).title == "calls ?"


def test_a_tool_result_is_titled_as_a_result_or_an_error():
    ok = content_block({"type": "tool_result", "tool_use_id": "toolu_1", "content": "refunded"})
    failed = content_block(
        {"type": "tool_result", "tool_use_id": "toolu_1", "content": "no", "is_error": True}
    )
    assert (ok.title, ok.text, ok.ref) == ("tool result", "refunded", "toolu_1")
    assert (failed.title, failed.is_error) == ("tool error", True)


def test_a_result_made_of_blocks_shows_their_text_and_the_rest_as_json():
    text = result_text([{"type": "text", "text": "3 hits"}, {"type": "image", "source": {"type": "base64"}}])
    first, second = text.split("\n", 1)
    assert first == "3 hits" and '"type": "image"' in second


def test_a_result_with_no_content_is_empty():
    assert content_block({"type": "tool_result", "tool_use_id": "t"}).text == ""


def test_text_blocks_have_no_title():
    assert content_block({"type": "text", "text": "hi"}).title == ""
    assert content_block("hi") == Block(kind="text", text="hi")


def test_an_unknown_block_keeps_its_type_as_title_and_all_of_itself_as_json():
    block = content_block({"type": "thinking", "thinking": "hmm"})
    assert (block.kind, block.title) == ("other", "thinking")
    assert '"thinking": "hmm"' in block.text


def test_something_that_is_not_a_block_is_shown_as_json():
    block = content_block(42)
    assert (block.kind, block.text, block.title) == ("other", "42", "")


def test_a_message_of_one_bare_block_reads_as_a_list_of_one():
    assert message_blocks({"type": "text", "text": "hi"}) == [Block(kind="text", text="hi")]
    assert message_blocks("hi") == [Block(kind="text", text="hi")]


def test_conversation_rows_keep_the_order_given_and_each_messages_facts():
    at = datetime(2025, 1, 1, tzinfo=UTC)
    messages = [
        SimpleNamespace(seq=3, turn=1, role="assistant", created_at=at,
                        content=[{"type": "text", "text": "b"}]),
        SimpleNamespace(seq=1, turn=1, role="user", created_at=at, content="a"),
    ]
    rows = conversation_rows(messages)
    assert [row["seq"] for row in rows] == [3, 1]
    assert rows[1] == {"seq": 1, "turn": 1, "role": "user", "created_at": at,
                       "blocks": [Block(kind="text", text="a")]}


def test_pretty_json_is_sorted_and_keeps_non_ascii_text():
    assert pretty_json({"b": "é", "a": 1}) == '{\n  "a": 1,\n  "b": "é"\n}'
    assert pretty_json(None) == ""
