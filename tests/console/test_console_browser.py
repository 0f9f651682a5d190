"""The console in Chromium against a real daphne process: a new key's page
with its copy buttons and embed snippet, the warning before narrowing a key's
origins ends live sessions, the members page without Remove for the last
owner, and the usage page. Each step's screenshot is saved under
test-artifacts/screenshots/<test>/."""
from __future__ import annotations

import re
from datetime import timedelta

import pytest
from asgiref.sync import sync_to_async
from django.conf import settings
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from aitp import tenancy
from aitp.models import ApiKey, DailyUsage, Session
from tenants.models import TenantMembership
from tests.browser.conftest import ARTIFACTS
from widget import releases

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

# Only a broken build waits this long.
SOON_MS = 15_000
SHOP = "https://shop.example"
OTHER_SHOP = "https://other.example"


@pytest.fixture
def console(daphne_factory, django_user_model):
    server = daphne_factory()
    tenant = tenancy.tenant_create(slug="acme", name="Acme Store")
    owner = django_user_model.objects.create_user(username="olivia", password=None)
    TenantMembership.objects.create(tenant=tenant, user=owner, role=TenantMembership.Role.OWNER)
    viewer = django_user_model.objects.create_user(username="victor", password=None)
    TenantMembership.objects.create(tenant=tenant, user=viewer, role=TenantMembership.Role.VIEWER)
    yield server, tenant, owner
    print(f"--- daphne log ---\n{server.logs()}")


async def owner_tab(browser, server, user, request):
    client = Client()
    await sync_to_async(client.force_login)(user)
    context = await browser.new_context()
    await context.grant_permissions(["clipboard-read", "clipboard-write"], origin=server.http_url)
    await context.add_cookies([{
        "name": settings.SESSION_COOKIE_NAME,
        "value": client.cookies[settings.SESSION_COOKIE_NAME].value,
        "url": server.http_url,
    }])
    tab = await context.new_page()
    tab.set_default_timeout(SOON_MS)
    errors: list[str] = []
    tab.on("pageerror", lambda exc: errors.append(str(exc)))
    folder = ARTIFACTS / "screenshots" / re.sub(r"[^\w.-]+", "_", request.node.name)
    folder.mkdir(parents=True, exist_ok=True)

    async def shot(step: str) -> None:
        await tab.screenshot(path=str(folder / f"{step}.png"), full_page=True)

    return tab, errors, shot


async def test_a_new_key_is_copied_with_its_snippet_and_narrowing_its_origins_warns_first(
    browser, console, request
):
    server, tenant, owner = console
    tab, errors, shot = await owner_tab(browser, server, owner, request)

    await tab.goto(server.http_url + reverse("console:key_create", args=["acme"]))
    await tab.fill("input[name=name]", "storefront")
    await tab.fill("textarea[name=allowed_origins]", f"{SHOP}\n{OTHER_SHOP}")
    await tab.click("button[type=submit] >> text=Create key")

    raw_key = (await tab.text_content("[data-new-key]")).strip()
    snippet = await tab.text_content("[data-embed-snippet]")
    release = releases.load().current
    assert snippet.startswith(f'<script type="module" src="{server.http_url}/widget/{release}/owllayer-widget.js"')
    assert 'integrity="sha384-' in snippet and 'crossorigin="anonymous"' in snippet
    assert f'data-api-key="{raw_key}"></script>' in snippet

    await tab.click("button[data-copy=embed-snippet]")
    await tab.wait_for_selector("button[data-copy=embed-snippet] >> text=Copied")
    assert await tab.evaluate("navigator.clipboard.readText()") == snippet
    await tab.click("button[data-copy=new-key]")
    await tab.wait_for_selector("button[data-copy=new-key] >> text=Copied")
    assert await tab.evaluate("navigator.clipboard.readText()") == raw_key
    await shot("01-new-key")

    # Two pages are open on the key, one from each origin; dropping one origin
    # ends one of them, and the owner is told so before anything changes.
    key = await ApiKey.objects.aget(tenant=tenant)
    for number, origin in enumerate((SHOP, OTHER_SHOP)):
        await Session.objects.acreate(id=f"ses_live{number}", tenant=tenant, api_key=key,
                                      origin=origin, last_seen_at=timezone.now())
    await tab.goto(server.http_url + reverse("console:key_edit", args=["acme", key.pk]))
    await tab.wait_for_selector("text=This key has 2 live sessions now.")
    await tab.fill("textarea[name=allowed_origins]", SHOP)
    await tab.click(".panel form button[type=submit]")
    await tab.wait_for_selector("[data-origins-warning] >> text=1 live session will end.")
    await shot("02-origins-warning")
    assert (await ApiKey.objects.aget(pk=key.pk)).allowed_origins == [SHOP, OTHER_SHOP]

    await tab.click("button[type=submit] >> text=Save and end 1 session")
    await tab.wait_for_selector(".messages >> text=1 live session from removed origins is being ended.")
    assert (await ApiKey.objects.aget(pk=key.pk)).allowed_origins == [SHOP]
    assert not errors, f"page script errors: {errors}"


