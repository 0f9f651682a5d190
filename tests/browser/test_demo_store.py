"""The demo store end to end: real Chromium, a real daphne process, the page's
own client. The offline agent runs "/tool <name> {json}" commands; the
anthropic agent talks through the real SDK to the fake Messages API, which
plays the model. Each step's screenshot lands in test-artifacts/."""
from __future__ import annotations

import json
import re
import threading
from urllib.parse import quote

import pytest
from asgiref.sync import sync_to_async
from playwright.async_api import Page, WebSocketRoute, expect

from aitp import tenancy
from aitp.models import ToolCall
from tests.browser.conftest import eventually
from tests.browser.store_support import (
    answers,
    nothing_dropped,
    offered_tools,
    open_store,
    result_data,
    say,
    send,
    session_when,
    status,
    tool_calls,
    tool_names,
    tool_results,
)
from tests.support.fake_anthropic import (
    JsonPiece,
    StreamedMessage,
    TextBlock,
    ToolUseBlock,
    text_response,
    tool_use_response,
)

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def activity(page: Page):
    return page.locator("#owl-activity")


def tool_line(page: Page, name: str):
    return page.locator(f".owl-msg-tool[data-tool={name}]").last


def chat_entries(page: Page):
    return page.locator("#owl-messages > .owl-msg")


async def entry_texts(page: Page) -> list[str]:
    """What the chat shows, entry by entry, from the greeting on."""
    return [text.strip() for text in await chat_entries(page).all_inner_texts()]


async def fill_cart_by_hand(page: Page, product: str, quantity: int) -> None:
    """What a shopper does without the assistant: open the product, add, open the cart."""
    await page.get_by_role("link", name=product).first.click()
    await page.fill("#product-quantity", str(quantity))
    await page.click("#add-to-cart")
    await expect(page.locator("#cart-count")).to_have_text(str(quantity))
    await page.locator("header a[href='/demo/cart/']").click()
    await expect(page.locator("h1")).to_have_text("Your cart")


# --- the page and its tools (offline agent) ------------------------------------------


async def test_the_catalogue_connects_and_tells_the_server_its_page_and_tools(store, page, shot):
    await open_store(page, store)
    await shot("catalogue")

    session = await session_when(page, lambda row: row.current_url == "/demo/")
    assert session.title == "Owl Store"
    assert tool_names(session) == ["open_product", "open_cart"]
    assert [p["name"] for p in session.context["products"]] == [
        "Pro Headphones", "Travel Speaker", "Charging Dock"]
    await nothing_dropped(page)


async def test_the_offline_agent_explains_each_tool_with_the_parameters_it_takes(store, page, shot):
    await open_store(page, store)

    await say(page, "What can you do?")

    answer = answers(page).last
    await expect(answer.locator("li")).to_have_count(2)
    await expect(answer.locator("li", has_text="open_product")).to_contain_text(
        'open_product takes productId (one of "pro-headphones", "travel-speaker", "charging-dock", required)')
    await expect(answer.locator("li", has_text="open_cart")).to_contain_text("open_cart takes no arguments")
    # The one tool here that takes arguments, with one it accepts.
    await expect(answer.locator("p").last).to_have_text(
        'For example: /tool open_product {"productId": "pro-headphones"}')
    await shot("offline-help")


async def test_the_whole_journey_with_tool_commands(store, page, shot):
    from demo.order_tools import demo_tools_install

    await sync_to_async(demo_tools_install)(tenant=store.key.tenant)
    await open_store(page, store)

    answer = await say(page, '/tool open_product {"productId": "pro-headphones"}')
    assert "open_product succeeded" in answer
    await expect(page.locator("h1")).to_have_text("Pro Headphones")
    await shot("product-opened")

    await say(page, '/tool add_to_cart {"quantity": 2}')
    await expect(page.locator("#cart-count")).to_have_text("2")
    await shot("two-in-the-cart")

    await say(page, "/tool open_cart")
    await say(page, '/tool apply_coupon {"code": "OWL10"}')
    await expect(page.locator("#cart-total")).to_have_text("$269.98")
    await shot("coupon-applied")

    await send(page, '/tool process_payment {"amount": 269.98}')
    dialog = page.get_by_role("dialog")
    await expect(dialog.locator(".pay-amount")).to_have_text("$269.98")
    await shot("payment-approval")
    await dialog.get_by_role("button", name="Approve").click()

    await expect(page.locator("#order-confirmation")).to_contain_text("$269.98")
    await expect(answers(page).last).to_contain_text("process_payment succeeded")
    await expect(page.locator("#cart-count")).to_have_text("0")
    await shot("paid")

    # The shop's own order lookup knows the order just paid.
    number = (await page.locator("#order-confirmation").inner_text()).split()[3]
    answer = await say(page, f'/tool order_status {{"number": "{number}"}}')
    assert "Status: paid" in answer and "Total: 269.98" in answer
    await shot("order-status")
    for name in ["open_product", "add_to_cart", "open_cart", "apply_coupon", "process_payment"]:
        [call] = await tool_calls(name)
        assert call.status == ToolCall.Status.SUCCESS, name
    # One socket the whole way: the pages changed inside it.
    assert (await page.evaluate("window.__owl.connects")) == 1
    await nothing_dropped(page)


