"""In Chromium, against a real daphne process: a shopper in the demo store
asks for a person, an operator in the admin's live page takes the chat over,
they write to each other, and the operator hands the chat back to the agent,
which answers knowing what was said."""
from __future__ import annotations

import pytest
from asgiref.sync import sync_to_async
from django.urls import reverse
from playwright.async_api import expect

from tests.browser.store_support import answers, open_store, send
from tests.browser.test_admin_widths import superuser_tab
from tests.support.fake_anthropic import text_response, tool_use_response
from tests.support.people import make_user

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def notes(page):
    return page.locator(".owl-msg-note")


async def test_a_person_asked_for_takes_the_chat_over_writes_both_ways_and_hands_it_back_to_the_agent(
        llm_store, model, page, browser):
    llm_store.key.handoff = True
    await sync_to_async(llm_store.key.save)(update_fields=["handoff"])
    model.enqueue(tool_use_response([("ask_for_a_person", {"reason": "wants a refund"})]),
                  text_response("I have asked a colleague to join; they will answer here."))
    await open_store(page, llm_store)
    await send(page, "Can I talk to a person, please?")
    await expect(notes(page).last).to_contain_text("An operator has been asked to join this chat")
    await expect(answers(page).last).to_have_text("I have asked a colleague to join; they will answer here.")
    session_id = await page.evaluate("window.__owl.sessionId")

    operator = await sync_to_async(make_user)("jane", tenant=llm_store.key.tenant, superuser=True)
    context, tab, errors = await superuser_tab(browser, llm_store.server, operator)
    try:
        await tab.goto(llm_store.server.http_url + reverse("operators:live_session", args=[session_id]))
        await tab.locator("#take-over").get_by_role("button", name="Take over").click()
        await expect(tab.locator("#operator-in-charge")).to_contain_text("You are in charge")
        await expect(answers(page).last).to_have_text("jane has joined the chat and answers you now.")

        await tab.fill("#operator-text", "Hello, I am Jane. Which order is it?")
        await tab.locator("#operator-say").get_by_role("button", name="Send to the page user").click()
        await expect(answers(page).last).to_have_text("Hello, I am Jane. Which order is it?")
        await send(page, "Order A1, the headphones.")
        await expect(tab.locator("body")).to_contain_text("Order A1, the headphones.")
        await expect(page.locator("#owl-status")).to_have_text("connected")

        await tab.fill("#hand-back-note", "Refund for A1 issued.")
        await tab.locator("#hand-back").get_by_role("button", name="Hand back").click()
        await expect(answers(page).last).to_have_text("jane has handed the chat back to the assistant.")
        assert errors == []
    finally:
        await context.close()

    model.enqueue(text_response("Glad Jane could help with order A1."))
    await send(page, "Thanks!")
    await expect(answers(page).last).to_have_text("Glad Jane could help with order A1.")
    told = [block.get("text", "") for block in model.requests[-1]["messages"][-1]["content"]]
    assert "[The human operator jane, to the user:] Hello, I am Jane. Which order is it?" in told
    assert "[The user, to the human operator:] Order A1, the headphones." in told
    assert any("Refund for A1 issued." in text for text in told)
