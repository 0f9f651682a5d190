"""In Chromium, against a real daphne process: when a session starts waiting
for a person and an approval starts waiting for an operator, the counts in
the admin's header and the live list's row change without a reload, the
browser is notified, and the count leads to the approvals waiting."""
from __future__ import annotations

import pytest
from asgiref.sync import sync_to_async
from django.utils import timezone
from playwright.async_api import expect

from tests.browser.test_admin_widths import SOON_MS, superuser_tab
from tests.operators.conftest import operator_approval
from tests.support.people import make_session, make_user

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

# What the page's notifications said, kept in the page: a headless browser
# shows none to look at.
RECORD_NOTIFICATIONS = """
window.notified = [];
const BrowserNotification = window.Notification;
window.Notification = class extends BrowserNotification {
  constructor(title, options) {
    super(title, options);
    window.notified.push(options.body);
  }
};
"""


@pytest.fixture
def admin_server(daphne_factory):
    # A heartbeat far away: the sessions stay live while the test runs.
    server = daphne_factory(OWLLAYER_HEARTBEAT_INTERVAL="600")
    yield server
    print(f"--- daphne log ---\n{server.logs()}")


def two_shops():
    from aitp import tenancy

    acme = tenancy.tenant_create(slug="acme", name="Acme Store")
    globex = tenancy.tenant_create(slug="globex", name="Globex")
    return make_user("olivia", tenant=acme), make_session(acme, "ses_acme"), make_session(globex, "ses_globex")


def wait_for_a_person(*sessions):
    from aitp.models import Session

    Session.objects.filter(pk__in=[s.pk for s in sessions]).update(
        handoff_requested_at=timezone.now(), handoff_reason="wants a refund")


async def test_the_header_counts_and_the_live_list_change_without_a_reload_and_the_browser_is_notified(
        browser, admin_server):
    olivia, acme_session, globex_session = await sync_to_async(two_shops)()
    context, tab, errors = await superuser_tab(browser, admin_server, olivia)
    try:
        await context.grant_permissions(["notifications"], origin=admin_server.http_url)
        await context.add_init_script(RECORD_NOTIFICATIONS)
        await tab.goto(admin_server.http_url + "/admin/live/")
        counts = tab.locator("#alert-counts")
        await expect(counts).to_have_text("0 waiting for a person · 0 approvals waiting", use_inner_text=True)
        await expect(counts).to_have_class("alert-counts alert-quiet")
        # Allowed already: nothing to ask.
        await expect(tab.locator("#alert-permission")).to_be_hidden()
        await expect(tab.locator("#session-ses_acme td.state")).not_to_contain_text("waits for a person")
        await tab.evaluate("window.sameDocument = true")

        # Another tenant's session waits too: not Olivia's to count.
        await sync_to_async(wait_for_a_person)(acme_session, globex_session)
        await sync_to_async(operator_approval)(acme_session)
        # The next read, within data-every-seconds (5).
        await expect(counts).to_have_text("1 waiting for a person · 1 approval waiting", use_inner_text=True,
                                          timeout=SOON_MS)
        await expect(tab.locator("#alert-waiting")).to_have_class("alert-active")
        await expect(tab.locator("#session-ses_acme td.state")).to_contain_text(
            "waits for a person: wants a refund")
        await expect(tab.locator("#session-ses_globex")).to_have_count(0)
        assert await tab.evaluate("window.sameDocument") is True
        assert await tab.evaluate("window.notified") == ["1 waiting for a person · 1 approval waiting"]

        await tab.locator("#alert-approvals").click()
        await expect(tab.locator("#result_list tbody tr")).to_have_count(1)
        await expect(tab.locator("#result_list")).to_contain_text("refund")
        assert errors == []
    finally:
        await context.close()


async def test_allow_notifications_is_offered_while_the_browser_has_not_been_asked(browser, admin_server):
    olivia, _, _ = await sync_to_async(two_shops)()
    context, tab, errors = await superuser_tab(browser, admin_server, olivia)
    try:
        await tab.goto(admin_server.http_url + "/admin/")
        await expect(tab.locator("#alert-counts")).to_be_visible()
        if await tab.evaluate("Notification.permission") != "default":
            pytest.skip("this Chromium answers for notifications without asking")
        await expect(tab.locator("#alert-permission")).to_have_text("Allow notifications")
        assert errors == []
    finally:
        await context.close()