async def test_a_navigating_tool_answers_after_the_new_pages_tools_reach_the_server(store, page):
    await open_store(page, store)

    await say(page, '/tool open_product {"productId": "travel-speaker"}')

    assert page.url == f"{store.server.http_url}/demo/products/travel-speaker/"
    session = await session_when(
        page, lambda row: row.current_url == "/demo/products/travel-speaker/")
    assert sorted(tool_names(session)) == ["add_to_cart", "open_cart", "open_product"]
    assert session.context["price"] == 89.0
    sent = [(f["type"], f["payload"]) for f in await page.evaluate("window.__owl.sent")]
    result_at = next(i for i, (type_, payload) in enumerate(sent) if type_ == "TOOL_RESULT")
    assert sent[result_at - 1][0] == "CONTEXT_UPDATE"
    assert sent[result_at - 1][1]["url"] == "/demo/products/travel-speaker/"
    assert sent[result_at][1]["result"] == {
        "url": "/demo/products/travel-speaker/", "title": "Travel Speaker - Owl Store"}


async def test_the_agents_state_and_each_tool_call_show_while_they_happen(store, page, shot):
    await open_store(page, store)
    await say(page, '/tool open_product {"productId": "pro-headphones"}')
    await say(page, '/tool add_to_cart {"quantity": 1}')
    await expect(tool_line(page, "add_to_cart")).to_have_attribute("data-status", "success")
    await say(page, "/tool open_cart")

    await send(page, '/tool process_payment {"amount": 149.99}')

    await expect(activity(page)).to_have_attribute("data-activity", "approval")
    await expect(activity(page)).to_have_text("Waiting for you: approve or decline.")
    await expect(status(page)).to_have_text("waiting for your approval")
    await expect(tool_line(page, "process_payment")).to_have_attribute("data-status", "running")
    await expect(tool_line(page, "process_payment")).to_contain_text('amount 149.99')
    # The tool's line is in view, above the activity line, not under it.
    line = await tool_line(page, "process_payment").bounding_box()
    waiting = await activity(page).bounding_box()
    shown = await page.locator("#owl-messages").bounding_box()
    assert line["y"] + line["height"] <= waiting["y"]
    assert line["y"] >= shown["y"] and line["y"] + line["height"] <= shown["y"] + shown["height"]
    await shot("waiting-for-approval")
    await page.get_by_role("dialog").get_by_role("button", name="Decline").click()

    await expect(tool_line(page, "process_payment")).to_have_attribute("data-status", "denied")
    await expect(tool_line(page, "process_payment")).to_contain_text("you declined")
    await expect(activity(page)).to_have_attribute("data-activity", "idle")
    await expect(activity(page)).to_be_hidden()
    await expect(status(page)).to_have_text("connected")
    await shot("declined")


async def test_a_tool_that_fails_says_why_once_in_plain_words(store, page):
    await open_store(page, store)
    await say(page, '/tool open_product {"productId": "pro-headphones"}')
    await say(page, '/tool add_to_cart {"quantity": 1}')
    await say(page, "/tool open_cart")

    answer = await say(page, '/tool apply_coupon {"code": "FREESTUFF"}')

    await expect(tool_line(page, "apply_coupon")).to_have_attribute("data-status", "error")
    await expect(tool_line(page, "apply_coupon")).to_have_text('✗ apply_coupon (code "FREESTUFF") failed')
    # The reason is told once: the answer says it, so the tool's line does not.
    assert answer == "apply_coupon failed: There is no coupon called 'FREESTUFF'."
    await expect(chat_entries(page).filter(has_text="There is no coupon called")).to_have_count(1)
    [call] = await tool_calls("apply_coupon")
    assert call.status == ToolCall.Status.ERROR


async def test_a_payment_for_the_wrong_amount_shows_the_cart_total_and_charges_nothing(store, page):
    await open_store(page, store)
    await fill_cart_by_hand(page, "Charging Dock", 2)

    await send(page, '/tool process_payment {"amount": 10}')
    dialog = page.get_by_role("dialog")
    await expect(dialog.locator(".pay-amount")).to_have_text("$10.00")
    await expect(dialog.locator(".pay-mismatch")).to_have_text("This is not your cart total ($79.00).")
    await dialog.get_by_role("button", name="Approve").click()

    await expect(answers(page).last).to_have_text(
        "process_payment failed: The amount $10.00 does not match the cart total $79.00.")
    await expect(tool_line(page, "process_payment")).to_have_attribute("data-status", "error")
    await expect(chat_entries(page).filter(has_text="does not match the cart total")).to_have_count(1)
    await expect(page.locator("#cart-total")).to_have_text("$79.00")
    [call] = await tool_calls("process_payment")
    assert call.status == ToolCall.Status.ERROR


async def test_what_the_shopper_does_by_hand_reaches_the_agents_context(store, page):
    await open_store(page, store)

    await fill_cart_by_hand(page, "Travel Speaker", 3)
    await page.fill("#coupon-code", "welcome5")
    await page.click("form.coupon button")
    await expect(page.locator("#cart-total")).to_have_text("$262.00")

    session = await session_when(page, lambda row: row.context.get("total") == 262.0)
    assert session.current_url == "/demo/cart/"
    assert session.context["coupon"]["code"] == "WELCOME5"
    assert sorted(tool_names(session)) == [
        "apply_coupon", "open_product", "process_payment", "set_quantity"]


