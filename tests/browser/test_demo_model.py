"""The demo store on a server without a model key: real Chromium, a real
daphne process with neither OWLLAYER_LLM nor ANTHROPIC_API_KEY set, so the
scripted demo assistant answers in the store's widget. It answers in
sentences, runs the page's tools, pays only once the shopper approves, and
never shows a tool catalogue. Each step's screenshot lands in test-artifacts/."""
from __future__ import annotations

import pytest
from playwright.async_api import Page, expect

from aitp.models import ToolCall
from tests.browser.store_support import (
    answers,
    approval,
    idle,
    nothing_dropped,
    open_store,
    send,
    tool_calls,
    tool_line,
)

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

TOOL_NAMES = ["open_product", "open_cart", "add_to_cart", "set_quantity", "apply_coupon", "process_payment"]


async def ask(page: Page, text: str) -> str:
    """Send a message; the turn's last answer once it ended. (A turn that
    runs a page tool may answer in more than one bubble: the words before
    the tool's line, then the rest.)"""
    await send(page, text)
    # The status line says "Writing…" from the moment the message left.
    await idle(page)
    return await answers(page).last.inner_text()


async def test_without_a_model_key_the_demo_assistant_answers_adds_to_the_cart_and_pays_once_approved(
    demo_store, page, shot
):
    await open_store(page, demo_store)
    await expect(page.locator("#assistant-help")).to_contain_text("scripted demo assistant")

    hello = await ask(page, "hello")
    assert "demo assistant" in hello and "ANTHROPIC_API_KEY" in hello
    await shot("hello")

    shown = await ask(page, "show me the travel speaker")
    await expect(page.locator("h1")).to_have_text("Travel Speaker")
    await expect(tool_line(page, "open_product")).to_have_text("Done: Open product")
    assert shown.startswith("Here it is.")

    added = await ask(page, "add two to my cart")
    await expect(page.locator("#cart-count")).to_have_text("2")
    assert "Your cart now holds 2 items, 178.00 USD in total." in added
    await shot("two-in-the-cart")

    # From the product page: the cart opens first, then the code is applied.
    applied = await ask(page, "apply the coupon owl10")
    await expect(page.locator("h1")).to_have_text("Your cart")
    assert "10% off your order (OWL10) now applies to your order." in applied

    await send(page, "pay for my order")
    dialog = approval(page)
    await expect(dialog.locator("dt:text-is('Amount') + dd")).to_have_text("$160.20")
    await shot("payment-approval")
    await dialog.get_by_role("button", name="Approve").click()

    await expect(page.locator("#order-confirmation")).to_contain_text("$160.20")
    await expect(answers(page).last).to_contain_text("Your payment went through.")
    await expect(answers(page).last).to_contain_text("Thank you for shopping with us!")
    await expect(page.locator("#cart-count")).to_have_text("0")
    await idle(page)
    await shot("paid")

    refused = await ask(page, "delete my account")
    assert refused.startswith("Sorry, I can't help with that")

    # What the shopper reads of the assistant: its answers, the tool lines
    # (in words), and the page's help box.
    shown_texts = [
        *await answers(page).all_inner_texts(),
        *await page.locator("owllayer-widget .tool").all_inner_texts(),
        await page.locator("#assistant-help").inner_text(),
    ]
    for text in shown_texts:
        assert "/tool" not in text and "{" not in text, text
        assert not any(name in text for name in TOOL_NAMES), text
    for name in ["open_product", "add_to_cart", "open_cart", "apply_coupon", "process_payment"]:
        [call] = await tool_calls(name)
        assert call.status == ToolCall.Status.SUCCESS, name
    await nothing_dropped(page)
