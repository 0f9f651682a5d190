"""The demo store in real Chromium against a real daphne process, with the
offline backend: "/tool <name> {json}" in the chat calls a page tool."""
from __future__ import annotations

from urllib.parse import quote

import pytest
from asgiref.sync import sync_to_async
from playwright.async_api import Page, expect

from aitp import services
from aitp.models import Session, ToolCall
from tests.browser.conftest import SOON, Store, eventually

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

expect.set_options(timeout=SOON * 1000)


async def open_store(page: Page, store: Store) -> None:
    await page.goto(store.url)
    await expect(page.locator("#owl-status")).to_have_text("connected")


async def say(page: Page, text: str) -> str:
    """Send a chat message; the agent's complete answer."""
    answers = page.locator(".owl-msg-agent[data-done=true]")
    before = await answers.count()
    await page.fill("#owl-input", text)
    await page.press("#owl-input", "Enter")
    await expect(answers).to_have_count(before + 1)
    await expect(page.locator("#owl-status")).to_have_text("connected")
    return await answers.nth(before).inner_text()


async def nothing_dropped(page: Page) -> None:
    owl = await page.evaluate("window.__owl")
    assert owl["dropped"] == 0, owl["droppedReasons"]


async def session_when(page: Page, ready) -> Session:
    """The page's session row, once ready(row) holds (the server writes it
    after the frame that changed it)."""
    session_id = await page.evaluate("window.__owl.sessionId")
    row = None

    async def check() -> bool:
        nonlocal row
        row = await Session.objects.aget(id=session_id)
        return ready(row)

    await eventually(check, what=f"session {session_id} to be ready")
    return row


async def tool_calls(name: str) -> list[ToolCall]:
    return [call async for call in ToolCall.objects.filter(name=name).order_by("created_at")]


async def add_two_and_go_to_cart(page: Page) -> None:
    await say(page, '/tool add_to_cart {"quantity": 2}')
    await say(page, "/tool go_to_cart")
    await expect(page.locator("#cart-total")).to_have_text("$299.98")


async def test_the_store_connects_and_shows_connected(store, page):
    await open_store(page, store)

    session = await session_when(page, lambda row: row.current_url == "/demo/")
    assert session.title == "Pro Headphones - Owl Store"
    assert [tool["name"] for tool in session.tools] == ["add_to_cart", "go_to_cart"]
    assert session.context["price"] == 149.99
    await nothing_dropped(page)


async def test_a_tool_command_in_the_chat_adds_to_the_cart(store, page):
    await open_store(page, store)

    answer = await say(page, '/tool add_to_cart {"quantity": 2}')

    assert "add_to_cart succeeded" in answer
    await expect(page.locator("#cart-count")).to_have_text("2")
    [call] = await tool_calls("add_to_cart")
    assert call.status == ToolCall.Status.SUCCESS
    assert call.arguments == {"quantity": 2}
    assert call.result["cartTotal"] == 299.98
    await nothing_dropped(page)


async def test_go_to_cart_moves_the_page_and_the_server_follows_on_the_same_socket(store, page):
    await open_store(page, store)

    await add_two_and_go_to_cart(page)

    assert page.url.startswith(f"{store.server.http_url}/demo/cart/?apiKey=")
    session = await session_when(page, lambda row: row.current_url == "/demo/cart/")
    assert [tool["name"] for tool in session.tools] == ["set_quantity", "process_payment"]
    owl = await page.evaluate("window.__owl")
    assert owl["connects"] == 1
    # The cart page's tools reached the server before go_to_cart's result.
    sent = [(f["type"], f["payload"]) for f in owl["sent"]]
    result_at = next(i for i, (type_, payload) in enumerate(sent)
                     if type_ == "TOOL_RESULT" and payload["result"] == {"url": "/demo/cart/"})
    assert sent[result_at - 1][0] == "CONTEXT_UPDATE"
    assert sent[result_at - 1][1]["url"] == "/demo/cart/"
    await nothing_dropped(page)


