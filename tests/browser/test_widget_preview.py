"""The console's preview of a key's widget (docs/widget.md, Preview): real
Chromium signed in to the console of a real daphne process, the real widget
against it, the model the fake Messages API. The key allows only its shop's
origin; the preview runs under the console's own."""
from __future__ import annotations

import pytest
from asgiref.sync import sync_to_async
from playwright.async_api import Page, expect

from aitp import tenancy
from aitp.models import ApiKey, Session
from tenants.models import TenantMembership
from tests.browser.conftest import WATCH_VIOLATIONS
from tests.support.fake_anthropic import text_response
from widget.services import key_set_appearance

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

PASSWORD = "a long enough password for the browser"
SHOP = "https://shop.example"


def member_with_a_shop_key(store, role: str) -> ApiKey:
    from django.contrib.auth import get_user_model

    user = get_user_model().objects.create_user(username="morgan", password=PASSWORD)
    TenantMembership.objects.create(tenant=store.key.tenant, user=user, role=role)
    key, _ = tenancy.key_create(tenant=store.key.tenant, name="shop", allowed_origins=[SHOP])
    key_set_appearance(key=key, look={"name": "Hibou", "greeting": "Hello from the shop."})
    return key


async def sign_in(page: Page, base: str) -> None:
    await page.goto(base + "/console/login/")
    await page.fill("#id_username", "morgan")
    await page.fill("#id_password", PASSWORD)
    await page.click("button[type=submit]")
    await expect(page.locator("h1")).to_be_visible()


def widget(page: Page):
    return page.locator("owllayer-widget")


async def test_an_owner_sees_the_form_drawn_live_by_the_real_widget_and_talks_to_it(llm_store, model, page):
    key = await sync_to_async(member_with_a_shop_key)(llm_store, TenantMembership.Role.OWNER)
    base = llm_store.server.http_url
    await page.add_init_script(WATCH_VIOLATIONS)
    await sign_in(page, base)
    await page.goto(f"{base}/console/t/{llm_store.key.tenant.slug}/keys/{key.pk}/appearance/")

    await widget(page).get_by_role("button", name="Open chat").click()
    await expect(widget(page).locator("header h2")).to_have_text("Hibou")
    await expect(widget(page).locator(".greeting")).to_have_text("Hello from the shop.")
    await expect(widget(page).locator(".status")).to_have_text("Online")

    # The model answers the preview as it would a visitor of the shop.
    model.enqueue(text_response("Your order ships tomorrow."))
    await widget(page).locator("textarea").fill("Where is my order?")
    await widget(page).locator("textarea").press("Enter")
    await expect(widget(page).locator(".msg.agent[aria-busy=false]").last).to_have_text("Your order ships tomorrow.")

    # Typing in the form redraws the widget at once, unsaved; the conversation stays.
    await page.fill("#appearance-name", "Chouette")
    await page.select_option("#appearance-language", "fr")
    await page.fill("#appearance-accent", "#0b6e4f")
    await page.check("input[name=position][value=left]")
    await expect(widget(page).locator("header h2")).to_have_text("Chouette")
    await expect(widget(page).locator("textarea")).to_have_attribute("placeholder", "Posez une question\u2026")
    await expect(widget(page)).to_have_attribute("data-position", "left")
    assert await widget(page).locator("header").evaluate("(h) => getComputedStyle(h).backgroundColor") == \
        "rgb(11, 110, 79)"
    await expect(widget(page).locator(".msg.user")).to_have_text(["Where is my order?"])
    await expect(widget(page).locator(".msg.agent[aria-busy=false]").last).to_have_text("Your order ships tomorrow.")

    session = await Session.objects.aget(api_key=key)
    assert session.origin == base
    # Nothing was saved: the key's appearance is as it was.
    assert (await ApiKey.objects.aget(pk=key.pk)).widget_appearance["name"] == "Hibou"
    assert await page.evaluate("window.__cspViolations") == []


async def test_a_viewer_sees_the_saved_appearance_and_the_same_key_from_another_page_is_refused(
        llm_store, page):
    key = await sync_to_async(member_with_a_shop_key)(llm_store, TenantMembership.Role.VIEWER)
    base = llm_store.server.http_url
    await sign_in(page, base)
    await page.goto(f"{base}/console/t/{llm_store.key.tenant.slug}/keys/{key.pk}/appearance/")

    await widget(page).get_by_role("button", name="Open chat").click()
    await expect(widget(page).locator("header h2")).to_have_text("Hibou")
    await expect(widget(page).locator(".status")).to_have_text("Online")

    # Without the ticket, a page of the console's origin is one the key does not allow.
    refused = await page.evaluate("""async (key) => {
      const ws = new WebSocket(location.origin.replace("http", "ws") + "/owllayer?apiKey=" + encodeURIComponent(key));
      const frames = [];
      ws.onopen = () => ws.send(JSON.stringify({ id: "msg_1", type: "HANDSHAKE_INIT", timestamp: 1,
        payload: { apiKey: key, protocolVersion: "1.0.0" } }));
      ws.onmessage = (event) => frames.push(JSON.parse(event.data));
      const code = await new Promise((resolve) => { ws.onclose = (event) => resolve(event.code); });
      return { code, error: frames.map((f) => f.payload && f.payload.data && f.payload.data.code).find(Boolean) };
    }""", key.publishable)
    assert refused == {"code": 1008, "error": "origin_not_allowed"}
    assert [s.origin async for s in Session.objects.filter(api_key=key)] == [base]  # the preview's only