async def test_the_members_and_usage_pages_read_at_a_glance(browser, console, request):
    server, tenant, owner = console
    today = timezone.localdate()
    await DailyUsage.objects.acreate(tenant=tenant, date=today, sessions=3, turns=5,
                                     input_tokens=1200, output_tokens=300)
    await DailyUsage.objects.acreate(tenant=tenant, date=today - timedelta(days=9), sessions=1,
                                     turns=1, input_tokens=200, output_tokens=40)
    tab, errors, shot = await owner_tab(browser, server, owner, request)

    await tab.goto(server.http_url + reverse("console:members", args=["acme"]))
    owner_row = tab.locator("tr", has_text="olivia")
    viewer_row = tab.locator("tr", has_text="victor")
    assert await owner_row.locator("text=last owner").count() == 1
    assert await owner_row.locator("a", has_text="Remove").count() == 0
    assert await viewer_row.locator("a", has_text="Remove").count() == 1
    await shot("01-members")

    await tab.goto(server.http_url + reverse("console:usage", args=["acme"]))
    assert await tab.locator("[data-table=daily] tbody tr").count() == 2
    ticks = await tab.locator("[data-chart=sessions] text.tick").all_text_contents()
    assert len(ticks) == 5 and ticks[-1] == f"{today.day} {today:%b}"
    await shot("02-usage")
    assert not errors, f"page script errors: {errors}"


async def test_an_invitation_is_sent_accepted_by_a_new_person_and_shown_to_the_owner(
    browser, console, request
):
    """The owner invites an address; the link, read from the e-mail the
    server prints in debug mode, lets a new person make an account and join."""
    server, tenant, owner = console
    tab, errors, shot = await owner_tab(browser, server, owner, request)

    await tab.goto(server.http_url + reverse("console:members", args=["acme"]))
    await tab.fill("input[name=email]", "nina@shop.example")
    await tab.select_option("select[name=role]", "viewer")
    await tab.click("button[type=submit] >> text=Send invitation")
    await tab.wait_for_selector(".messages >> text=Invitation sent to nina@shop.example.")
    pending = tab.locator("[data-table=invitations] tr", has_text="nina@shop.example")
    assert await pending.locator("button", has_text="Withdraw").count() == 1
    await shot("01-invitation-sent")

    link = await _link_in_the_printed_email(server, "nina@shop.example")
    invitee = await (await browser.new_context()).new_page()
    invitee.set_default_timeout(SOON_MS)
    invitee.on("pageerror", lambda exc: errors.append(str(exc)))
    await invitee.goto(link)
    assert "token" not in invitee.url  # moved into the session at once
    await invitee.wait_for_selector("text=olivia invites")
    await invitee.fill("input[name=username]", "nina")
    await invitee.fill("input[name=password1]", "a long pass phrase")
    await invitee.fill("input[name=password2]", "a long pass phrase")
    folder = ARTIFACTS / "screenshots" / re.sub(r"[^\w.-]+", "_", request.node.name)
    await invitee.screenshot(path=str(folder / "02-invitee-makes-an-account.png"), full_page=True)
    await invitee.click("button[type=submit] >> text=Make my account and accept")
    await invitee.wait_for_selector(".messages >> text=You joined Acme Store as viewer.")
    await invitee.screenshot(path=str(folder / "03-invitee-joined.png"), full_page=True)
    assert await TenantMembership.objects.filter(tenant=tenant, user__username="nina",
                                                 role="viewer").aexists()

    await tab.reload()
    assert await tab.locator("tr[data-member]", has_text="nina").count() == 1
    assert await tab.locator("[data-table=invitations]").count() == 0
    await shot("04-owner-sees-the-new-member")
    assert not errors, f"page script errors: {errors}"


async def _link_in_the_printed_email(server, address: str) -> str:
    """The invitation link of the e-mail to ``address`` the server printed
    (Django's console e-mail backend, the default in debug mode)."""
    import asyncio

    deadline = asyncio.get_running_loop().time() + SOON_MS / 1000
    pattern = re.compile(r"To: " + re.escape(address) + r".*?(http://\S+/console/invitation/\?token=[\w-]+)",
                         re.DOTALL)
    while (found := pattern.search(server.logs())) is None:
        assert asyncio.get_running_loop().time() < deadline, server.logs()[-3000:]
        await asyncio.sleep(0.05)
    return found.group(1)