async def test_the_cart_survives_a_reload_and_the_reloaded_page_connects_on_its_own(store, page):
    await open_store(page, store)
    await fill_cart_by_hand(page, "Pro Headphones", 2)

    await page.reload()

    await expect(status(page)).to_have_text("connected")
    await expect(page.locator("#cart-count")).to_have_text("2")
    session = await session_when(page, lambda row: row.current_url == "/demo/cart/")
    assert session.context["items"][0]["quantity"] == 2


async def test_a_server_tool_that_needs_approval_asks_in_the_page(store, page):
    from demo.models import DemoOrder
    from demo.order_tools import demo_tools_install

    await sync_to_async(demo_tools_install)(tenant=store.key.tenant)
    await open_store(page, store)

    await send(page, '/tool cancel_order {"number": "A1003"}')
    dialog = page.get_by_role("dialog")
    await expect(dialog).to_contain_text("cancel_order")
    await expect(activity(page)).to_have_attribute("data-activity", "approval")
    await dialog.get_by_role("button", name="Approve").click()

    await expect(answers(page).last).to_contain_text("cancel_order succeeded")
    order = await DemoOrder.objects.aget(tenant=store.key.tenant, number="A1003")
    assert order.status == DemoOrder.Status.CANCELLED
    await nothing_dropped(page)


async def test_an_origin_the_key_does_not_allow_is_explained_and_not_retried(store, page, shot):
    _, raw_key = await sync_to_async(tenancy.key_create)(
        tenant=store.key.tenant, name="elsewhere", allowed_origins=["https://shop.example"]
    )

    await page.goto(f"{store.server.http_url}/demo/?apiKey={quote(raw_key, safe='')}")

    await expect(status(page)).to_have_text("error")
    await expect(page.locator(".owl-msg-error")).to_have_text(
        "This page's origin is not allowed to use the assistant key.")
    await shot("refused")
    owl = await page.evaluate("window.__owl")
    assert [close["code"] for close in owl["closes"]] == [1008]
    assert owl["retryInMs"] is None
    assert owl["connects"] == 1
    await expect(page.locator("#owl-send")).to_be_disabled()


async def test_the_page_reconnects_by_itself_when_the_server_comes_back(store, page, shot):
    await open_store(page, store)
    first_session = await page.evaluate("window.__owl.sessionId")

    await sync_to_async(store.server.stop)()
    await expect(status(page)).to_have_text("reconnecting")
    await expect(page.locator(".owl-msg-note").last).to_have_text(
        "Lost the connection to the assistant. Reconnecting…")
    await shot("server-down")
    await sync_to_async(store.restart)()

    # The client retries after 2 s, 4 s, ...: the first retry after the
    # restart gets through.
    await expect(status(page)).to_have_text("connected", timeout=30_000)
    await expect(page.locator(".owl-msg-note").last).to_have_text("Reconnected: the conversation goes on.")
    await shot("reconnected")
    assert await page.evaluate("window.__owl.sessionId") == first_session
    answer = await say(page, '/tool open_product {"productId": "charging-dock"}')
    assert "open_product succeeded" in answer


async def test_after_a_handshake_that_timed_out_the_page_reconnects_and_asks_for_typing_again(
        store, page, shot):
    sockets = []

    def nobody_answers_the_first(ws: WebSocketRoute) -> None:
        sockets.append(ws)
        if len(sockets) > 1:
            ws.connect_to_server()

    await page.route_web_socket(re.compile(r"/owllayer\?"), nobody_answers_the_first)
    await page.goto(store.url)
    await expect(page.locator(".owl-msg-error")).to_have_text("Handshake timeout")

    # The client retries by itself; the second socket reaches the server.
    await expect(status(page)).to_have_text("connected", timeout=30_000)
    await expect(page.locator("#owl-input")).to_be_enabled()
    await expect(page.locator("#owl-input")).to_have_attribute("placeholder", re.compile("^Try /tool"))
    await shot("reconnected-after-a-timeout")
    answer = await say(page, "/tool open_cart")
    assert answer.startswith("open_cart succeeded.")


# --- the anthropic agent (the fake Messages API plays the model) -----------------------


async def test_asked_for_a_product_the_agent_opens_it_and_adds_two_to_the_cart(
        llm_store, model, page, shot):
    model.enqueue(
        tool_use_response([("open_product", {"productId": "travel-speaker"})],
                          text="Let me open the Travel Speaker."),
        tool_use_response([("add_to_cart", {"quantity": 2})]),
        text_response("Two Travel Speakers are in your cart.", chunks=4),
    )
    await open_store(page, llm_store)
    await shot("asking")

    answer = await say(page, "I'd like two of the travel speakers, please")

    assert answer == "Two Travel Speakers are in your cart."
    # The words before the calls, each call's line, then the answer: in that order.
    assert (await entry_texts(page))[-4:] == [
        "Let me open the Travel Speaker.",
        '✓ open_product (productId "travel-speaker") done',
        "✓ add_to_cart (quantity 2) done",
        "Two Travel Speakers are in your cart.",
    ]
    await expect(page.locator("#cart-count")).to_have_text("2")
    await expect(page.locator("h1")).to_have_text("Travel Speaker")
    await shot("two-in-the-cart")
    first, second, third = model.requests
    # The catalogue offered no add_to_cart; after the navigation the product
    # page's tools took over, before the model's next step.
    assert "add_to_cart" not in offered_tools(first)
    assert "add_to_cart" in offered_tools(second)
    assert result_data(tool_results(second)[0])["url"] == "/demo/products/travel-speaker/"
    assert result_data(tool_results(third)[0])["cart"]["itemCount"] == 2
    await nothing_dropped(page)


