"""In Chromium, against real daphne processes: a turn's breakdown on the
admin's live page and the console's session record, and the admin's banner
when the model refuses the server's key."""
from __future__ import annotations

import re

import pytest
from asgiref.sync import sync_to_async
from django.urls import reverse
from playwright.async_api import expect

from tests.browser.store_support import answers, approval, wire
from tests.browser.test_admin_widths import superuser_tab
from tests.browser.test_demo_store import ask_to_pay
from tests.support.fake_anthropic import FakeAnthropicServer
from tests.support.people import make_user

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

MILLISECONDS = re.compile(r"^\d+ ms$")


async def test_a_paid_turn_shows_its_breakdown_on_the_live_page_and_the_session_record(
        llm_store, model, page, browser):
    await ask_to_pay(page, llm_store, model, 299.98)
    await approval(page).get_by_role("button", name="Approve").click()
    await expect(answers(page).last).to_contain_text("Paid $299.98, order A")
    session_id = await wire(page, "sessionId")
    owner = await sync_to_async(make_user)("owl-owner", tenant=llm_store.key.tenant, superuser=True)
    context, tab, errors = await superuser_tab(browser, llm_store.server, owner)
    slug = llm_store.key.tenant.slug
    try:
        for path in (reverse("operators:live_session", args=[session_id]),
                     reverse("console:session", args=[slug, session_id])):
            await tab.goto(llm_store.server.http_url + path)
            turn = tab.locator("#turns tr[data-turn='1']")
            await expect(turn.locator("[data-figure=outcome]")).to_have_text("Answered")
            for figure in ("first_text", "model", "tools", "approval"):
                await expect(turn.locator(f"[data-figure={figure}]")).to_have_text(MILLISECONDS)
            # Two requests of the fake model's 10 input and 5 output tokens, at list prices.
            await expect(turn.locator("[data-figure=tokens]")).to_have_text("20 / 10")
            await expect(turn.locator("[data-figure=cost]")).to_have_text("$0.0002")
            approval_ms = int((await turn.locator("[data-figure=approval]").inner_text()).split()[0])
            assert approval_ms > 0, path
        assert errors == []
    finally:
        await context.close()


async def test_the_admin_says_which_variable_to_fix_when_the_model_refuses_the_key(
        daphne_factory, browser):
    with FakeAnthropicServer(api_key="sk-ant-the-right-key") as model:
        server = daphne_factory(OWLLAYER_LLM="anthropic", ANTHROPIC_API_KEY="sk-ant-a-wrong-key",
                                ANTHROPIC_BASE_URL=model.base_url)
        root = await sync_to_async(make_user)("root", superuser=True)
        context, tab, errors = await superuser_tab(browser, server, root)
        try:
            await tab.goto(server.http_url + "/admin/")
            banner = tab.locator("#model-problem")
            await expect(banner).to_have_attribute("data-state", "refused")
            await expect(banner).to_contain_text("ANTHROPIC_API_KEY")
            await expect(banner).to_contain_text("restart the server")
            assert errors == []
        finally:
            await context.close()
