"""The lockout page in Chromium against a real daphne process (the ASGI path
django-axes answers through): a person who mistyped their password too
often sees the console's or the admin's own look, how long the lock lasts
and the command that lifts it. Screenshots go to
test-artifacts/screenshots/<test>/."""
from __future__ import annotations

import re

import pytest
from django.conf import settings
from playwright.async_api import expect

from owllayer_site.login_throttling import duration
from tests.browser.conftest import ARTIFACTS

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

SOON_MS = 15_000
PASSWORD = "correct horse battery staple"
# The console's page background (console/base.html --bg) and the admin's
# header (Django admin's --header-bg): styled pages, not a bare line of text.
CONSOLE_BACKGROUND = "rgb(246, 247, 249)"
ADMIN_HEADER = "rgb(65, 118, 144)"


@pytest.fixture
def server(daphne_factory, django_user_model):
    django_user_model.objects.create_user(username="olga", password=PASSWORD, is_staff=True)
    started = daphne_factory()
    yield started
    print(f"--- daphne log ---\n{started.logs()}")


@pytest.fixture
async def tab(browser, request):
    context = await browser.new_context(viewport={"width": 1100, "height": 760})
    page = await context.new_page()
    page.set_default_timeout(SOON_MS)
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    folder = ARTIFACTS / "screenshots" / re.sub(r"[^\w.-]+", "_", request.node.name)
    folder.mkdir(parents=True, exist_ok=True)

    async def shot(step: str) -> None:
        await page.screenshot(path=str(folder / f"{step}.png"), full_page=True)

    page.shot = shot
    yield page
    await context.close()
    assert not errors, errors


async def mistype(tab, login_url: str, times: int) -> int:
    """Sign in as olga with a wrong password `times` times; the last answer's status."""
    status = 0
    for _ in range(times):
        await tab.goto(login_url)
        await tab.fill("input[name=username]", "olga")
        await tab.fill("input[name=password]", "wrong")
        async with tab.expect_navigation() as answered:
            await tab.click("[type=submit]")
        status = (await answered.value).status
    return status


@pytest.mark.parametrize("which, login, look", [
    ("console", "/console/login/", ("body", "background-color", CONSOLE_BACKGROUND)),
    ("admin", "/admin/login/", ("#header", "background-color", ADMIN_HEADER)),
])
async def test_mistyping_a_password_too_often_shows_a_styled_page_with_the_time_and_the_command(
    server, tab, which, login, look
):
    status = await mistype(tab, server.http_url + login, settings.AXES_FAILURE_LIMIT)

    assert status == 429
    await expect(tab.get_by_text("Too many failed sign-ins").first).to_be_visible()
    await expect(tab.locator("[data-lasts]")).to_have_text(duration(settings.AXES_COOLOFF_TIME))
    await expect(tab.locator("[data-ends-at]")).to_have_text(re.compile(r"^\d\d:\d\d:\d\d UTC$"))
    await expect(tab.locator("[data-command]")).to_have_text(
        "manage.py axes_reset_ip_username 127.0.0.1 olga")
    selector, prop, value = look
    await expect(tab.locator(selector)).to_have_css(prop, value)
    await tab.shot(f"{which}-locked-out")
