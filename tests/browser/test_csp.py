"""The admin, the console, the live pages and the demo store work under the
Content-Security-Policy: real Chromium, a real daphne process, and not one
CSP violation reported by the browser."""
from __future__ import annotations

import pytest
from asgiref.sync import sync_to_async
from playwright.async_api import Page, expect

from tests.browser.conftest import WATCH_VIOLATIONS
from tests.browser.store_support import idle, open_panel, say, tool_line

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

PASSWORD = "a long enough password for the browser"


@pytest.fixture
async def watched(page: Page):
    console: list[str] = []
    page.on("console", lambda message: console.append(message.text))
    await page.add_init_script(WATCH_VIOLATIONS)
    return page, console


async def violations(page: Page, console: list[str]) -> list[str]:
    in_console = [text for text in console if "Content Security Policy" in text]
    return in_console + await page.evaluate("window.__cspViolations || []")


def make_operator(tenant_slug: str):
    from django.contrib.auth import get_user_model

    from tenants.models import Tenant, TenantMembership

    user = get_user_model().objects.create_user(
        username="olivia", password=PASSWORD, is_staff=True, is_superuser=True
    )
    tenant = Tenant.objects.get(slug=tenant_slug)
    TenantMembership.objects.create(tenant=tenant, user=user, role=TenantMembership.Role.OWNER)
    return user


async def test_the_demo_store_chats_under_the_csp(store, watched):
    page, console = watched
    response = await page.goto(store.url)
    assert "script-src" in response.headers["content-security-policy"]

    # The widget (its snippet, its shadow root's styles, its socket) and the
    # store's own script, which gives it the page's tools.
    await open_panel(page)
    await idle(page)
    answer = await say(page, "hello")
    await say(page, '/tool open_product {"productId": "pro-headphones"}')
    await expect(page.locator("h1")).to_have_text("Pro Headphones")
    await expect(tool_line(page, "open_product")).to_have_text("Done: Open product")

    assert answer
    assert await violations(page, console) == []

    # The policy is really enforced (and the watch above really sees it): an
    # injected inline script is blocked and reported.
    await page.evaluate("""() => {
      const script = document.createElement("script");
      script.textContent = "window.__injected = true";
      document.body.appendChild(script);
    }""")
    await expect(page.locator("body")).to_be_visible()
    assert await page.evaluate("window.__injected === undefined")
    assert any("script-src" in v for v in await violations(page, console))


async def test_the_admin_console_and_live_pages_work_under_the_csp(store, watched):
    page, console = watched
    await sync_to_async(make_operator)("owl-store")
    base = store.server.http_url

    await page.goto(base + "/admin/login/")
    await page.fill("#id_username", "olivia")
    await page.fill("#id_password", PASSWORD)
    await page.click("input[type=submit]")
    await expect(page.locator("#user-tools")).to_contain_text("olivia")
    await page.goto(base + "/admin/approvals/approval/")
    await expect(page.locator("#changelist")).to_be_visible()

    # The live list runs an inline script (with the nonce) and opens the
    # watch socket to this host.
    await page.goto(base + "/admin/live/")
    await expect(page.locator("#live-status")).to_have_class("live-status state-live")

    await page.goto(base + "/console/t/owl-store/")
    await expect(page.locator("h1")).to_be_visible()
    await page.goto(base + "/console/t/owl-store/keys/")
    await expect(page.locator("h1")).to_be_visible()

    assert await violations(page, console) == []
