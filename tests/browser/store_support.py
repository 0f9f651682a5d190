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


WIDGET = "owllayer-widget"


def status(page: Page):
    """The widget's status line ("Online", "Writing…", "Working: add_to_cart…")."""
    return page.locator(f"{WIDGET} .status")


def answers(page: Page):
    """The agent's answers, each once complete."""
    return page.locator(f"{WIDGET} .msg.agent[aria-busy=false]")


def launcher(page: Page):
    return page.locator(f"{WIDGET} .launcher")


def chat_input(page: Page):
    return page.locator(f"{WIDGET} textarea")


def ended_line(page: Page):
    """Why nothing can be sent any more, in the message box's place."""
    return page.locator(f"{WIDGET} form .ended")


def tool_line(page: Page, name: str):
    """The widget's line for the last call of that page tool ("Done: Add to cart")."""
    return page.locator(f"{WIDGET} .tool[data-tool={name}]").last


def mic(page: Page):
    return page.locator(f"{WIDGET} button.mic")


def heard(page: Page):
    """The shopper's spoken messages, as the server heard them."""
    return page.locator(f"{WIDGET} .msg.user[data-voice=true]")


def notes(page: Page):
    return page.locator(f"{WIDGET} .note")


def widget_error(page: Page):
    return page.locator(f"{WIDGET} .error")


def approval(page: Page):
    return page.locator(f"{WIDGET} dialog[open]")


async def open_panel(page: Page) -> None:
    """Open the widget's panel when it is closed."""
    await expect(launcher(page)).to_be_visible()
    if await launcher(page).get_attribute("aria-expanded") != "true":
        await launcher(page).click()
    await expect(page.locator(f"{WIDGET} section.panel")).to_be_visible()


async def open_store(page: Page, store: Store) -> None:
    await page.goto(store.url)
    await open_panel(page)
    await expect(status(page)).to_have_text("Online")


async def send(page: Page, text: str) -> None:
    await chat_input(page).fill(text)
    await chat_input(page).press("Enter")


async def idle(page: Page) -> None:
    """The turn is over: the status line says Online again."""
    await expect(status(page)).to_have_text("Online")


async def say(page: Page, text: str) -> str:
    """Send a chat message; the agent's answer once the turn ended (its last
    bubble: words said before a page tool's line are a bubble of their own)."""
    before = await answers(page).count()
    await send(page, text)
    await expect(answers(page).nth(before)).to_be_attached()
    await idle(page)
    return await answers(page).last.inner_text()


async def wire(page: Page, path: str = "") -> object:
    """What the widget's connection saw (OwlLayer.diagnostics()), or one field of it ("sessionId")."""
    return await page.evaluate(f"OwlLayer.diagnostics(){'.' + path if path else ''}")


async def nothing_dropped(page: Page) -> None:
    owl = await wire(page)
    assert owl["dropped"] == 0, owl["droppedReasons"]


async def session_when(page: Page, ready: Callable[[Session], bool]) -> Session:
    """The page's session row, once ready(row) holds (the server writes it
    shortly after the frame that changed it)."""
    session_id = await wire(page, "sessionId")
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