def payment_outcome(request: dict):
    """The model's last word after process_payment: what its tool result said."""
    [result] = tool_results(request)
    if result.get("is_error"):
        return text_response(f"I did not pay: {result['content']}")
    paid = result_data(result)
    return text_response(f"Paid ${paid['amount']:.2f}, order {paid['orderId']}.")


async def ask_to_pay(page: Page, llm_store, model, amount: float) -> None:
    model.enqueue(
        tool_use_response([("process_payment", {"amount": amount})], text="Paying now."),
    )
    model.responder = payment_outcome
    await open_store(page, llm_store)
    await fill_cart_by_hand(page, "Pro Headphones", 2)
    await send(page, "Please pay for my cart")


async def test_asked_to_pay_the_agent_asks_first_and_pays_once_approved(llm_store, model, page, shot):
    await ask_to_pay(page, llm_store, model, 299.98)

    dialog = page.get_by_role("dialog")
    await expect(dialog.locator(".pay-amount")).to_have_text("$299.98")
    await expect(dialog).to_contain_text("2 × Pro Headphones")
    await shot("approval")
    await dialog.get_by_role("button", name="Approve").click()

    await expect(page.locator("#order-confirmation")).to_contain_text("$299.98")
    await expect(answers(page).last).to_contain_text("Paid $299.98, order A")
    await shot("paid")
    [call] = await tool_calls("process_payment")
    assert call.status == ToolCall.Status.SUCCESS
    assert call.result["paid"] is True


async def test_asked_to_pay_a_declined_payment_is_never_made_and_the_agent_says_so(
        llm_store, model, page, shot):
    await ask_to_pay(page, llm_store, model, 299.98)

    dialog = page.get_by_role("dialog")
    await expect(dialog.locator(".pay-amount")).to_have_text("$299.98")
    await dialog.get_by_role("button", name="Decline").click()

    await expect(answers(page).last).to_contain_text("I did not pay: The user declined this action.")
    await shot("declined")
    await expect(page.locator("#order-confirmation")).to_have_count(0)
    await expect(page.locator("#cart-total")).to_have_text("$299.98")
    [call] = await tool_calls("process_payment")
    assert call.status == ToolCall.Status.DENIED
    assert call.result is None
    [last] = model.requests[-1:]
    assert tool_results(last)[0]["is_error"] is True


# --- the chat panel: Markdown, a reload, the end of a session, its size -------------------

HOSTILE_ANSWER = (
    "Your total is **$269.98** with `OWL10` applied.\n\n"
    "- Pro Headphones × 2\n"
    "- *free* shipping\n\n"
    "See [our returns page](https://example.com/returns) or [claim a prize](javascript:window.__owned=1). "
    '<img src=x onerror="window.__owned=2"><script>window.__owned=3</script>'
)


async def test_the_agents_markdown_is_shown_formatted_and_never_as_html(llm_store, model, page, shot):
    model.enqueue(text_response(HOSTILE_ANSWER, chunks=5))
    await open_store(page, llm_store)

    await say(page, "What will I pay?")

    answer = answers(page).last
    await expect(answer.locator("strong")).to_have_text("$269.98")
    await expect(answer.locator("code")).to_have_text("OWL10")
    await expect(answer.locator("li")).to_have_text(["Pro Headphones × 2", "free shipping"])
    await expect(answer.locator("li em")).to_have_text("free")
    # Only the https link is a link; the javascript: one is its label alone.
    await expect(answer.locator("a")).to_have_count(1)
    await expect(answer.locator("a")).to_have_attribute("href", "https://example.com/returns")
    await expect(answer).to_contain_text("claim a prize.")
    # The model's HTML is shown as the characters it is, never made into elements.
    await expect(page.locator("#owl-messages img, #owl-messages script")).to_have_count(0)
    await expect(answer).to_contain_text('<img src=x onerror="window.__owned=2">')
    assert await page.evaluate("window.__owned") is None
    await shot("markdown-answer")


async def test_a_reload_keeps_the_conversation_on_the_page_and_the_session_goes_on(store, page, shot):
    await open_store(page, store)
    await say(page, '/tool open_product {"productId": "charging-dock"}')
    before = await entry_texts(page)
    first_session = await page.evaluate("window.__owl.sessionId")

    await page.reload()

    await expect(status(page)).to_have_text("connected")
    await expect(chat_entries(page)).to_have_count(len(before) + 1)
    assert (await entry_texts(page))[:len(before)] == before
    await expect(chat_entries(page).last).to_have_text(
        "The page was reloaded: the assistant goes on with the conversation above.")
    await shot("reloaded")
    assert await page.evaluate("window.__owl.sessionId") == first_session
    answer = await say(page, "/tool open_cart")
    assert answer.startswith("open_cart succeeded.")


