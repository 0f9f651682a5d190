"""In Chromium, against real daphne processes: a shopper in the demo store
asks for a person, the admin's header counts the chat as waiting for one, an
operator goes from that count to the chat's live page and takes it over (the
count goes back down), they write to each other, and the operator hands the
chat back to the agent, which answers knowing what was said. Once with the
shopper and the operator on the same process, once on two processes that
share the database and the Redis channel layer."""
from __future__ import annotations

import re

import pytest
from asgiref.sync import sync_to_async
from playwright.async_api import Browser, Page, expect

from tests.browser.conftest import Store
from tests.browser.store_support import WIDGET, answers, idle, open_store, send, wire
from tests.browser.test_admin_widths import superuser_tab
from tests.support.daphne import DaphneServer
from tests.support.fake_anthropic import FakeAnthropicServer, text_response, tool_use_response
from tests.support.people import make_user

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

# The class of the header's count of chats waiting for a person while there are any
# (templates/admin/base_site.html, static/owllayer/admin-alerts.js).
ACTIVE = re.compile(r"(^|\s)alert-active(\s|$)")


def operator_messages(page: Page):
    """The operator's messages in the widget, each labelled with their name."""
    return page.locator(f"{WIDGET} .msg.agent[data-operator]")


async def system_events(page: Page, kind: str) -> list[dict]:
    """The SYSTEM_EVENT payloads of `kind` the page received."""
    frames = await wire(page, "frames")
    return [f["payload"] for f in frames if f["type"] == "SYSTEM_EVENT" and f["payload"]["kind"] == kind]


async def a_person_is_asked_for_takes_over_writes_both_ways_and_hands_back(
        store: Store, model: FakeAnthropicServer, page: Page, browser: Browser,
        admin_server: DaphneServer) -> None:
    """The whole flow: the shopper's page on ``store.server``, the operator's
    admin tab on ``admin_server`` (the same process or another one)."""
    store.key.handoff = True
    await sync_to_async(store.key.save)(update_fields=["handoff"])
    model.enqueue(tool_use_response([("ask_for_a_person", {"reason": "wants a refund"})]),
                  text_response("I have asked a colleague to join; they will answer here."))
    await open_store(page, store)
    await send(page, "Can I talk to a person, please?")
    await expect(answers(page).last).to_have_text("I have asked a colleague to join; they will answer here.")
    # The page was told an operator is asked, and the widget says so as a note.
    asked = "An operator has been asked to join this chat and will answer you here as soon as one is free."
    assert [event["message"] for event in await system_events(page, "waiting")] == [asked]
    await expect(page.locator(f"{WIDGET} .note", has_text=asked)).to_have_count(1)
    session_id = await wire(page, "sessionId")

    operator = await sync_to_async(make_user)("jane", tenant=store.key.tenant, superuser=True)
    context, tab, errors = await superuser_tab(browser, admin_server, operator)
    try:
        # Any admin page's header counts the chat; its count leads to the
        # live list, whose row says why the chat waits and leads to its page.
        await tab.goto(admin_server.http_url + "/admin/")
        waiting = tab.locator("#alert-waiting")
        await expect(waiting).to_have_text("1 waiting for a person")
        await expect(waiting).to_have_class(ACTIVE)
        await waiting.click()
        row = tab.locator(f"#session-{session_id}")
        await expect(row.locator("td.state")).to_contain_text("waits for a person: wants a refund")
        await row.get_by_role("link", name=session_id).click()

        await tab.locator("#take-over").get_by_role("button", name="Take over").click()
        await expect(tab.locator("#operator-in-charge")).to_contain_text("You are in charge")
        await expect(answers(page).last).to_have_text("jane has joined the chat and answers you now.")
        # Taken over: nobody waits for a person any more.
        await expect(waiting).to_have_text("0 waiting for a person")
        await expect(waiting).not_to_have_class(ACTIVE)

        await tab.fill("#operator-text", "Hello, I am Jane. Which order is it?")
        await tab.locator("#operator-say").get_by_role("button", name="Send to the page user").click()
        said = operator_messages(page)
        await expect(said).to_have_count(1)
        await expect(said.locator("span.who")).to_have_text("jane (support team)")
        await expect(said.locator("p")).to_have_text("Hello, I am Jane. Which order is it?")
        await expect(said).to_have_attribute("data-operator", "jane")
        await expect(answers(page).last).to_have_attribute("data-operator", "jane")
        await send(page, "Order A1, the headphones.")
        await expect(tab.locator("body")).to_contain_text("Order A1, the headphones.")
        await idle(page)

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


async def test_a_chat_waiting_for_a_person_is_counted_in_the_admin_until_an_operator_takes_it_over_and_hands_it_back(
        llm_store, model, page, browser):
    await a_person_is_asked_for_takes_over_writes_both_ways_and_hands_back(
        llm_store, model, page, browser, llm_store.server)


@pytest.mark.redis
async def test_an_operator_on_another_server_process_sees_the_waiting_chat_takes_it_over_and_hands_it_back(
        llm_store, model, page, browser):
    # The same settings, so the same fake Messages API: whichever process
    # holds the chat after the hand back asks `model`.
    operators_server = llm_store.factory(llm_store.env)
    await a_person_is_asked_for_takes_over_writes_both_ways_and_hands_back(
        llm_store, model, page, browser, operators_server)
