"""The live pages in Chromium against a real daphne process: the list and the
session page update without a reload, and the actions reach the page.

The "page" here is a plain WebSocket client speaking AITP; the operator is
a signed-in Chromium tab (its session cookie is made in the test database,
which the server process shares).
"""
from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Awaitable, Callable

import pytest
from asgiref.sync import sync_to_async
from django.conf import settings
from django.test import Client
from playwright.async_api import TimeoutError as PlaywrightTimeoutError
from websockets.asyncio.client import connect

from aitp import tenancy
from aitp.models import OperatorAction
from approvals.models import Approval
from demo.order_tools import demo_tools_install
from tests.browser.conftest import ARTIFACTS
from tests.operators.conftest import make_user

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

# Only a broken build waits this long.
SOON_MS = 15_000


class AitpPage:
    """A page on the AITP socket, as the SDK would speak."""

    def __init__(self, ws) -> None:
        self.ws = ws
        self.n = 0

    async def send(self, type_: str, payload: dict) -> None:
        self.n += 1
        await self.ws.send(json.dumps({"id": f"msg_{self.n}", "type": type_, "timestamp": 1,
                                       "payload": payload}))

    async def recv_until(self, type_: str, **payload_match) -> dict:
        while True:
            frame = json.loads(await asyncio.wait_for(self.ws.recv(), SOON_MS / 1000))
            if frame["type"] == type_ and all(
                frame["payload"].get(k) == v for k, v in payload_match.items()
            ):
                return frame


async def until_the_feed_shows_the_pages_frames(tab, page: AitpPage) -> None:
    """The subscription reaches the page's connection through the channel
    layer; on a loaded machine the watch page may say live first (after
    SUBSCRIBE_ANSWER_WAIT). The page's frames flow once the connection
    knows: move the page until a move shows in the feed, then back."""

    async def move(url: str) -> None:
        await page.send("CONTEXT_UPDATE", {"url": url, "title": "Your orders",
                                           "activeTools": [], "context": {"open_orders": 3}})
        await page.recv_until("SYSTEM_EVENT", kind="tools_effective")

    await until_the_feed_shows_moves(tab, move, back_to="/orders")


async def until_the_feed_shows_moves(tab, move: Callable[[str], Awaitable[None]], back_to: str) -> None:
    """Moves the page (``move(url)`` sends a context update and waits for its
    answer) until a move shows in the live feed, then back to ``back_to``."""
    for attempt in range(60):
        url = f"{back_to}?check={attempt}"
        await move(url)
        try:
            await tab.wait_for_function(
                "text => document.getElementById('live-feed').textContent.includes(text)",
                arg=url, timeout=1000)
            break
        except PlaywrightTimeoutError:
            continue
    else:
        raise AssertionError("the live feed never showed the page's frames")
    await move(back_to)


async def open_the_first(tab, details: str) -> None:
    """Opens the first ``details`` by its summary, as often as it takes: the
    record is swapped whenever the session changed, and a click whose press
    and release straddle a swap can be lost with the summary it pressed."""
    first = f"{details} >> nth=0"
    for _ in range(10):
        await tab.click(f"{first} >> summary")
        if await tab.eval_on_selector(first, "d => d.open"):
            return
    raise AssertionError(f"{first} never opened")


@pytest.fixture
def shop(daphne_factory):
    # A heartbeat far away: the list's periodic re-read cannot stand in for
    # the live events this test is about.
    server = daphne_factory(OWLLAYER_HEARTBEAT_INTERVAL="600")
    tenant = tenancy.tenant_create(slug="acme", name="Acme Store")
    _key, raw_key = tenancy.key_create(tenant=tenant, name="web",
                                       allowed_origins=[server.http_url])
    demo_tools_install(tenant=tenant, policy="operator")
    olivia = make_user("olivia", tenant=tenant)
    yield server, raw_key, olivia
    print(f"--- daphne log ---\n{server.logs()}")


async def screenshot(tab, request, step: str) -> None:
    """Saves the tab's whole page as <step>.png in this test's folder under
    test-artifacts/screenshots/ (OWLLAYER_TEST_ARTIFACTS picks the root)."""
    folder = ARTIFACTS / "screenshots" / re.sub(r"[^\w.-]+", "_", request.node.name)
    folder.mkdir(parents=True, exist_ok=True)
    await tab.screenshot(path=str(folder / f"{step}.png"), full_page=True)


async def operator_tab(browser, server, user):
    client = Client()
    await sync_to_async(client.force_login)(user)
    context = await browser.new_context()
    await context.add_cookies([{
        "name": settings.SESSION_COOKIE_NAME,
        "value": client.cookies[settings.SESSION_COOKIE_NAME].value,
        "url": server.http_url,
    }])
    tab = await context.new_page()
    tab.set_default_timeout(SOON_MS)
    errors: list[str] = []
    tab.on("pageerror", lambda exc: errors.append(str(exc)))
    return tab, errors