async def test_a_tab_opened_with_a_copy_of_the_first_takes_the_conversation_and_the_first_says_so(
        store, page, shot):
    await open_store(page, store)
    await say(page, '/tool open_product {"productId": "charging-dock"}')
    session_id = await page.evaluate("window.__owl.sessionId")
    # A duplicated tab starts with a copy of the first one's sessionStorage.
    storage = await page.evaluate("JSON.stringify(Object.assign({}, sessionStorage))")
    second = await page.context.new_page()
    await second.add_init_script(
        f"Object.entries(JSON.parse({json.dumps(storage)})).forEach(([k, v]) => sessionStorage.setItem(k, v));")

    await second.goto(page.url)

    await expect(status(second)).to_have_text("connected")
    assert await second.evaluate("window.__owl.sessionId") == session_id
    await expect(page.locator(".owl-msg-note").last).to_have_text(
        "This conversation goes on in another tab or window.")
    await expect(status(page)).to_have_text("closed")
    await expect(page.locator("#owl-input")).to_be_disabled()
    await shot("first-tab-let-go")
    answer = await say(second, "/tool open_cart")
    assert answer.startswith("open_cart succeeded.")
    await second.close()


async def test_after_a_reload_the_model_is_asked_with_what_was_said_before(llm_store, model, page, shot):
    model.enqueue(text_response("Nice to meet you, Ada."), text_response("You are Ada."))
    await open_store(page, llm_store)
    assert await say(page, "My name is Ada.") == "Nice to meet you, Ada."

    await page.reload()
    await expect(chat_entries(page).last).to_have_text(
        "The page was reloaded: the assistant goes on with the conversation above.")
    answer = await say(page, "What is my name?")

    assert answer == "You are Ada."
    await shot("remembered")
    said = [block["text"] for message in model.requests[-1]["messages"] for block in message["content"]
            if block["type"] == "text" and not block["text"].startswith("[page]")]
    assert said == ["My name is Ada.", "Nice to meet you, Ada.", "What is my name?"]
    assert (await entry_texts(page)).count("Nice to meet you, Ada.") == 1
    await nothing_dropped(page)


async def test_a_tab_that_kept_none_of_the_conversation_draws_it_from_the_server_after_a_reload(
        llm_store, model, page, shot):
    model.enqueue(text_response("Nice to meet you, Ada."), text_response("You are Ada."))
    await open_store(page, llm_store)
    assert await say(page, "My name is Ada.") == "Nice to meet you, Ada."
    greeting = (await entry_texts(page))[0]
    # The tab's own copy is gone (a cleared or refused storage); the token is kept.
    await page.evaluate("sessionStorage.removeItem('owl-demo-transcript'); sessionStorage.removeItem('owl-demo-turn')")

    await page.reload()

    await expect(chat_entries(page)).to_have_count(3)
    assert await entry_texts(page) == [greeting, "My name is Ada.", "Nice to meet you, Ada."]
    await shot("drawn-from-the-server")
    assert await say(page, "What is my name?") == "You are Ada."
    assert (await entry_texts(page))[1:] == ["My name is Ada.", "Nice to meet you, Ada.", "What is my name?",
                                             "You are Ada."]
    await nothing_dropped(page)


async def test_a_later_visit_shows_the_last_conversation_and_the_assistant_remembers_it(
        llm_store, model, page):
    model.enqueue(text_response("Nice to meet you, Ada."), text_response("You are Ada."))
    await open_store(page, llm_store)
    assert await say(page, "My name is Ada.") == "Nice to meet you, Ada."
    first_session = await page.evaluate("window.__owl.sessionId")
    greeting = (await entry_texts(page))[0]
    await page.close()

    # A new tab of the same browser: a new session, the same visitor.
    later = await page.context.new_page()
    await open_store(later, llm_store)

    await expect(chat_entries(later)).to_have_count(4)
    shown = await entry_texts(later)
    assert shown[0] == greeting and shown[2:] == ["My name is Ada.", "Nice to meet you, Ada."]
    assert re.fullmatch(r"Your last conversation, \d{1,2} \w{3} \d{4}, \d\d:\d\d UTC\. "
                        r"The assistant remembers what you asked then\.", shown[1]), shown[1]
    assert await later.evaluate("window.__owl.sessionId") != first_session
    assert await say(later, "What is my name?") == "You are Ada."
    system = model.requests[-1]["system"][0]["text"]
    assert '"My name is Ada."' in system
    await nothing_dropped(later)


# A long answer the model writes slowly: word00 ... word79, one word a delta.
WORDS = [f"word{number:02d}" for number in range(80)]
WORD_DELTAS = [WORDS[0]] + [" " + word for word in WORDS[1:]]
LONG_ANSWER = "".join(WORD_DELTAS)
# The stream waits after this many deltas (after message_start,
# content_block_start and the first ping) until the test lets it go on.
DELTAS_BEFORE_THE_RELOAD = 20