async def test_declining_a_payment_is_reported_and_never_counts_as_a_success(store, page):
    await open_store(page, store)
    await add_two_and_go_to_cart(page)

    await page.fill("#owl-input", '/tool process_payment {"amount": 299.98}')
    await page.press("#owl-input", "Enter")
    dialog = page.get_by_role("dialog")
    await expect(dialog).to_contain_text("Pay 299.98 USD with the saved card?")
    await expect(page.locator("#owl-status")).to_have_text("thinking")
    await dialog.get_by_role("button", name="Decline").click()

    answer = page.locator(".owl-msg-agent[data-done=true]").last
    await expect(answer).to_contain_text("declined")
    await expect(page.locator("#cart-count")).to_have_text("2")
    [call] = await tool_calls("process_payment")
    assert call.status == ToolCall.Status.DENIED
    assert call.result is None
    await nothing_dropped(page)


async def test_approving_a_payment_runs_it_and_empties_the_cart(store, page):
    await open_store(page, store)
    await add_two_and_go_to_cart(page)

    await page.fill("#owl-input", '/tool process_payment {"amount": 299.98}')
    await page.press("#owl-input", "Enter")
    dialog = page.get_by_role("dialog")
    await dialog.get_by_role("button", name="Approve").click()

    await expect(page.locator("#order-confirmation")).to_contain_text("$299.98")
    await expect(page.locator("#cart-count")).to_have_text("0")
    answer = page.locator(".owl-msg-agent[data-done=true]").last
    await expect(answer).to_contain_text("process_payment succeeded")
    [call] = await tool_calls("process_payment")
    assert call.status == ToolCall.Status.SUCCESS
    assert call.risk == "critical"
    assert call.result["paid"] is True
    await nothing_dropped(page)


async def test_a_server_tool_that_needs_approval_asks_in_the_page(store, page):
    from approvals.builtin_tools import demo_tools_install
    from approvals.models import DemoOrder

    await sync_to_async(demo_tools_install)(tenant=store.key.tenant)
    await open_store(page, store)

    await page.fill("#owl-input", '/tool cancel_order {"number": "A1003"}')
    await page.press("#owl-input", "Enter")
    dialog = page.get_by_role("dialog")
    await expect(dialog).to_contain_text("cancel_order")
    await dialog.get_by_role("button", name="Approve").click()

    answer = page.locator(".owl-msg-agent[data-done=true]").last
    await expect(answer).to_contain_text("cancel_order succeeded")
    order = await DemoOrder.objects.aget(tenant=store.key.tenant, number="A1003")
    assert order.status == DemoOrder.Status.CANCELLED
    await nothing_dropped(page)


async def test_an_origin_the_key_does_not_allow_shows_the_error_and_does_not_reconnect(store, page):
    _, raw_key = await sync_to_async(services.api_key_create)(
        tenant=store.key.tenant, name="elsewhere", allowed_origins=["https://shop.example"]
    )

    await page.goto(f"{store.server.http_url}/demo/?apiKey={quote(raw_key, safe='')}")

    await expect(page.locator("#owl-status")).to_have_text("error")
    await expect(page.locator(".owl-msg-error")).to_have_count(1)
    await expect(page.locator(".owl-msg-error")).to_contain_text("origin")
    owl = await page.evaluate("window.__owl")
    assert [close["code"] for close in owl["closes"]] == [1008]
    # The decision is taken when the socket closes: no retry is scheduled.
    assert owl["retryInMs"] is None
    assert owl["connects"] == 1
    assert owl["dropped"] == 0
    await expect(page.locator("#owl-send")).to_be_disabled()


async def test_the_cart_survives_a_reload_and_the_cart_page_connects_on_its_own(store, page):
    await open_store(page, store)
    await add_two_and_go_to_cart(page)

    await page.reload()

    await expect(page.locator("#owl-status")).to_have_text("connected")
    await expect(page.locator("#cart-count")).to_have_text("2")
    session = await session_when(page, lambda row: row.current_url == "/demo/cart/")
    assert [tool["name"] for tool in session.tools] == ["set_quantity", "process_payment"]
    assert session.context["items"][0]["quantity"] == 2
