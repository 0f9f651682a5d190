"""The demo store end to end: real Chromium, a real daphne process, the
widget the store carries (the drop-in any tenant pastes; the store's own
script only offers each page's tools through window.OwlLayer). The offline
agent runs "/tool <name> {json}" commands; the anthropic agent talks through
the real SDK to the fake Messages API, which plays the model. Each step's
screenshot lands in test-artifacts/."""
from __future__ import annotations

import asyncio
import re
from urllib.parse import quote

import pytest
from asgiref.sync import sync_to_async
from playwright.async_api import Locator, Page, Route, WebSocketRoute, expect

from aitp import tenancy
from aitp.models import ToolCall
from tests.browser.store_support import (
    WIDGET,
    answers,
    approval,
    chat_input,
    ended_line,
    idle,
    launcher,
    notes,
    nothing_dropped,
    offered_tools,
    open_panel,
    open_store,
    result_data,
    say,
    send,
    session_when,
    status,
    tool_calls,
    tool_line,
    tool_names,
    tool_results,
    widget_error,
    wire,
)
from tests.support.fake_anthropic import text_response, tool_use_response

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

PAID_TO = ("Paid to", "Owl Store")
CARD = ("Card", "Your saved Visa ending 4242")


def conversation(page: Page) -> Locator:
    """Everything the widget's log shows, entry by entry: bubbles, notes, tool lines."""
    return page.locator(f"{WIDGET} .log > *")


def panel(page: Page) -> Locator:
    return page.locator(f"{WIDGET} section.panel")


def send_button(page: Page) -> Locator:
    return page.locator(f"{WIDGET} .send")


def demo_notice(page: Page) -> Locator:
    """The store page's own word when the demo's key is refused (beside the widget's)."""
    return page.locator("#assistant-notice")


async def clear_of_the_panel(page: Page, what: Locator) -> None:
    """``what`` is on show beside the widget's open panel, not under it."""
    box, over = await what.bounding_box(), await panel(page).bounding_box()
    assert box is not None and over is not None
    apart = (box["x"] + box["width"] <= over["x"] or over["x"] + over["width"] <= box["x"]
             or box["y"] + box["height"] <= over["y"] or over["y"] + over["height"] <= box["y"])
    assert apart, (box, over)


async def expect_rows(dialog: Locator, rows: list[tuple[str, str]]) -> None:
    """The approval dialog's details, label and value, in order."""
    await expect(dialog.locator("dl dt")).to_have_text([label for label, _ in rows])
    await expect(dialog.locator("dl dd")).to_have_text([value for _, value in rows])


async def expect_payment_question(dialog: Locator, amount: str) -> None:
    await expect(dialog.locator("h2")).to_have_text("Approve this action?")
    await expect(dialog.locator("#owl-approval-what")).to_have_text("Pay for your cart with your saved card.")
    await expect(dialog.get_by_text(f"Pay {amount} with your saved card?", exact=True)).to_be_visible()


async def fill_cart_by_hand(page: Page, product: str, quantity: int) -> None:
    """What a shopper does without the assistant: open the product, add, open the cart."""
    await page.get_by_role("link", name=product).first.click()
    await page.fill("#product-quantity", str(quantity))
    await page.click("#add-to-cart")
    await expect(page.locator("#cart-count")).to_have_text(str(quantity))
    await page.locator("header a[href='/demo/cart/']").click()
    await expect(page.locator("h1")).to_have_text("Your cart")


async def paid_orders(tenant) -> int:
    from demo.models import DemoOrder

    return await DemoOrder.objects.filter(tenant=tenant, status=DemoOrder.Status.PAID).acount()


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
    dialog = approval(page)
    await expect_payment_question(dialog, "$269.98")
    await expect_rows(dialog, [("Amount", "$269.98"), PAID_TO, CARD,
                               ("2 × Pro Headphones", "$299.98"), ("Coupon OWL10", "−$30.00")])
    await expect(dialog.locator("p.warning")).to_have_count(0)
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
    assert await wire(page, "connects") == 1
    await nothing_dropped(page)


async def test_a_navigating_tool_answers_after_the_new_pages_tools_reach_the_server(store, page):
    await open_store(page, store)

    await say(page, '/tool open_product {"productId": "travel-speaker"}')

    assert page.url == f"{store.server.http_url}/demo/products/travel-speaker/"
    session = await session_when(
        page, lambda row: row.current_url == "/demo/products/travel-speaker/")
    assert sorted(tool_names(session)) == ["add_to_cart", "open_cart", "open_product"]
    assert session.context["price"] == 89.0
    sent = [(f["type"], f["payload"]) for f in await wire(page, "sent")]
    result_at = next(i for i, (type_, payload) in enumerate(sent) if type_ == "TOOL_RESULT")
    assert sent[result_at - 1][0] == "CONTEXT_UPDATE"
    assert sent[result_at - 1][1]["url"] == "/demo/products/travel-speaker/"
    assert sent[result_at][1]["result"] == {
        "url": "/demo/products/travel-speaker/", "title": "Travel Speaker - Owl Store"}