class HeldMessages:
    """Routes a page's socket to the server, holding what the page sends until let_go()."""

    def __init__(self) -> None:
        self.held: list[str | bytes] = []
        self.server: WebSocketRoute | None = None
        self.going = False

    def route(self, ws: WebSocketRoute) -> None:
        self.server = ws.connect_to_server()
        ws.on_message(self.to_server)

    def to_server(self, message: str | bytes) -> None:
        if self.going:
            self.server.send(message)
        else:
            self.held.append(message)

    def let_go(self) -> None:
        self.going = True
        for message in self.held:
            self.server.send(message)


def spoken(request: dict) -> list[str]:
    """The conversation's text blocks in a Messages API request, without the page's."""
    return [block["text"] for message in request["messages"] for block in message["content"]
            if block["type"] == "text" and not block["text"].startswith("[page]")]


async def test_a_reload_mid_answer_completes_the_answer_once_shows_it_once_and_the_next_question_has_its_context(
        llm_store, model, page, shot):
    go_on = threading.Event()
    model.enqueue(
        StreamedMessage(blocks=[TextBlock(WORD_DELTAS)], event_delay=0.05, hold=go_on,
                        hold_after_events=3 + DELTAS_BEFORE_THE_RELOAD),
        text_response("The last word was word79."),
    )
    await open_store(page, llm_store)
    await send(page, "Tell me eighty words.")
    before = "".join(WORD_DELTAS[:DELTAS_BEFORE_THE_RELOAD])
    await expect(page.locator(".owl-msg-agent").last).to_have_text(before)
    await shot("half-an-answer")

    # The model goes on while the page reloads: some of what it writes reaches
    # no page, the rest reaches the reloaded one.
    go_on.set()
    await page.reload()

    await expect(answers(page)).to_have_count(1)
    await expect(answers(page)).to_have_text(LONG_ANSWER)
    await expect(page.locator(".owl-msg-note").last).to_have_text(
        "The page was reloaded: the assistant goes on with the conversation above and finishes its answer.")
    await expect(activity(page)).to_have_attribute("data-activity", "idle")
    await shot("the-whole-answer")
    texts = await entry_texts(page)
    assert texts[1:3] == ["Tell me eighty words.", LONG_ANSWER]
    assert sum("word00" in text for text in texts) == 1
    # The reloaded page took up where the earlier one had got to: its ACK
    # carries the number of the last frame handled, and the rest of the
    # answer came after it, numbered on from there.
    frames = await page.evaluate("window.__owl.frames")
    assert frames[0]["type"] == "HANDSHAKE_ACK" and frames[0]["payload"]["resumed"] is True
    start = frames[0]["meta"]["seq"]
    assert start > 0
    numbers = [f["meta"]["seq"] for f in frames[1:]]
    assert numbers == list(range(start + 1, start + 1 + len(numbers)))
    assert any(f["type"] == "AGENT_RESPONSE" and not f["payload"]["done"] for f in frames)
    assert await page.evaluate("window.__owl.repeated") == 0

    answer = await say(page, "Which word came last?")

    assert answer == "The last word was word79."
    assert len(model.requests) == 2
    assert spoken(model.requests[-1]) == ["Tell me eighty words.", LONG_ANSWER, "Which word came last?"]
    assert (await entry_texts(page)).count(LONG_ANSWER) == 1
    await nothing_dropped(page)


async def test_a_tool_call_made_while_the_page_reloads_is_run_once_by_the_reloaded_page(
        llm_store, model, page, shot):
    go_on = threading.Event()
    model.enqueue(
        # The words before the call, then the stream waits before the call.
        StreamedMessage(blocks=[TextBlock(["Let me ", "open ", "your cart."]),
                                ToolUseBlock("toolu_fake_cart", "open_cart", {}, [JsonPiece("{}")])],
                        stop_reason="tool_use", hold=go_on, hold_after_events=3 + 3),
        text_response("Here is your cart."),
    )
    await open_store(page, llm_store)
    await send(page, "Show me my cart.")
    await expect(page.locator(".owl-msg-agent").last).to_have_text("Let me open your cart.")

    # The reloaded page's handshake waits until the call was made: the
    # server sends it to no socket, then again to the new one.
    handshake = HeldMessages()
    await page.route_web_socket(re.compile(r"/owllayer\?"), handshake.route)
    await page.reload()
    await eventually(lambda: handshake.held, what="the reloaded page's handshake")
    go_on.set()
    await eventually(lambda: ToolCall.objects.filter(name="open_cart").aexists(), what="the call")
    handshake.let_go()

    await expect(answers(page)).to_have_text(["Here is your cart."])
    await expect(page.locator("h1")).to_have_text("Your cart")
    await expect(page.locator(".owl-msg-tool[data-tool=open_cart]")).to_have_count(1)
    await expect(tool_line(page, "open_cart")).to_have_attribute("data-status", "success")
    await shot("the-call-after-the-reload")
    assert (await entry_texts(page))[1:] == [
        "Show me my cart.", "Let me open your cart.",
        "The page was reloaded: the assistant goes on with the conversation above and finishes its answer.",
        "✓ open_cart done", "Here is your cart."]
    [call] = await tool_calls("open_cart")
    assert call.status == ToolCall.Status.SUCCESS
    assert [f["type"] for f in await page.evaluate("window.__owl.frames")].count("TOOL_CALL") == 1
    [result] = tool_results(model.requests[-1])
    assert result_data(result)["url"] == "/demo/cart/"
    await nothing_dropped(page)


