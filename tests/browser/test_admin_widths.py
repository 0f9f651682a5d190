"""Every change list of the admin shows all its columns in a 1280 x 800
Chromium window: neither the page nor the results table scrolls sideways.

A superuser visits each registered model's change list, with a few rows of
real length in each; a screenshot of every list is saved under
test-artifacts/screenshots/<test>/."""
from __future__ import annotations

import re

import pytest
from asgiref.sync import sync_to_async
from django.conf import settings
from django.contrib import admin
from django.test import Client
from django.urls import reverse

from tests.browser.conftest import ARTIFACTS
from tests.support.admin_rows import MOMENT, admin_rows

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

SOON_MS = 15_000

# Where the page, the list's own box and its table end, and what sticks out.
MEASURE = """() => {
  const page = document.documentElement;
  const results = document.querySelector('#changelist .results') || document.querySelector('#content-main');
  const table = document.querySelector('#result_list') || document.querySelector('#content-main table');
  const right = results.getBoundingClientRect().right;
  const outside = table ? [...table.querySelectorAll('thead th')]
      .filter((th) => th.getBoundingClientRect().right > right + 0.5)
      .map((th) => th.textContent.trim()) : [];
  return {
    pageScroll: page.scrollWidth, pageClient: page.clientWidth,
    boxScroll: results.scrollWidth, boxClient: results.clientWidth,
    rows: table ? table.querySelectorAll('tbody tr').length : 0,
    columns: table ? [...table.querySelectorAll('thead th')].map((th) => th.textContent.trim()) : [],
    outside,
  };
}"""


def every_change_list() -> list[tuple[str, str]]:
    return sorted(
        (f"{model._meta.app_label}.{model._meta.model_name}",
         reverse(f"admin:{model._meta.app_label}_{model._meta.model_name}_changelist"))
        for model in admin.site._registry
    )


async def superuser_tab(browser, server, user):
    """A 1280 x 800 tab signed in as ``user``, and the page errors it meets."""
    client = Client()
    await sync_to_async(client.force_login)(user)
    context = await browser.new_context(viewport={"width": 1280, "height": 800})
    await context.add_cookies([{
        "name": settings.SESSION_COOKIE_NAME,
        "value": client.cookies[settings.SESSION_COOKIE_NAME].value,
        "url": server.http_url,
    }])
    tab = await context.new_page()
    tab.set_default_timeout(SOON_MS)
    errors: list[str] = []
    tab.on("pageerror", lambda exc: errors.append(str(exc)))
    return context, tab, errors


@pytest.fixture
def admin_server(daphne_factory):
    # A heartbeat far away: the open sessions stay open while the pages are read.
    server = daphne_factory(OWLLAYER_HEARTBEAT_INTERVAL="600")
    yield server
    print(f"--- daphne log ---\n{server.logs()}")


async def test_every_change_list_shows_all_its_columns_at_1280_pixels(browser, admin_server, request):
    server = admin_server
    rows = await sync_to_async(admin_rows)()
    context, tab, errors = await superuser_tab(browser, server, rows.root)
    folder = ARTIFACTS / "screenshots" / re.sub(r"[^\w.-]+", "_", request.node.name)
    folder.mkdir(parents=True, exist_ok=True)

    clipped = {}
    lists = every_change_list()
    try:
        for name, path in lists:
            # The review queue lists what still waits by default: all of it here.
            query = "?review=all" if name == "approvals.reviewedapproval" else ""
            answer = await tab.goto(server.http_url + path + query)
            assert answer.status == 200, f"{name}: {answer.status}"
            await tab.screenshot(path=str(folder / f"{name}.png"), full_page=True)
            seen = await tab.evaluate(MEASURE)
            assert seen["rows"] >= 2, f"{name} lists {seen['rows']} rows"
            if (seen["pageScroll"] > seen["pageClient"] or seen["boxScroll"] > seen["boxClient"]
                    or seen["outside"]):
                clipped[name] = seen
    finally:
        await context.close()

    assert len(lists) >= 18
    assert not clipped, "\n".join(
        f"{name}: page {seen['pageScroll']}/{seen['pageClient']} px, list {seen['boxScroll']}/"
        f"{seen['boxClient']} px, past the edge: {seen['outside']}" for name, seen in clipped.items())
    assert not errors, errors


async def test_the_live_list_writes_a_sessions_start_on_hover_as_every_page_does(browser, admin_server, request):
    from django.utils.formats import date_format

    from aitp.models import Session

    rows = await sync_to_async(admin_rows)()
    session = rows.sessions[0]
    await Session.objects.filter(pk=session.pk).aupdate(last_activity_at=MOMENT.replace(hour=9, minute=7))
    context, tab, errors = await superuser_tab(browser, admin_server, rows.root)
    try:
        await tab.goto(admin_server.http_url + reverse("operators:live_list"))
        row = f"#session-{session.pk}"
        started = await tab.get_attribute(f"{row} td.started", "title")
        activity = await tab.get_attribute(f"{row} td.activity", "title")
        folder = ARTIFACTS / "screenshots" / re.sub(r"[^\w.-]+", "_", request.node.name)
        folder.mkdir(parents=True, exist_ok=True)
        await tab.screenshot(path=str(folder / "live-list.png"), full_page=True)
    finally:
        await context.close()

    # The page's script writes what owl_display writes on the server.
    assert started == f"{date_format(MOMENT, 'DATETIME_FORMAT')} UTC" == "3 Dec 2026, 14:05 UTC"
    assert activity == "3 Dec 2026, 09:07 UTC"
    assert not errors, errors
