"""A tenant's own site for the widget's browser tests: a tiny HTTP server of
another origin whose page holds the console's snippet and a script of its
own (two page tools through window.OwlLayer, and what it saw). A test module
takes the site by importing `host_site` from here."""
from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from axe_playwright_python.async_playwright import Axe
from django.test import RequestFactory
from playwright.async_api import Page, expect

from aitp import tenancy
from widget.assets import embed_snippet

# The host page's own script: two tools through the API, and what it saw.
PAGE_JS = """
window.seen = { messages: [], errors: [], violations: [], ready: 0 };
document.addEventListener("securitypolicyviolation", (e) => window.seen.violations.push(e.violatedDirective));
OwlLayer.registerTool({
  name: "look_up_order", description: "Look up where an order is", risk: "low",
  parameters: { type: "OBJECT", properties: { orderId: { type: "STRING" } }, required: ["orderId"] },
}, ({ orderId }) => {
  document.getElementById("order").textContent = "looked up " + orderId;
  return { orderId, status: "shipped" };
});
OwlLayer.registerTool({
  name: "pay", description: "Pay for the cart with the saved card", risk: "critical",
  parameters: { type: "OBJECT", properties: { amount: { type: "NUMBER" } }, required: ["amount"] },
}, ({ amount }) => {
  document.getElementById("paid").textContent = "paid " + amount;
  return { paid: true, amount };
});
OwlLayer.setContext({ page: "cart", total: 249.99 });
OwlLayer.on("ready", () => { window.seen.ready += 1; });
OwlLayer.on("message", (m) => window.seen.messages.push(m));
OwlLayer.on("error", (e) => window.seen.errors.push(e));
"""

# The host's own styles at their worst: every element of its own reset and
# hidden, tiny text everywhere. The widget's shadow root keeps its look.
HOSTILE_CSS = """
body > :not(owllayer-widget) { all: unset !important; display: none !important; }
* { all: unset !important; display: none; }
html, body { display: block !important; }
div, button, textarea, dialog, p, span { font-size: 1px !important; color: transparent !important; }
owllayer-widget { display: none !important; opacity: 0 !important; }
"""


def host_page(snippet: str, *, hostile: bool = False) -> str:
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8"><title>Plain Shop</title>'
        + ('<link rel="stylesheet" href="/hostile.css">' if hostile else "")
        + '</head><body><main><h1>Plain Shop</h1><p id="order">no order</p><p id="paid">not paid</p></main>\n'
        + snippet
        + '<script type="module" src="/page.js"></script>\n</body></html>'
    )


@dataclass
class HostSite:
    """A tiny HTTP server on its own port: the tenant's site, another origin."""

    files: dict[str, tuple[str, str]] = field(default_factory=dict)
    csp: str | None = None
    port: int = 0

    @property
    def origin(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@pytest.fixture
def host_site() -> Iterator[HostSite]:
    site = HostSite()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            found = site.files.get(self.path.split("?")[0])
            if found is None:
                self.send_error(404)
                return
            body, content_type = found
            self.send_response(200)
            self.send_header("Content-Type", content_type)
            self.send_header("Cache-Control", "no-store")
            if site.csp and content_type.startswith("text/html"):
                self.send_header("Content-Security-Policy", site.csp)
            self.end_headers()
            self.wfile.write(body.encode())

        def log_message(self, *args: object) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    site.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield site
    server.shutdown()
    server.server_close()


def unpinned(snippet: str) -> str:
    """The snippet as a page that pins no release writes it: /widget/v1/, no integrity."""
    snippet, named = re.subn(r"/widget/\d+\.\d+\.\d+/", "/widget/v1/", snippet)
    snippet, hashed = re.subn(r'integrity="sha384-[^"]+" ', "", snippet)
    assert (named, hashed) == (1, 1)
    return snippet


def publish(site: HostSite, llm_store, *, allowed_origins: list[str], hostile: bool = False,
            pinned: bool = True, visitor_token: str | None = None) -> str:
    """Put the snippet of a new key (allowing `allowed_origins`) on the host's page; the key.
    `visitor_token`: the page vouches for its visitor, as a tenant's backend writes it into the tag."""
    key, raw_key = tenancy.key_create(tenant=llm_store.key.tenant, name="widget",
                                      allowed_origins=allowed_origins)
    request = RequestFactory().get("/", HTTP_HOST=f"127.0.0.1:{llm_store.server.port}")
    snippet = embed_snippet(request, raw_key)
    if visitor_token:
        snippet = snippet.replace(f'data-api-key="{raw_key}"',
                                  f'data-api-key="{raw_key}" data-visitor-token="{visitor_token}"')
    site.files["/"] = (host_page(snippet if pinned else unpinned(snippet), hostile=hostile),
                       "text/html; charset=utf-8")
    site.files["/page.js"] = (PAGE_JS, "text/javascript; charset=utf-8")
    site.files["/hostile.css"] = (HOSTILE_CSS, "text/css; charset=utf-8")
    return raw_key


def agent_messages(page: Page):
    return page.locator("owllayer-widget .msg.agent[aria-busy=false]")


async def ask(page: Page, text: str) -> None:
    await page.locator("owllayer-widget textarea").fill(text)
    await page.locator("owllayer-widget textarea").press("Enter")


async def open_widget(page: Page, site: HostSite) -> None:
    await page.goto(site.origin + "/")
    launcher = page.get_by_role("button", name="Open chat")
    await expect(launcher).to_be_visible()
    await launcher.click()
    await expect(page.locator("owllayer-widget .status")).to_have_text("Online")


async def no_serious_violations(page: Page) -> None:
    """axe-core finds no serious or critical issue in the widget."""
    results = await Axe().run(page, context={"include": [["owllayer-widget"]]})
    serious = [(v["id"], v["impact"], v["help"]) for v in results.response["violations"]
               if v["impact"] in ("serious", "critical")]
    assert serious == []
