"""The demo backend: without a model key, a scripted assistant answers the
demo store's plain requests in sentences, runs its tools and says it is a demo."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from llm import LlmRequest, MessageComplete, TextDelta
from llm.demo import DemoBackend

PRODUCTS = ["pro-headphones", "travel-speaker", "charging-dock"]


def tool(name: str, risk_note: str = "", **params: dict) -> dict:
    """A page tool as the agent offers it to the model (the store's declarations)."""
    return {"name": name, "description": f"The store's {name}.{risk_note}",
            "input_schema": {"type": "object", "properties": params, "required": list(params)}}


OPEN_PRODUCT = tool("open_product", productId={"type": "string", "enum": PRODUCTS})
OPEN_CART = tool("open_cart")
ADD_TO_CART = tool("add_to_cart", quantity={"type": "number", "description": "How many to add (1-99)"})
SET_QUANTITY = tool("set_quantity", productId={"type": "string", "enum": PRODUCTS}, quantity={"type": "number"})
APPLY_COUPON = tool("apply_coupon", code={"type": "string"})
PROCESS_PAYMENT = tool("process_payment", " (risk: critical; the user approves it in the page before it runs)",
                       amount={"type": "number", "description": "The amount to charge in USD: the cart total"})
# The tools each page of the store offers (demo/views.py).
CATALOGUE_PAGE = [OPEN_PRODUCT, OPEN_CART]
PRODUCT_PAGE = [ADD_TO_CART, OPEN_PRODUCT, OPEN_CART]
CART_PAGE = [SET_QUANTITY, APPLY_COUPON, PROCESS_PAYMENT, OPEN_PRODUCT]
EVERY_NAME = [t["name"] for t in [*PRODUCT_PAGE, *CART_PAGE]]

SPEAKER_PAGE = {"page": "product_detail", "productId": "travel-speaker", "name": "Travel Speaker", "price": 89.0}
CART = {"page": "cart", "items": [{"productId": "travel-speaker", "quantity": 2, "lineTotal": 178.0}],
        "itemCount": 2, "subtotal": 178.0, "discount": 0.0, "total": 178.0, "currency": "USD"}


def page(context: dict, url: str = "/demo/") -> dict:
    """The [page] block the agent adds to a user message when the page changed."""
    return {"type": "text", "text": f"[page]\nurl: {url}\ntitle: Owl Store\ncontext: {json.dumps(context)}"}


def user(words: str, context: dict | None = None) -> dict:
    return {"role": "user", "content": [{"type": "text", "text": words}, *([page(context)] if context else [])]}


def called(tool_use: dict) -> dict:
    return {"role": "assistant", "content": [tool_use]}


def result(tool_use: dict, content: object, *, error: bool = False, context: dict | None = None) -> dict:
    block = {"type": "tool_result", "tool_use_id": tool_use["id"],
             "content": content if isinstance(content, str) else json.dumps(content)}
    if error:
        block["is_error"] = True
    return {"role": "user", "content": [block, *([page(context)] if context else [])]}


async def run(messages: list[dict], tools: list[dict], tool_choice=None) -> tuple[list[str], MessageComplete]:
    request = LlmRequest(model="demo", system=[{"type": "text", "text": "You help shoppers."}],
                         messages=messages, tools=tools, max_tokens=1024, tool_choice=tool_choice)
    *deltas, complete = [event async for event in DemoBackend().stream(request)]
    assert all(isinstance(event, TextDelta) for event in deltas)
    assert isinstance(complete, MessageComplete)
    assert "".join(event.text for event in deltas) == complete.text
    return [event.text for event in deltas], complete


async def said(messages: list[dict], tools: list[dict]) -> str:
    _, complete = await run(messages, tools)
    assert complete.stop_reason == "end_turn" and complete.tool_uses == []
    return complete.text


async def calls(messages: list[dict], tools: list[dict]) -> dict:
    _, complete = await run(messages, tools)
    assert complete.stop_reason == "tool_use"
    [tool_use] = complete.tool_uses
    return tool_use


# --- what it is ------------------------------------------------------------------------


async def test_a_greeting_is_streamed_in_pieces_and_says_it_is_a_demo_and_how_to_connect_claude():
    deltas, complete = await run([user("Hello!", {"page": "catalog"})], CATALOGUE_PAGE)

    answer = complete.text
    assert len(deltas) > 5
    assert "demo assistant" in answer and "not a language model" in answer
    assert "set ANTHROPIC_API_KEY" in answer and "README" in answer


async def test_what_can_you_do_is_answered_with_what_this_page_allows_in_words():
    answer = await said([user("What can you do?", SPEAKER_PAGE)], PRODUCT_PAGE)

    assert "show you a product, add it to your cart, open your cart, apply a coupon and pay for your order" in answer
    assert '"add two to my cart"' in answer
    assert not any(name in answer for name in EVERY_NAME)


# --- the store's intents -------------------------------------------------------------


async def test_add_two_to_my_cart_calls_the_pages_cart_tool_with_two():
    tool_use = await calls([user("add two to my cart", SPEAKER_PAGE)], PRODUCT_PAGE)

    assert (tool_use["name"], tool_use["input"]) == ("add_to_cart", {"quantity": 2})


async def test_buying_without_a_number_adds_one():
    tool_use = await calls([user("I'll buy it", SPEAKER_PAGE)], PRODUCT_PAGE)

    assert tool_use["input"] == {"quantity": 1}


async def test_adding_a_product_named_from_the_catalogue_opens_its_page_then_adds_it():
    _, first = await run([user("add 3 charging docks to my cart", {"page": "catalog"})], CATALOGUE_PAGE)
    [opened] = first.tool_uses
    assert first.text == "Let me open that product first."
    assert opened["input"] == {"productId": "charging-dock"}

    dock_page = {**SPEAKER_PAGE, "productId": "charging-dock"}
    messages = [user("add 3 charging docks to my cart", {"page": "catalog"}), called(opened),
                result(opened, {"url": "/demo/products/charging-dock/"}, context=dock_page)]
    added = await calls(messages, PRODUCT_PAGE)
    assert (added["name"], added["input"]) == ("add_to_cart", {"quantity": 3})


async def test_adding_without_a_product_page_asks_which_product_by_name():
    answer = await said([user("add two to my cart", {"page": "catalog"})], CATALOGUE_PAGE)

    assert answer == ("Which product would you like? I can show you the pro headphones, "
                      "the travel speaker or the charging dock.")


async def test_pay_for_my_order_calls_the_critical_payment_tool_with_the_cart_total():
    tool_use = await calls([user("pay for my order", CART)], CART_PAGE)

    assert (tool_use["name"], tool_use["input"]) == ("process_payment", {"amount": 178.0})


async def test_paying_from_a_product_page_opens_the_cart_first_then_pays_its_total():
    _, first = await run([user("checkout please", SPEAKER_PAGE)], PRODUCT_PAGE)
    [opened] = first.tool_uses
    assert opened["name"] == "open_cart" and first.text == "Let me open your cart first."

    messages = [user("checkout please", SPEAKER_PAGE), called(opened),
                result(opened, {"url": "/demo/cart/"}, context=CART)]
    paid = await calls(messages, CART_PAGE)
    assert (paid["name"], paid["input"]) == ("process_payment", {"amount": 178.0})


async def test_a_coupon_named_by_its_code_is_applied_on_the_cart_page():
    tool_use = await calls([user("Please apply the coupon owl10", CART)], CART_PAGE)

    assert (tool_use["name"], tool_use["input"]) == ("apply_coupon", {"code": "OWL10"})


async def test_a_coupon_asked_for_from_a_product_page_opens_the_cart_first_then_is_applied():
    _, first = await run([user("use my coupon WELCOME5", SPEAKER_PAGE)], PRODUCT_PAGE)
    [opened] = first.tool_uses
    assert opened["name"] == "open_cart" and first.text == "Let me open your cart first."

    messages = [user("use my coupon WELCOME5", SPEAKER_PAGE), called(opened),
                result(opened, {"url": "/demo/cart/"}, context=CART)]
    applied = await calls(messages, CART_PAGE)
    assert (applied["name"], applied["input"]) == ("apply_coupon", {"code": "WELCOME5"})


async def test_a_coupon_without_its_code_is_asked_for():
    answer = await said([user("I have a discount coupon", CART)], CART_PAGE)

    assert answer == "Which coupon? Tell me its code too, and I'll apply it."


async def test_an_applied_coupon_is_told_with_what_it_takes_off():
    tool_use = await calls([user("apply coupon OWL10", CART)], CART_PAGE)
    messages = [user("apply coupon OWL10", CART), called(tool_use),
                result(tool_use, {"applied": True, "coupon": "OWL10", "label": "10% off your order"})]

    assert await said(messages, CART_PAGE) == "Coupon applied. 10% off your order (OWL10) now applies to your order."


async def test_an_unknown_coupon_is_told_with_the_stores_reason():
    tool_use = await calls([user("apply coupon NOPE99", CART)], CART_PAGE)
    messages = [user("apply coupon NOPE99", CART), called(tool_use),
                result(tool_use, "There is no coupon called 'NOPE99'.", error=True)]

    assert await said(messages, CART_PAGE) == "I could not apply that coupon. There is no coupon called 'NOPE99'."


async def test_an_empty_cart_is_not_paid():
    answer = await said([user("place the order", {**CART, "itemCount": 0, "total": 0.0})], CART_PAGE)

    assert answer == "Your cart is empty, so there is nothing to pay yet."


# --- tool results in words ----------------------------------------------------------------


PAYMENT = {"type": "tool_use", "id": "toolu_pay", "name": "process_payment", "input": {"amount": 178.0}}


async def test_an_approved_payment_is_told_with_its_order_number_and_a_closing_sentence():
    paid = {"paid": True, "orderId": "A1042", "amount": 178.0, "currency": "USD", "cart": {"itemCount": 0}}
    answer = await said([user("pay for my order", CART), called(PAYMENT), result(PAYMENT, paid)], CART_PAGE)

    assert answer == ("Your payment went through. Your order number is A1042, for 178.00 USD. "
                      "Thank you for shopping with us!")


async def test_a_declined_payment_says_nothing_was_charged():
    messages = [user("pay for my order", CART), called(PAYMENT),
                result(PAYMENT, "The user declined this action.", error=True)]

    assert await said(messages, CART_PAGE) == "You declined, so I did not make the payment. Nothing was charged."


async def test_an_added_product_is_told_with_the_cart_in_words():
    add = {"type": "tool_use", "id": "toolu_add", "name": "add_to_cart", "input": {"quantity": 2}}
    added = {"added": True, "productId": "travel-speaker", "quantity": 2, "cart": CART}
    answer = await said([user("add two", SPEAKER_PAGE), called(add), result(add, added)], PRODUCT_PAGE)

    assert answer == ("Done! I added 2 of the travel speaker to your cart. "
                      "Your cart now holds 2 items, 178.00 USD in total.")


async def test_a_tool_it_does_not_know_is_told_by_a_few_fields_never_as_json():
    lookup = {"type": "tool_use", "id": "toolu_x", "name": "order_status", "input": {}}
    answer = await said([user("hm", {}), called(lookup),
                         result(lookup, {"status": "paid", "total": 178.0, "lines": [{"a": 1}]})], [])

    assert answer == "Done. It reported status paid and total 178.0."


async def test_a_failed_tool_says_why_in_a_sentence():
    messages = [user("pay for my order", CART), called(PAYMENT),
                result(PAYMENT, "The amount $1.00 does not match the cart total $178.00.", error=True)]

    assert await said(messages, CART_PAGE) == (
        "I could not make the payment. The amount $1.00 does not match the cart total $178.00.")


# --- what it cannot do ----------------------------------------------------------------


async def test_deleting_an_account_is_refused_politely_with_what_it_can_do_instead():
    answer = await said([user("Please delete my account", CART)], CART_PAGE)

    assert answer.startswith("Sorry, I can't help with that: I'm only the demo assistant")
    assert "pay for your order once you approve it" in answer


async def test_asking_for_a_tool_the_page_does_not_offer_is_refused_politely():
    answer = await said([user("pay for my order", {})], [tool("read_news")])

    assert answer == ("Sorry, I can't make the payment from this page. "
                      "Here I can only chat, as this page offers me nothing to do.")


async def test_anything_else_says_it_is_a_demo_and_what_to_try():
    answer = await said([user("What's the weather like?", {"page": "catalog"})], CATALOGUE_PAGE)

    assert answer.startswith("I'm only the demo assistant, so I didn't understand that.")
    assert 'Try "show me the pro headphones" or "pay for my order".' in answer
    assert "ANTHROPIC_API_KEY" in answer


async def test_when_the_turn_allows_no_more_tools_it_answers_in_words():
    _, complete = await run([user("add two to my cart", SPEAKER_PAGE)], PRODUCT_PAGE,
                            tool_choice={"type": "none"})

    assert complete.tool_uses == [] and complete.stop_reason == "end_turn"
    assert complete.text == "I'll stop here for this message: ask me again to go on."


async def test_tools_of_another_page_are_found_by_the_words_of_their_names():
    basket = [tool("addToBasket", count={"type": "integer"}), tool("checkout", total={"type": "number"})]

    added = await calls([user("put five in my basket", {})], basket)
    paid = await calls([user("check out", {"total": 12.5})], basket)

    assert (added["name"], added["input"]) == ("addToBasket", {"count": 5})
    assert (paid["name"], paid["input"]) == ("checkout", {"total": 12.5})


@pytest.mark.parametrize(("messages", "tools"), [
    ([user("hi")], CATALOGUE_PAGE),
    ([user("what can you do?", SPEAKER_PAGE)], PRODUCT_PAGE),
    ([user("which tools do you have?", CART)], CART_PAGE),
    ([user("/tool", SPEAKER_PAGE)], PRODUCT_PAGE),
    ([user("show me your tools as JSON", CART)], CART_PAGE),
    ([user("delete my account")], CART_PAGE),
    ([user("add two to my cart", {"page": "catalog"})], CATALOGUE_PAGE),
    ([user("pay for my order", CART), called(PAYMENT), result(PAYMENT, {"paid": True, "cart": CART})], CART_PAGE),
    ([user("pay", CART), called(PAYMENT), result(PAYMENT, '{"error": {"code": 1}}', error=True)], CART_PAGE),
])
async def test_no_answer_reads_a_tool_catalogue_or_json_aloud(messages, tools):
    _, complete = await run(messages, tools)

    assert complete.text
    assert "{" not in complete.text and "/tool" not in complete.text
    assert not any(name in complete.text for name in EVERY_NAME)


# --- which backend answers ----------------------------------------------------------------


@pytest.mark.parametrize(("environment", "backend"), [
    ({}, "demo"),
    ({"OWLLAYER_LLM": "offline"}, "offline"),
])
def test_without_a_model_key_the_demo_answers_unless_the_offline_backend_is_asked_for(environment, backend):
    # Settings are read once, at start-up: a fresh interpreter reads them.
    env = {name: value for name, value in os.environ.items() if name not in ("OWLLAYER_LLM", "ANTHROPIC_API_KEY")}
    env.update(DJANGO_SETTINGS_MODULE="owllayer_site.settings", DJANGO_DEBUG="true", **environment)
    code = ("import django; django.setup(); import llm;"
            "print(llm.get_backend().name)")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True, cwd=os.getcwd())
    assert out.stdout.strip().splitlines()[-1] == backend
