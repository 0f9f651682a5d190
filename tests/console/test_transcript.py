"""Conversation content blocks -> what the session page shows (pure)."""
from __future__ import annotations

from aitp.transcript import Block, message_blocks, pretty_json


def test_text_tool_use_and_tool_result_blocks_become_display_blocks():
    blocks = message_blocks([
        {"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}},
        {"type": "tool_use", "id": "toolu_1", "name": "search", "input": {"q": "mug"}},
        {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "3 hits"}]},
    ])
    assert blocks == [
        Block(kind="text", text="hi"),
        Block(kind="tool_use", text='{\n  "q": "mug"\n}', name="search", ref="toolu_1"),
        Block(kind="tool_result", text="3 hits", ref="toolu_1"),
    ]


def test_an_error_result_is_marked_as_an_error():
    (block,) = message_blocks(
        [{"type": "tool_result", "tool_use_id": "t", "content": "boom", "is_error": True}]
    )
    assert block.is_error and block.text == "boom"


def test_a_bare_string_is_one_text_block():
    assert message_blocks("hello") == [Block(kind="text", text="hello")]


def test_an_unknown_block_is_shown_as_json_rather_than_dropped():
    (block,) = message_blocks([{"type": "image", "source": {"type": "base64"}}])
    assert block.kind == "other" and '"image"' in block.text


def test_pretty_json_of_nothing_is_empty():
    assert pretty_json(None) == "" and pretty_json({"a": 1}) == '{\n  "a": 1\n}'


def test_a_failed_turns_mark_is_an_error_block_naming_its_code():
    (block,) = message_blocks([{"type": "turn_error", "code": "auth_failed",
                                "message": "The assistant is not set up correctly on this server."}])

    assert block == Block(kind="error", text="The assistant is not set up correctly on this server.",
                          name="auth_failed")
    assert block.title == "turn failed: auth_failed"