async def test_the_agents_state_and_each_tool_call_show_while_they_happen(store, page, shot):
    await open_store(page, store)
    await say(page, '/tool open_product {"productId": "pro-headphones"}')
    # The cart's answer to add_to_cart waits until the test lets it go.
    let_go = asyncio.Event()

    async def hold(route: Route) -> None:
        await let_go.wait()
        await route.continue_()

    await page.route("**/demo/api/cart/add", hold)

    await send(page, '/tool add_to_cart {"quantity": 1}')

    await expect(status(page)).to_have_text("Working: add_to_cart…")
    await expect(page.locator(f"{WIDGET} .tool[data-tool=add_to_cart]")).to_have_count(0)
    await shot("working")
    let_go.set()
    await expect(tool_line(page, "add_to_cart")).to_have_attribute("data-status", "done")
    await expect(tool_line(page, "add_to_cart")).to_have_text("Done: Add to cart")
    await idle(page)
    await say(page, "/tool open_cart")

    await send(page, '/tool process_payment {"amount": 149.99}')

    await expect(status(page)).to_have_text("Waiting for your answer")
    await expect(approval(page)).to_be_visible()
    await shot("waiting-for-approval")
    await approval(page).get_by_role("button", name="Deny").click()

    await expect(approval(page)).to_have_count(0)
    await expect(notes(page).last).to_have_text("You denied: Process payment")
    await expect(notes(page).last).to_be_in_viewport()
    # A call the shopper denied gets no line of its own: the note says it.
    await expect(page.locator(f"{WIDGET} .tool[data-tool=process_payment]")).to_have_count(0)
    await idle(page)
    await shot("denied")


async def test_a_tool_that_fails_says_why_once_in_plain_words(store, page):
    await open_store(page, store)
    await say(page, '/tool open_product {"productId": "pro-headphones"}')
    await say(page, '/tool add_to_cart {"quantity": 1}')
    await say(page, "/tool open_cart")

    answer = await say(page, '/tool apply_coupon {"code": "FREESTUFF"}')

    await expect(tool_line(page, "apply_coupon")).to_have_attribute("data-status", "failed")
    await expect(tool_line(page, "apply_coupon")).to_have_text("Failed: Apply coupon")
    # The reason is told once: the answer says it, so the tool's line does not.
    assert answer == "apply_coupon failed: There is no coupon called 'FREESTUFF'."
    await expect(conversation(page).filter(has_text="There is no coupon called")).to_have_count(1)
    await expect(widget_error(page)).to_be_hidden()
    [call] = await tool_calls("apply_coupon")
    assert call.status == ToolCall.Status.ERROR


async def test_a_payment_for_the_wrong_amount_warns_in_the_dialog_and_charges_nothing(store, page):
    await open_store(page, store)
    await fill_cart_by_hand(page, "Charging Dock", 2)

    await send(page, '/tool process_payment {"amount": 10}')
    dialog = approval(page)
    await expect_rows(dialog, [("Amount", "$10.00"), PAID_TO, CARD, ("2 × Charging Dock", "$79.00")])
    await expect(dialog.locator("p.warning[role=alert]")).to_have_text("This is not your cart total ($79.00).")
    await dialog.get_by_role("button", name="Approve").click()

    await expect(answers(page).last).to_have_text(
        "process_payment failed: The amount $10.00 does not match the cart total $79.00.")
    await expect(tool_line(page, "process_payment")).to_have_attribute("data-status", "failed")
    await expect(conversation(page).filter(has_text="does not match the cart total")).to_have_count(1)
    await expect(page.locator("#cart-total")).to_have_text("$79.00")
    await expect(page.locator("#cart-count")).to_have_text("2")
    await expect(page.locator("#order-confirmation")).to_have_count(0)
    [call] = await tool_calls("process_payment")
    assert call.status == ToolCall.Status.ERROR
    assert await paid_orders(store.key.tenant) == 0


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