async def test_an_operator_watches_a_session_live_decides_its_approval_and_ends_it(browser, shop, request):
    server, raw_key, olivia = shop
    tab, errors = await operator_tab(browser, server, olivia)
    await tab.goto(f"{server.http_url}/admin/live/")
    await tab.wait_for_selector("#live-status.state-live")
    assert await tab.is_visible("#live-empty")

    async with connect(server.ws_url(api_key=raw_key), origin=server.http_url) as ws:
        page = AitpPage(ws)
        await page.send("HANDSHAKE_INIT", {"apiKey": raw_key, "userAgent": "pytest",
                                           "viewport": "1x1", "sdkVersion": "0.4.0",
                                           "protocolVersion": "1.0.0"})
        session_id = (await page.recv_until("HANDSHAKE_ACK"))["payload"]["sessionId"]
        await page.send("CONTEXT_UPDATE", {"url": "/orders", "title": "Your orders",
                                           "activeTools": [], "context": {"open_orders": 3}})
        await page.recv_until("SYSTEM_EVENT", kind="tools_effective")

        # The row appears and follows the page, without a reload.
        row = f"#session-{session_id}"
        await tab.wait_for_selector(f"{row} >> text=/orders")
        assert await tab.text_content(f"{row} .tenant") == "acme"

        await tab.click(f"{row} a")
        await tab.wait_for_selector("#live-status.state-live")
        await until_the_feed_shows_the_pages_frames(tab, page)

        # The agent's answer streams into the live feed; the record follows.
        await page.send("USER_INPUT", {"modality": "text", "content": "hello there"})
        answer = (await page.recv_until("AGENT_RESPONSE", done=True))["payload"]["chunk"]
        await tab.wait_for_function(
            "text => document.getElementById('live-feed').textContent.includes(text)",
            arg=answer[:40],
        )
        await tab.wait_for_selector("#conversation >> text=hello there")

        # A risky server tool waits for an operator; she approves it on this page.
        await page.send("USER_INPUT", {"modality": "text",
                                       "content": '/tool cancel_order {"number": "A1003"}'})
        await tab.wait_for_selector(".pending-approval textarea")
        await tab.fill(".pending-approval textarea", "customer asked by phone")
        await tab.click(".pending-approval button[value=approve]")
        await page.recv_until("AGENT_RESPONSE", done=True)
        approval = await Approval.objects.select_related("operator").aget(session_id=session_id)
        assert approval.status == "approved" and approval.operator.username == "olivia"
        await tab.wait_for_selector(".operator-decision >> text=customer asked by phone")
        await tab.wait_for_selector(".messagelist >> text=Approved: cancel_order runs now.")

        # The user's words are shown as written; the page they were on is a
        # detail that opens.
        await tab.wait_for_selector("#conversation .turn-block.kind-text >> text=hello there")
        assert "[page]" not in await tab.text_content("#conversation")
        detail = "#conversation details.kind-page"
        assert not await tab.is_visible(f"{detail} pre")
        await open_the_first(tab, detail)
        await tab.wait_for_selector(f"{detail} >> nth=0 >> pre >> text=open_orders")

        # The record is fetched again as the session goes on; what she opened stays open.
        await page.send("USER_INPUT", {"modality": "text", "content": "one more thing"})
        await page.recv_until("AGENT_RESPONSE", done=True)
        await tab.wait_for_selector("#conversation >> text=one more thing")
        assert await tab.is_visible(f"{detail} >> nth=0 >> pre >> text=open_orders")
        await screenshot(tab, request, "01-live-session")

        # Ending it asks first: declined, nothing is sent.
        questions: list[str] = []

        async def decline(dialog) -> None:
            questions.append(dialog.message)
            await dialog.dismiss()

        await tab.fill("#end-message", "Closing for maintenance.")
        await tab.evaluate("""() => document.getElementById("command-end").addEventListener(
            "submit", (event) => { window.endPrevented = event.defaultPrevented; })""")
        tab.once("dialog", decline)
        await tab.click("#command-end button")
        await tab.wait_for_function("window.endPrevented === true")
        assert "End this session?" in questions[0] and "Closing for maintenance." in questions[0]

        # Confirmed, it closes the page's socket with 1008 and hides the actions.
        async def confirm(dialog) -> None:
            await dialog.accept()

        tab.once("dialog", confirm)
        await tab.click("#command-end button")
        event = await page.recv_until("SYSTEM_EVENT", kind="disconnect")
        assert event["payload"]["message"] == "Closing for maintenance."
        await ws.wait_closed()
        assert ws.close_code == 1008
    await tab.wait_for_selector("#session-actions", state="hidden")
    await tab.wait_for_selector("#operator-actions >> text=Session ended")
    await screenshot(tab, request, "02-session-ended")
    assert await OperatorAction.objects.filter(session_id=session_id, action="session_end").acount() == 1
    assert not errors, f"page script errors: {errors}"
