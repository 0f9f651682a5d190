"""The offline backend: page tools can be tried without a model or a network."""
from __future__ import annotations

import pytest

from aitp.llm import LlmRequest, MessageComplete, TextDelta, Usage
from aitp.llm.offline import OfflineBackend, split_words

TOOLS = [
    {"name": "add_to_cart", "description": "Add to cart", "input_schema": {"type": "object"}},
    {"name": "get_cart", "description": "Read the cart", "input_schema": {"type": "object"}},
]


def user(*blocks) -> dict:
    return {"role": "user", "content": list(blocks)}


def text(value: str) -> dict:
    return {"type": "text", "text": value}


def request(messages: list[dict], *, tools: list[dict] | None = None, tool_choice=None) -> LlmRequest:
    return LlmRequest(model="offline", system=[], messages=messages,
                      tools=TOOLS if tools is None else tools, max_tokens=100, tool_choice=tool_choice)


async def run(req: LlmRequest) -> tuple[list[str], MessageComplete]:
    events = [event async for event in OfflineBackend().stream(req)]
    *deltas, complete = events
    assert all(isinstance(event, TextDelta) for event in deltas)
    assert isinstance(complete, MessageComplete)
    return [event.text for event in deltas], complete


async def test_explains_itself_and_lists_the_page_tools_for_plain_text():
    deltas, complete = await run(request([user(text("Hi, what can you do?"))]))

    answer = complete.content[0]["text"]
    assert answer.startswith("No language model is configured on this server")
    assert answer.endswith("Tools on this page: add_to_cart, get_cart.")
    assert "".join(deltas) == answer
    assert complete.stop_reason == "end_turn"


async def test_says_none_when_the_page_has_no_tools():
    _, complete = await run(request([user(text("hello"))], tools=[]))

    assert complete.content[0]["text"].endswith("Tools on this page: none.")


async def test_streams_the_answer_in_several_pieces_with_zero_usage():
    deltas, complete = await run(request([user(text("hello"))]))

    assert len(deltas) > 3
    assert complete.usage == Usage()


async def test_calls_the_named_tool_with_the_json_arguments():
    deltas, complete = await run(request([user(text('/tool add_to_cart {"sku": "A1", "quantity": 2}'))]))

    assert deltas == []
    [call] = complete.content
    assert call["type"] == "tool_use"
    assert call["id"].startswith("toolu_off_")
    assert call["name"] == "add_to_cart"
    assert call["input"] == {"sku": "A1", "quantity": 2}
    assert complete.stop_reason == "tool_use"


async def test_reads_the_command_past_the_page_blocks_of_the_message():
    message = user(text("[page]\nurl: https://shop.example/cart\ntitle: Cart"), text("/tool get_cart"))

    _, complete = await run(request([message]))

    assert complete.content[0]["name"] == "get_cart"


async def test_calls_a_tool_with_empty_arguments_when_none_are_given():
    _, complete = await run(request([{"role": "user", "content": "/tool get_cart"}]))

    assert complete.content[0]["name"] == "get_cart"
    assert complete.content[0]["input"] == {}


async def test_gives_each_tool_call_its_own_id():
    req = request([user(text("/tool get_cart"))])
    _, first = await run(req)
    _, second = await run(req)

    assert first.content[0]["id"] != second.content[0]["id"]


@pytest.mark.parametrize("command", [
    "/tool add_to_cart {sku: A1}",
    "/tool add_to_cart [1, 2]",
    "/tool",
])
async def test_explains_the_syntax_when_the_command_does_not_parse(command):
    _, complete = await run(request([user(text(command))]))

    assert complete.stop_reason == "end_turn"
    assert [block["type"] for block in complete.content] == ["text"]
    assert "/tool <name>" in complete.content[0]["text"]


async def test_never_calls_a_tool_when_tool_choice_is_none():
    _, complete = await run(request([user(text("/tool get_cart"))], tool_choice={"type": "none"}))

    assert complete.stop_reason == "end_turn"
    assert [block["type"] for block in complete.content] == ["text"]


async def test_summarises_tool_results_by_the_name_of_the_call():
    messages = [
        user(text("/tool add_to_cart {}")),
        {"role": "assistant", "content": [
            {"type": "tool_use", "id": "toolu_off_1", "name": "add_to_cart", "input": {}},
            {"type": "tool_use", "id": "toolu_off_2", "name": "get_cart", "input": {}},
        ]},
        user(
            {"type": "tool_result", "tool_use_id": "toolu_off_1", "content": '{"added": true}'},
            {"type": "tool_result", "tool_use_id": "toolu_off_2", "is_error": True,
             "content": [text("cart is locked")]},
        ),
    ]

    deltas, complete = await run(request(messages))

    assert complete.content == [{
        "type": "text",
        "text": 'add_to_cart succeeded: {"added": true}\nget_cart failed: cart is locked',
    }]
    assert complete.stop_reason == "end_turn"
    assert "".join(deltas) == complete.content[0]["text"]


async def test_summarises_tool_results_as_text_even_when_tool_choice_is_none():
    messages = [
        {"role": "assistant", "content": [
            {"type": "tool_use", "id": "toolu_off_1", "name": "get_cart", "input": {}}]},
        user({"type": "tool_result", "tool_use_id": "toolu_off_1", "content": "[]"}),
    ]

    _, complete = await run(request(messages, tool_choice={"type": "none"}))

    assert complete.content == [{"type": "text", "text": "get_cart succeeded: []"}]


@pytest.mark.parametrize("value", ["one", "  leading and trailing  ", "a b c d e f g\nh", ""])
def test_word_pieces_join_back_to_exactly_the_text(value):
    assert "".join(split_words(value)) == value