async def test_what_the_store_refuses_a_shopper_by_hand_is_said_on_the_page_and_goes_when_the_next_step_works(
        store, page):
    await open_store(page, store)
    await fill_cart_by_hand(page, "Travel Speaker", 1)

    await page.fill("#coupon-code", "NOPE")
    await page.click("form.coupon button")

    refusal = page.locator("#store-message")
    await expect(refusal).to_have_text("There is no coupon called 'NOPE'.")
    await expect(refusal).to_have_attribute("role", "alert")
    await expect(page.locator("#cart-total")).to_have_text("$89.00")
    await page.fill("#coupon-code", "WELCOME5")
    await page.click("form.coupon button")
    await expect(page.locator("#cart-total")).to_have_text("$84.00")
    await expect(refusal).to_be_hidden()


async def test_the_store_says_what_it_refused_only_once_the_page_under_it_is_redrawn(store, page):
    # The page is redrawn after every step; a refusal said before that would
    # invite the shopper to type into a form the redraw then replaces.
    await open_store(page, store)
    await fill_cart_by_hand(page, "Travel Speaker", 1)
    redraw_asked, redraw_may_go = asyncio.Event(), asyncio.Event()

    async def hold_redraw(route: Route) -> None:
        redraw_asked.set()
        await redraw_may_go.wait()
        await route.continue_()

    await page.route("**/demo/cart/", hold_redraw)
    await page.fill("#coupon-code", "NOPE")
    await page.click("form.coupon button")
    await asyncio.wait_for(redraw_asked.wait(), timeout=15)

    refusal = page.locator("#store-message")
    assert not await refusal.is_visible()
    redraw_may_go.set()
    await expect(refusal).to_have_text("There is no coupon called 'NOPE'.")
    await page.unroute("**/demo/cart/")
    await page.fill("#coupon-code", "WELCOME5")
    await page.click("form.coupon button")
    await expect(page.locator("#cart-total")).to_have_text("$84.00")


async def test_the_cart_survives_a_reload_and_the_reloaded_page_connects_on_its_own(store, page):
    await open_store(page, store)
    await fill_cart_by_hand(page, "Pro Headphones", 2)

    await page.reload()

    await expect(status(page)).to_have_text("Online")
    await expect(page.locator("#cart-count")).to_have_text("2")
    session = await session_when(page, lambda row: row.current_url == "/demo/cart/")
    assert session.context["items"][0]["quantity"] == 2


async def test_a_server_tool_that_needs_approval_asks_in_the_page(store, page):
    from demo.models import DemoOrder
    from demo.order_tools import demo_tools_install

    await sync_to_async(demo_tools_install)(tenant=store.key.tenant)
    await open_store(page, store)

    await send(page, '/tool cancel_order {"number": "A1003"}')
    dialog = approval(page)
    await expect(dialog).to_contain_text("cancel_order")
    await expect(status(page)).to_have_text("Waiting for your answer")
    await dialog.get_by_role("button", name="Approve").click()

    await expect(answers(page).last).to_contain_text("cancel_order succeeded")
    await expect(notes(page).last).to_have_text("You approved: Cancel order")
    order = await DemoOrder.objects.aget(tenant=store.key.tenant, number="A1003")
    assert order.status == DemoOrder.Status.CANCELLED
    await nothing_dropped(page)


async def test_an_origin_the_key_does_not_allow_is_explained_and_not_retried(store, page, shot):
    _, raw_key = await sync_to_async(tenancy.key_create)(
        tenant=store.key.tenant, name="elsewhere", allowed_origins=["https://shop.example"]
    )

    await page.goto(f"{store.server.http_url}/demo/?apiKey={quote(raw_key, safe='')}")
    await open_panel(page)

    await expect(status(page)).to_have_text("Offline")
    await expect(widget_error(page)).to_have_text("The assistant is not set up for this site.")
    await shot("refused")
    owl = await wire(page)
    assert [close["code"] for close in owl["closes"]] == [1008]
    assert owl["retryInMs"] is None
    assert owl["connects"] == 1
    await expect(send_button(page)).to_be_disabled()
    await expect(chat_input(page)).to_be_disabled()
    await expect(chat_input(page)).to_have_attribute("placeholder", "The assistant cannot take messages now.")
    # The sentence takes the one-line box's place, whole.
    await expect(chat_input(page)).to_be_hidden()
    await expect(ended_line(page)).to_have_text("The assistant cannot take messages now.")
    await expect(ended_line(page)).to_be_visible()
    # Not the demo's own key: the page adds nothing about make run.
    await expect(demo_notice(page)).to_be_hidden()