class LosesAQuestion:
    """Routes a page's sockets to the server; once ``losing``, the next
    question (USER_INPUT) is lost on its way, as a network that drops takes it."""

    def __init__(self) -> None:
        self.losing = False
        self.lost: list[dict] = []
        self.questions: list[dict] = []

    def route(self, ws: WebSocketRoute) -> None:
        server = ws.connect_to_server()

        def to_server(message: str | bytes) -> None:
            sent = json.loads(message) if isinstance(message, str) else {}
            if sent.get("type") == "USER_INPUT":
                if self.losing:
                    self.losing = False
                    self.lost.append(sent)
                    return
                self.questions.append(sent)
            server.send(message)

        ws.on_message(to_server)


@pytest.fixture(params=["held", "not-held"])
def holding_store(request, daphne_factory):
    """The store (offline agent) on a process that holds a session past its
    socket (protocol.md §3a), or one that does not (the session goes on
    from the database)."""
    from tests.browser.conftest import print_logs, start_store

    env = {"OWLLAYER_LLM": "offline"}
    if request.param == "not-held":
        env["OWLLAYER_RESUME_HOLD_SECONDS"] = "0"
    started = start_store(daphne_factory, env)
    started.held = request.param == "held"
    yield started
    print_logs(started)


async def test_a_question_lost_on_its_way_just_before_a_reload_is_asked_again_and_answered_once(
        holding_store, page, shot):
    network = LosesAQuestion()
    await page.route_web_socket(re.compile(r"/owllayer\?"), network.route)
    await open_store(page, holding_store)
    await say(page, '/tool open_product {"productId": "charging-dock"}')
    network.losing = True
    await send(page, "/tool open_cart")
    await eventually(lambda: network.lost, what="the question lost on its way")
    [lost] = network.lost

    await page.reload()

    if holding_store.held:
        # The session goes on: the reloaded page sends the question again, as it was.
        await expect(answers(page)).to_have_count(2)
        await expect(page.locator("h1")).to_have_text("Your cart")
        await expect(activity(page)).to_have_attribute("data-activity", "idle")
        await shot("asked-again-after-the-reload")
        texts = await entry_texts(page)
        # The question once, then its answer once.
        assert texts[4:7] == [
            "/tool open_cart",
            "The page was reloaded: the assistant goes on with the conversation above and answers "
            "your last question.",
            "✓ open_cart done"]
        assert texts[7].startswith("open_cart succeeded.") and len(texts) == 8
        ack = (await page.evaluate("window.__owl.frames"))[0]
        assert ack["type"] == "HANDSHAKE_ACK" and ack["payload"]["resumed"] is True
        # It named the question the session took last: the one before.
        assert ack["meta"]["lastInput"] == network.questions[0]["id"]
        assert network.questions[1] == lost
        assert len(await tool_calls("open_cart")) == 1
    else:
        # A session that does not take up where the page was: nothing is sent
        # again, a note says so and the question waits in the input.
        await expect(page.locator(".owl-msg-note").last).to_have_text(
            "Your last question was not answered. Please ask it again.")
        await expect(status(page)).to_have_text("connected")
        await expect(activity(page)).to_have_attribute("data-activity", "idle")
        await expect(page.locator("#owl-input")).to_have_value("/tool open_cart")
        await shot("not-answered-after-the-reload")
        assert network.questions[1:] == []
        await page.press("#owl-input", "Enter")
        await expect(answers(page)).to_have_count(2)
        await expect(page.locator("h1")).to_have_text("Your cart")
        assert network.questions[1]["id"] != lost["id"]
        assert len(await tool_calls("open_cart")) == 1
    assert await page.evaluate("window.__owl.unanswered") == (0 if holding_store.held else 1)
    await nothing_dropped(page)


async def test_when_an_operator_ends_the_session_the_goodbye_is_a_notice_and_typing_stops(
        store, page, shot):
    import httpx

    from tests.support.people import admin_sign_in, make_user

    def operator() -> None:
        user = make_user("olga", tenant=store.key.tenant)
        user.set_password("pw-olga-123")
        user.save()

    await sync_to_async(operator)()
    await open_store(page, store)
    session_id = await page.evaluate("window.__owl.sessionId")

    async with httpx.AsyncClient(base_url=store.server.http_url) as http:
        await admin_sign_in(http, "olga", "pw-olga-123")
        sent = await http.post(f"/admin/live/{session_id}/command/", data={
            "command": "end", "message": "Thanks for shopping with us. Goodbye!",
            "csrfmiddlewaretoken": http.cookies["csrftoken"]})
        assert sent.status_code == 302

    await expect(status(page)).to_have_text("closed")
    await expect(page.locator(".owl-msg-note").last).to_have_text("Thanks for shopping with us. Goodbye!")
    await expect(page.locator("#owl-messages .owl-msg-error")).to_have_count(0)
    await expect(page.locator("#owl-input")).to_be_disabled()
    await expect(page.locator("#owl-send")).to_be_disabled()
    await shot("ended-by-an-operator")


