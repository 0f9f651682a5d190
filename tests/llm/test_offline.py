"""The offline backend: page tools can be tried without a model or a network."""
from __future__ import annotations

import json

import pytest

from llm import LlmRequest, MessageComplete, TextDelta, Usage
from llm.offline import MAX_RESULT_CHARS, OfflineBackend, split_words

TOOLS = [
    {"name": "add_to_cart", "description": "Add to cart", "input_schema": {"type": "object"}},
    {"name": "get_cart", "description": "Read the cart", "input_schema": {"type": "object"}},
]
# The demo shop's order lookup, as the agent offers it to the model.
ORDER_STATUS = {
    "name": "order_status", "description": "Look up an order of this shop by its number.",
    "input_schema": {"type": "object", "required": ["number"], "properties": {
        "number": {"type": "string", "description": "The order number, e.g. A1001"}}},
}
OPEN_PRODUCT = {
    "name": "open_product", "description": "Open a product's page in the store.",
    "input_schema": {"type": "object", "required": ["productId"], "properties": {
        "productId": {"type": "string", "enum": ["pro-headphones", "travel-speaker"]}}},
}


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
    assert "- `add_to_cart` takes no arguments: Add to cart" in answer
    assert "- `get_cart` takes no arguments: Read the cart" in answer
    assert "".join(deltas) == answer
    assert complete.stop_reason == "end_turn"


async def test_says_none_when_the_page_has_no_tools():
    _, complete = await run(request([user(text("hello"))], tools=[]))

    assert complete.content[0]["text"].endswith("There are no tools on this page.")


async def test_the_help_names_each_parameter_a_tool_takes_and_whether_it_is_required():
    _, complete = await run(request([user(text("what can you do?"))], tools=[ORDER_STATUS, OPEN_PRODUCT]))

    answer = complete.content[0]["text"]
    assert "- `order_status` takes `number` (string, required): Look up an order" in answer
    assert '- `open_product` takes `productId` (one of "pro-headphones", "travel-speaker", required)' in answer


async def test_the_helps_example_calls_a_tool_on_offer_with_arguments_it_takes():
    _, complete = await run(request([user(text("help"))], tools=[TOOLS[1], ORDER_STATUS]))

    # The example number comes from the parameter's own description.
    assert complete.content[0]["text"].endswith('For example: `/tool order_status {"number": "A1001"}`')


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


async def test_the_syntax_example_uses_a_tool_on_the_page_and_its_real_arguments():
    _, complete = await run(request([user(text("/tool open_product productId=x"))],
                                    tools=[TOOLS[1], OPEN_PRODUCT]))

    assert complete.content[0]["text"].endswith(
        'for example: /tool open_product {"productId": "pro-headphones"}')


async def test_without_tools_taking_arguments_the_syntax_example_is_the_demo_stores_add_to_cart():
    _, complete = await run(request([user(text("/tool"))], tools=[]))

    assert complete.content[0]["text"].endswith('for example: /tool add_to_cart {"quantity": 2}')


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
        "text": "add_to_cart succeeded.\n- Added: yes\n\nget_cart failed: cart is locked",
    }]
    assert complete.stop_reason == "end_turn"
    assert "".join(deltas) == complete.content[0]["text"]


async def test_a_command_after_the_results_of_a_cut_turn_calls_the_tool():
    messages = [
        user(text("/tool add_to_cart {}")),
        {"role": "assistant", "content": [
            {"type": "tool_use", "id": "toolu_off_1", "name": "add_to_cart", "input": {}}]},
        user({"type": "tool_result", "tool_use_id": "toolu_off_1", "is_error": True,
              "content": "not answered"},
             text('/tool add_to_cart {"quantity": 2}')),
    ]

    _, complete = await run(request(messages))

    assert [block["type"] for block in complete.content] == ["tool_use"]
    assert complete.content[0]["input"] == {"quantity": 2}


async def test_summarises_tool_results_as_text_even_when_tool_choice_is_none():
    messages = [
        {"role": "assistant", "content": [
            {"type": "tool_use", "id": "toolu_off_1", "name": "get_cart", "input": {}}]},
        user({"type": "tool_result", "tool_use_id": "toolu_off_1", "content": "[]"}),
    ]

    _, complete = await run(request(messages, tool_choice={"type": "none"}))

    assert complete.content == [{"type": "text", "text": "get_cart succeeded."}]


async def test_a_json_result_is_told_as_its_fields_in_words_not_as_json():
    result = {"added": True, "productId": "pro-headphones", "quantity": 2,
              "cart": {"itemCount": 2, "total": 299.98, "coupon": None, "notes": [],
                       "items": [{"name": "Pro Headphones", "quantity": 2}]}}
    messages = [
        {"role": "assistant", "content": [
            {"type": "tool_use", "id": "toolu_off_1", "name": "add_to_cart", "input": {}}]},
        user({"type": "tool_result", "tool_use_id": "toolu_off_1", "content": json.dumps(result)}),
    ]

    _, complete = await run(request(messages))

    assert complete.content[0]["text"] == (
        "add_to_cart succeeded.\n"
        "- Added: yes\n"
        "- Product id: pro-headphones\n"
        "- Quantity: 2\n"
        "- Cart: item count 2, total 299.98, coupon none, no notes, items (name Pro Headphones, quantity 2)"
    )


async def test_a_very_long_field_is_cut_short():
    messages = [
        {"role": "assistant", "content": [
            {"type": "tool_use", "id": "toolu_off_1", "name": "get_page", "input": {}}]},
        user({"type": "tool_result", "tool_use_id": "toolu_off_1",
              "content": json.dumps({"html": "x" * 5000})}),
    ]

    _, complete = await run(request(messages))

    assert complete.content[0]["text"] == "get_page succeeded.\n- Html: " + "x" * MAX_RESULT_CHARS + "…"


@pytest.mark.parametrize("value", ["one", "  leading and trailing  ", "a b c d e f g\nh", ""])
def test_word_pieces_join_back_to_exactly_the_text(value):
    assert "".join(split_words(value)) == value