async def test_the_page_reconnects_by_itself_when_the_server_comes_back(store, page, shot):
    await open_store(page, store)
    first_session = await wire(page, "sessionId")

    await sync_to_async(store.server.stop)()
    await expect(status(page)).to_have_text("Reconnecting…")
    await expect(send_button(page)).to_be_disabled()
    await shot("server-down")
    await sync_to_async(store.restart)()

    # The client retries after 2 s, 4 s, ...: the first retry after the
    # restart gets through.
    await expect(status(page)).to_have_text("Online", timeout=30_000)
    await expect(widget_error(page)).to_be_hidden()
    await shot("reconnected")
    assert await wire(page, "sessionId") == first_session
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
    await open_panel(page)
    await expect(widget_error(page)).to_have_text("Handshake timeout")

    # The client retries by itself; the second socket reaches the server.
    await expect(status(page)).to_have_text("Online", timeout=30_000)
    await expect(widget_error(page)).to_be_hidden()
    await expect(chat_input(page)).to_be_editable()
    await expect(chat_input(page)).to_have_attribute("placeholder", "Ask a question…")
    await expect(send_button(page)).to_be_enabled()
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

    await send(page, "I'd like two of the travel speakers, please")

    await expect(answers(page).last).to_have_text("Two Travel Speakers are in your cart.")
    await idle(page)
    # The words before the calls, each call's line, then the answer: in that order.
    await expect(conversation(page)).to_have_text([
        "I'd like two of the travel speakers, please",
        "Let me open the Travel Speaker.",
        "Done: Open product",
        "Done: Add to cart",
        "Two Travel Speakers are in your cart.",
    ])
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

    dialog = approval(page)
    await expect_payment_question(dialog, "$299.98")
    await expect_rows(dialog, [("Amount", "$299.98"), PAID_TO, CARD, ("2 × Pro Headphones", "$299.98")])
    await expect(dialog.locator("p.warning")).to_have_count(0)
    await shot("approval")
    await dialog.get_by_role("button", name="Approve").click()

    await expect(page.locator("#order-confirmation")).to_contain_text("$299.98")
    await expect(answers(page).last).to_contain_text("Paid $299.98, order A")
    await expect(tool_line(page, "process_payment")).to_have_text("Done: Process payment")
    await shot("paid")
    [call] = await tool_calls("process_payment")
    assert call.status == ToolCall.Status.SUCCESS
    assert call.result["paid"] is True
    assert await paid_orders(llm_store.key.tenant) == 1


async def test_asked_to_pay_a_denied_payment_is_never_made_and_the_agent_says_so(
        llm_store, model, page, shot):
    await ask_to_pay(page, llm_store, model, 299.98)

    dialog = approval(page)
    await expect_payment_question(dialog, "$299.98")
    await expect_rows(dialog, [("Amount", "$299.98"), PAID_TO, CARD, ("2 × Pro Headphones", "$299.98")])
    # Deny has the focus first: Enter by mistake does not pay.
    await expect(dialog.get_by_role("button", name="Deny")).to_be_focused()
    await dialog.get_by_role("button", name="Deny").click()

    await expect(answers(page).last).to_contain_text("I did not pay: The user declined this action.")
    await expect(notes(page).last).to_have_text("You denied: Process payment")
    await shot("denied")
    await expect(page.locator("#order-confirmation")).to_have_count(0)
    await expect(page.locator("#cart-total")).to_have_text("$299.98")
    [call] = await tool_calls("process_payment")
    assert call.status == ToolCall.Status.DENIED
    assert call.result is None
    [last] = model.requests[-1:]
    assert tool_results(last)[0]["is_error"] is True
    assert await paid_orders(llm_store.key.tenant) == 0


# --- the widget's panel: Markdown, closing and opening, a phone -----------------------------

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
    await expect(page.locator(f"{WIDGET} .log").locator("img, script")).to_have_count(0)
    await expect(answer).to_contain_text('<img src=x onerror="window.__owned=2">')
    assert await page.evaluate("window.__owned") is None
    await shot("markdown-answer")


async def test_the_panel_closes_to_the_launcher_and_opens_again(store, page, shot):
    await open_store(page, store)
    await expect(launcher(page)).to_have_attribute("aria-expanded", "true")

    await page.get_by_role("button", name="Close chat").click()

    await expect(panel(page)).to_be_hidden()
    await expect(page.get_by_role("button", name="Open chat")).to_be_visible()
    await expect(launcher(page)).to_have_attribute("aria-expanded", "false")
    await expect(launcher(page)).to_be_focused()
    await shot("closed")
    # Closed, the assistant is still connected; the choice outlives a reload.
    await page.reload()
    await expect(status(page)).to_have_text("Online")
    await expect(panel(page)).to_be_hidden()

    await page.get_by_role("button", name="Open chat").click()

    await expect(panel(page)).to_be_visible()
    await expect(chat_input(page)).to_be_focused()
    await expect(launcher(page)).to_have_attribute("aria-expanded", "true")
    answer = await say(page, "/tool open_cart")
    assert answer.startswith("open_cart succeeded.")