async def test_the_panel_minimises_to_a_launcher_and_opens_again(store, page, shot):
    await open_store(page, store)
    launcher = page.get_by_role("button", name="Ask the shop assistant")
    await expect(launcher).to_be_hidden()

    await page.get_by_role("button", name="Minimise the assistant").click()

    await expect(page.locator("#owl-chat")).to_be_hidden()
    await expect(launcher).to_be_visible()
    await shot("minimised")
    # Minimised, the assistant is still connected; the choice outlives a reload.
    await page.reload()
    await expect(status(page)).to_have_text("connected")
    await expect(page.locator("#owl-chat")).to_be_hidden()

    await launcher.click()

    await expect(page.locator("#owl-chat")).to_be_visible()
    await expect(page.locator("#owl-input")).to_be_focused()
    await expect(launcher).to_be_hidden()


async def test_on_a_phone_the_panel_opens_over_the_page_and_can_be_used(store, page, shot):
    await page.set_viewport_size({"width": 390, "height": 844})
    await open_store(page, store)
    launcher = page.get_by_role("button", name="Ask the shop assistant")
    # Closed at first: the store is what a shopper came for.
    await expect(page.locator("#owl-chat")).to_be_hidden()
    await shot("phone-closed")

    await launcher.click()

    panel = await page.locator("#owl-chat").bounding_box()
    assert panel["x"] >= 0 and panel["x"] + panel["width"] <= 390
    assert panel["y"] >= 0 and panel["y"] + panel["height"] <= 844
    answer = await say(page, '/tool open_product {"productId": "travel-speaker"}')
    assert answer.startswith("open_product succeeded.")
    await expect(page.locator("#owl-input")).to_be_in_viewport()
    await shot("phone-open")


# --- the demo's own key (.demo-key) refused ---------------------------------------------

NEW_DEMO_KEY = (", so the assistant is off. To get a new key, stop the server (Ctrl-C where make run is "
                "running) and run make run again, then reload this page.")


@pytest.fixture
def demo_key_store(daphne_factory, tmp_path):
    """The store whose key is the demo's own: saved in the key file the server
    reads (OWLLAYER_DEMO_KEY_FILE), as `make run` leaves it; pages open /demo/."""
    from tests.browser.conftest import print_logs, start_store

    key_file = tmp_path / ".demo-key"
    started = start_store(daphne_factory, {"OWLLAYER_LLM": "offline",
                                           "OWLLAYER_DEMO_KEY_FILE": str(key_file)})
    key_file.write_text(started.raw_key + "\n")
    yield started
    print_logs(started)


def stop_the_key(key, how: str) -> None:
    from datetime import timedelta

    from django.utils import timezone

    if how == "expired":
        tenancy.key_update(key=key, changes={"expires_at": timezone.now() - timedelta(minutes=1)})
    else:
        tenancy.key_update(key=key, changes={"status": how})


@pytest.mark.parametrize("how, said", [
    ("revoked", "This demo's key was revoked"),
    ("disabled", "This demo's key is disabled"),
    ("expired", "This demo's key has expired"),
])
async def test_a_demo_key_that_no_longer_works_is_explained_with_how_to_get_a_new_one(
        demo_key_store, page, shot, how, said):
    await sync_to_async(stop_the_key)(demo_key_store.key, how)

    await page.goto(f"{demo_key_store.server.http_url}/demo/")

    await expect(status(page)).to_have_text("error")
    await expect(page.locator(".owl-msg-error")).to_have_text(said + NEW_DEMO_KEY)
    await shot(f"demo-key-{how}")


async def test_a_key_of_ones_own_that_was_revoked_is_not_told_to_run_make_run(store, page):
    await sync_to_async(tenancy.key_revoke)(key=store.key)

    await page.goto(store.url)

    await expect(page.locator(".owl-msg-error")).to_have_text(
        "This store's assistant key was revoked, so the assistant is off.")


async def test_revoking_the_demo_key_in_the_console_warns_first_and_the_open_store_says_how_to_recover(
        demo_key_store, page, shot, browser):
    from tests.support.people import make_user

    def owner() -> None:
        user = make_user("olga", tenant=demo_key_store.key.tenant, staff=False)
        user.set_password("pw-olga-123")
        user.save()

    await sync_to_async(owner)()
    await page.goto(f"{demo_key_store.server.http_url}/demo/")
    await expect(status(page)).to_have_text("connected")

    console = await (await browser.new_context()).new_page()
    await console.goto(f"{demo_key_store.server.http_url}/console/login/")
    await console.fill("input[name=username]", "olga")
    await console.fill("input[name=password]", "pw-olga-123")
    await console.click("button[type=submit]")
    await console.goto(f"{demo_key_store.server.http_url}/console/t/owl-store/keys/"
                       f"{demo_key_store.key.pk}/revoke/")
    await expect(console.locator("[data-demo-key]")).to_contain_text("This is the demo store's key.")
    await console.screenshot(path=str((await shot("store-before")).with_name("console-warning.png")),
                             full_page=True)
    await console.get_by_role("button", name="Revoke this key").click()

    await expect(page.locator(".owl-msg-error")).to_have_text("This demo's key was revoked" + NEW_DEMO_KEY)
    await expect(page.locator("#owl-input")).to_be_disabled()
    await shot("store-after-the-revoke")
