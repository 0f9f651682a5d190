"""Acting like a shopper in the demo store, for the browser tests (the
store's fixtures are in conftest.py)."""
from __future__ import annotations

import json
from collections.abc import Callable

from playwright.async_api import Page, expect

from aitp.models import Session, ToolCall
from tests.browser.conftest import SOON, Store, eventually

expect.set_options(timeout=SOON * 1000)


# --- acting like a shopper ---------------------------------------------------------


def status(page: Page):
    return page.locator("#owl-status")


def answers(page: Page):
    return page.locator(".owl-msg-agent[data-done=true]")


async def open_store(page: Page, store: Store) -> None:
    await page.goto(store.url)
    await expect(status(page)).to_have_text("connected")


async def send(page: Page, text: str) -> None:
    await page.fill("#owl-input", text)
    await page.press("#owl-input", "Enter")


async def say(page: Page, text: str) -> str:
    """Send a chat message; the agent's complete answer once the turn ended."""
    before = await answers(page).count()
    await send(page, text)
    await expect(answers(page)).to_have_count(before + 1)
    await expect(page.locator("#owl-activity")).to_have_attribute("data-activity", "idle")
    return await answers(page).nth(before).inner_text()


async def nothing_dropped(page: Page) -> None:
    owl = await page.evaluate("window.__owl")
    assert owl["dropped"] == 0, owl["droppedReasons"]


async def session_when(page: Page, ready: Callable[[Session], bool]) -> Session:
    """The page's session row, once ready(row) holds (the server writes it
    shortly after the frame that changed it)."""
    session_id = await page.evaluate("window.__owl.sessionId")
    row = None

    async def check() -> bool:
        nonlocal row
        row = await Session.objects.aget(id=session_id)
        return ready(row)

    await eventually(check, what=f"session {session_id} to be ready")
    return row


def tool_names(session: Session) -> list[str]:
    return [tool["name"] for tool in session.tools]


OPEN_STATUSES = {ToolCall.Status.PENDING, ToolCall.Status.SENT,
                 ToolCall.Status.AWAITING_APPROVAL, ToolCall.Status.RUNNING}


async def tool_calls(name: str) -> list[ToolCall]:
    """The calls of that tool, once each has its final status (the server
    writes it right after the page's answer, which the page may show first)."""
    calls: list[ToolCall] = []

    async def all_final() -> bool:
        nonlocal calls
        calls = [call async for call in ToolCall.objects.filter(name=name).order_by("created_at")]
        return bool(calls) and not any(call.status in OPEN_STATUSES for call in calls)

    await eventually(all_final, what=f"every {name} call to have its final status")
    return calls


def offered_tools(request: dict) -> list[str]:
    return [tool["name"] for tool in request.get("tools", [])]


def tool_results(request: dict) -> list[dict]:
    """The tool_result blocks of a Messages API request's last (user) message."""
    content = request["messages"][-1]["content"]
    if isinstance(content, str):
        return []
    return [block for block in content if block.get("type") == "tool_result"]


def result_data(block: dict) -> dict:
    content = block["content"]
    if isinstance(content, list):
        content = "".join(part.get("text", "") for part in content)
    return json.loads(content)