async def test_on_a_phone_the_open_panel_covers_the_screen_and_can_be_used(store, page, shot):
    await page.set_viewport_size({"width": 390, "height": 844})
    await page.goto(store.url)
    # Closed at first: the store is what a shopper came for.
    await expect(launcher(page)).to_be_visible()
    await expect(panel(page)).to_be_hidden()
    await shot("phone-closed")

    await page.get_by_role("button", name="Open chat").click()

    await expect(panel(page)).to_be_visible()
    assert await panel(page).bounding_box() == {"x": 0, "y": 0, "width": 390, "height": 844}
    # The panel covers the page, its launcher too.
    await expect(launcher(page)).to_be_hidden()
    await expect(status(page)).to_have_text("Online")
    answer = await say(page, '/tool open_product {"productId": "travel-speaker"}')
    assert answer.startswith("open_product succeeded.")
    await expect(chat_input(page)).to_be_in_viewport()
    await shot("phone-open")

    await page.get_by_role("button", name="Close chat").click()

    await expect(panel(page)).to_be_hidden()
    await expect(launcher(page)).to_be_visible()


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


def stop_the_key(store, how: str) -> None:
    """The demo key stops working: revoked, disabled, expired, or unknown (the key
    file names a key this server's database never had)."""
    from datetime import timedelta
    from pathlib import Path

    from django.utils import timezone

    key = store.key
    if how == "unknown":
        Path(store.env["OWLLAYER_DEMO_KEY_FILE"]).write_text("pk_live_" + "0" * 32 + "\n")
    elif how == "expired":
        tenancy.key_update(key=key, changes={"expires_at": timezone.now() - timedelta(minutes=1)})
    else:
        tenancy.key_update(key=key, changes={"status": how})


@pytest.mark.parametrize("how, said, widget_said", [
    ("revoked", "This demo's key was revoked", "The assistant is no longer available on this site."),
    ("disabled", "This demo's key is disabled", "The assistant is switched off for now."),
    ("expired", "This demo's key has expired", "The assistant is no longer available on this site."),
    ("unknown", "This demo's key is not in this server's database",
     "The assistant is not set up correctly on this site."),
])
async def test_a_demo_key_that_no_longer_works_is_explained_with_how_to_get_a_new_one(
        demo_key_store, page, shot, how, said, widget_said):
    await sync_to_async(stop_the_key)(demo_key_store, how)

    await page.goto(f"{demo_key_store.server.http_url}/demo/")
    await open_panel(page)

    await expect(status(page)).to_have_text("Offline")
    await expect(widget_error(page)).to_have_text(widget_said)
    await expect(demo_notice(page)).to_have_text(said + NEW_DEMO_KEY)
    await expect(demo_notice(page)).to_be_visible()
    await clear_of_the_panel(page, demo_notice(page))
    await shot(f"demo-key-{how}")


async def test_a_key_of_ones_own_that_was_revoked_is_not_told_to_run_make_run(store, page):
    await sync_to_async(tenancy.key_revoke)(key=store.key)

    await page.goto(store.url)

    await expect(widget_error(page)).to_have_text("The assistant is no longer available on this site.")
    await expect(status(page)).to_have_text("Offline")
    await expect(demo_notice(page)).to_be_hidden()
    await expect(demo_notice(page)).to_have_text("")


async def test_revoking_the_demo_key_in_the_console_warns_first_and_the_open_store_says_how_to_recover(
        demo_key_store, page, shot, browser):
    from tests.support.people import make_user

    def owner() -> None:
        user = make_user("olga", tenant=demo_key_store.key.tenant, staff=False)
        user.set_password("pw-olga-123")
        user.save()

    await sync_to_async(owner)()
    await page.goto(f"{demo_key_store.server.http_url}/demo/")
    await open_panel(page)
    await expect(status(page)).to_have_text("Online")
    await expect(demo_notice(page)).to_be_hidden()

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

    await expect(demo_notice(page)).to_have_text("This demo's key was revoked" + NEW_DEMO_KEY)
    await expect(demo_notice(page)).to_be_visible()
    await clear_of_the_panel(page, demo_notice(page))
    await expect(chat_input(page)).to_be_disabled()
    await expect(send_button(page)).to_be_disabled()
    await expect(ended_line(page)).to_have_text("The assistant cannot take messages now.")
    await shot("store-after-the-revoke")
