"""Fixtures for the browser tests: Chromium through Playwright's async API, the
demo store on a real daphne process, and a scripted AITP server for the
client's wire behaviour.

The async API: the sync one keeps an event loop running on the test's
thread, which makes Django refuse ORM calls and fights pytest-asyncio.
"""
from __future__ import annotations

import asyncio
import itertools
import json
import os
import re
import shutil
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import parse_qs, quote, urlsplit

import pytest
from playwright.async_api import Browser, Page
from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response

from tests.support.daphne import PROJECT_ROOT, DaphneFactory, DaphneServer
from tests.support.fake_anthropic import FakeAnthropicServer

if TYPE_CHECKING:
    from aitp.models import ApiKey

CLIENT_JS = Path(__file__).resolve().parents[2] / "static" / "owllayer" / "owllayer-client.js"
# Where the fake server serves the client module; pages import it from there.
CLIENT_PATH = "/owllayer-client.js"
# The microphone's AudioWorklet, which the client loads from beside itself.
WORKLET_JS = CLIENT_JS.with_name("owllayer-voice-worklet.js")
WORKLET_PATH = "/owllayer-voice-worklet.js"
# Upper bound for anything the page or the server should do "soon"; only a
# broken build waits this long.
SOON = 15.0
PAGE_PATH = "/shop/headphones"
# `make test` points each pass at its own folder; CI keeps them.
ARTIFACTS = Path(os.environ.get("OWLLAYER_TEST_ARTIFACTS") or PROJECT_ROOT / "test-artifacts")
MODEL_API_KEY = "sk-ant-demo-store-tests"


async def eventually(predicate: Callable[[], Awaitable[bool] | bool], *, timeout: float = SOON,
                     what: str = "condition") -> None:
    """Wait until predicate() is true; fail with `what` after `timeout` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        outcome = predicate()
        if asyncio.iscoroutine(outcome):
            outcome = await outcome
        if outcome:
            return
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


@pytest.fixture
async def page(browser: Browser) -> AsyncIterator[Page]:
    context = await browser.new_context(viewport={"width": 1280, "height": 800})
    page = await context.new_page()
    page.set_default_timeout(SOON * 1000)
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    try:
        yield page
    finally:
        await context.close()
    # A script error in the page is a bug even when the scenario passed.
    assert not errors, f"page script errors: {errors}"


# --- the demo store on a real server ------------------------------------------


@dataclass
class Store:
    """The store on one daphne process, with a key of a fresh tenant."""

    factory: DaphneFactory
    server: DaphneServer
    raw_key: str
    key: ApiKey
    env: dict[str, str] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"{self.server.http_url}/demo/?apiKey={quote(self.raw_key, safe='')}"

    def restart(self) -> None:
        """Stop the server and start a new one on the same port (pages reconnect there)."""
        self.server.stop()
        self.server = self.factory(self.env, port=self.server.port)


def start_store(factory: DaphneFactory, env: dict[str, str]) -> Store:
    from aitp import tenancy

    server = factory(env)
    tenant = tenancy.tenant_create(slug="owl-store", name="Owl Store")
    key, raw_key = tenancy.key_create(
        tenant=tenant, name="browser", allowed_origins=[server.http_url]
    )
    return Store(factory=factory, server=server, raw_key=raw_key, key=key, env=env)


def print_logs(store: Store) -> None:
    # Captured output: pytest shows it only when the test failed.
    for server in store.factory.servers:
        print(f"--- daphne log ({server!r}) ---\n{server.logs()}")


@pytest.fixture
def store(daphne_factory) -> Iterator[Store]:
    """The store with the offline agent: "/tool <name> {json}" calls a page tool."""
    started = start_store(daphne_factory, {"OWLLAYER_LLM": "offline"})
    yield started
    print_logs(started)


@pytest.fixture
def demo_store(daphne_factory) -> Iterator[Store]:
    """The store as a server without a model key runs it: no OWLLAYER_LLM, no
    ANTHROPIC_API_KEY, so the demo assistant (llm/demo.py) answers."""
    # None removes a variable from the server's environment (DaphneFactory).
    no_model: dict = {"OWLLAYER_LLM": None, "ANTHROPIC_API_KEY": None}
    started = start_store(daphne_factory, no_model)
    yield started
    print_logs(started)


@pytest.fixture
def model() -> Iterator[FakeAnthropicServer]:
    """The fake Messages API; tests script its answers with enqueue()."""
    with FakeAnthropicServer(api_key=MODEL_API_KEY) as server:
        yield server


@pytest.fixture
def llm_store(daphne_factory, model) -> Iterator[Store]:
    """The store with the anthropic agent, the real SDK talking to `model`."""
    started = start_store(daphne_factory, {
        "OWLLAYER_LLM": "anthropic",
        "ANTHROPIC_API_KEY": MODEL_API_KEY,
        "ANTHROPIC_BASE_URL": model.base_url,
        "OWLLAYER_LLM_MAX_RETRIES": "0",
    })
    yield started
    print_logs(started)


@pytest.fixture
def shot(request: pytest.FixtureRequest, page: Page) -> Callable[[str], Awaitable[Path]]:
    """shot("step") saves a full-page screenshot as NN-step.png in this test's folder."""
    folder = ARTIFACTS / "screenshots" / re.sub(r"[^\w.-]+", "_", request.node.name)
    shutil.rmtree(folder, ignore_errors=True)
    numbers = itertools.count(1)

    async def take(step: str) -> Path:
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{next(numbers):02d}-{step}.png"
        await page.screenshot(path=str(path), full_page=True)
        return path

    return take


# --- a scripted AITP server for the client's wire behaviour --------------------


def frame(type_: str, payload: dict, **envelope) -> str:
    body = {"id": f"msg_{uuid.uuid4()}", "type": type_, "timestamp": 1706000000000,
            "payload": payload}
    body.update(envelope)
    return json.dumps(body)


def ack(**payload) -> str:
    return frame("HANDSHAKE_ACK", {
        "sessionId": "ses_fake", "serverVersion": "0.4.0", "protocolVersion": "1.0.0",
        "capabilities": ["text", "tools"], **payload,
    })


@dataclass
class FakeConnection:
    ws: ServerConnection
    query: dict
    received: list[dict] = field(default_factory=list)

    async def recv(self, timeout: float | None = SOON) -> dict:
        message = json.loads(await asyncio.wait_for(self.ws.recv(), timeout))
        self.received.append(message)
        return message

    async def recv_type(self, type_: str) -> dict:
        while True:
            message = await self.recv()
            if message["type"] == type_:
                return message

    async def send(self, text: str) -> None:
        await self.ws.send(text)

    @property
    def close_code(self) -> int | None:
        return self.ws.close_code

    @property
    def close_reason(self) -> str | None:
        return self.ws.close_reason


Script = Callable[[FakeConnection], Awaitable[None]]


class FakeAitpServer:
    """Serves ws://127.0.0.1:<port>/owllayer, where each connection runs
    `script`, and plain HTTP pages (``pages``) from the same origin, among
    them the client module at CLIENT_PATH (read at each request, so a page
    always gets the file as it is on disk).

    After the script returns, the connection is read until the page closes
    it, so every frame the page sent is in ``received``.
    """

    def __init__(self, script: Script) -> None:
        self.script = script
        self.connections: list[FakeConnection] = []
        self.pages: dict[str, str] = {}
        self.port = 0

    def _serve_page(self, connection: ServerConnection, request: Request) -> Response | None:
        path = urlsplit(request.path).path
        if path == "/owllayer":
            return None  # the WebSocket handshake goes on
        if path == CLIENT_PATH:
            return self._respond(connection, CLIENT_JS.read_text(), "text/javascript; charset=utf-8")
        if path == WORKLET_PATH:
            return self._respond(connection, WORKLET_JS.read_text(), "text/javascript; charset=utf-8")
        if path not in self.pages:
            return connection.respond(404, "not found\n")
        return self._respond(connection, self.pages[path], "text/html; charset=utf-8")

    @staticmethod
    def _respond(connection: ServerConnection, body: str, content_type: str) -> Response:
        # Chromium runs a module script only with a JavaScript MIME type.
        response = connection.respond(200, body)
        del response.headers["Content-Type"]
        response.headers["Content-Type"] = content_type
        return response

    async def _handle(self, ws: ServerConnection) -> None:
        query = parse_qs(urlsplit(ws.request.path).query)
        connection = FakeConnection(ws, query)
        self.connections.append(connection)
        try:
            await self.script(connection)
            while True:
                await connection.recv(timeout=None)
        except ConnectionClosed:
            return  # the page closed: what it sent is recorded

    @property
    def endpoint(self) -> str:
        return f"ws://127.0.0.1:{self.port}/owllayer"

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    @property
    def page_url(self) -> str:
        return self.url(PAGE_PATH)


@pytest.fixture
async def fake_server() -> AsyncIterator[Callable[[Script], Awaitable[FakeAitpServer]]]:
    """start(script) -> a running FakeAitpServer on a free 127.0.0.1 port.

    Ask for it before ``page`` so that the page closes first: its sockets
    then go away before the server waits for them.
    """
    started = []

    async def start(script: Script) -> FakeAitpServer:
        fake = FakeAitpServer(script)
        server = await serve(fake._handle, "127.0.0.1", 0, process_request=fake._serve_page)
        fake.port = server.sockets[0].getsockname()[1]
        started.append(server)
        return fake

    try:
        yield start
    finally:
        for server in started:
            server.close()
            await server.wait_closed()


def module_page(script: str, title: str = "Pro Headphones - Store") -> str:
    """A bare HTML page whose only script is the module `script`."""
    return (
        f"<!doctype html><html><head><title>{title}</title></head><body>"
        f'<script type="module">{script}</script>'
        "</body></html>"
    )


async def open_client_page(page: Page, fake: FakeAitpServer, setup: str = "") -> None:
    """Load a bare page that imports the client module from the fake server's
    own origin, and wait until the page's `client` exists.

    (A page Playwright fulfils itself counts as a public site, and Chromium
    then blocks its socket to 127.0.0.1.) `setup` runs with `client` in
    scope before connect(); `window.client` is the same object, so the
    tests' page.evaluate() calls can name it `client`.
    """
    fake.pages[PAGE_PATH] = module_page(
        f'import {{ OwlLayerClient }} from "{CLIENT_PATH}";'
        "window.agentEvents = [];"
        f"const client = new OwlLayerClient({{apiKey: 'pk_live_fake', endpoint: '{fake.endpoint}'}});"
        "window.client = client;"
        "client.on('agent', (e) => window.agentEvents.push(e));"
        f"{setup}"
        "client.connect();"
    )
    await page.goto(fake.page_url)
    # A module runs after parsing, once its import arrived: normally before
    # the load event goto() waits for. A failed import then fails here, not
    # in a later wait that looks unrelated.
    await page.wait_for_function("window.client !== undefined")


# Every violation the page sees, whatever reports it: the console message and
# the DOM event (which also catches blocked inline styles and connections).
WATCH_VIOLATIONS = """
window.__cspViolations = [];
document.addEventListener("securitypolicyviolation", (event) => {
  window.__cspViolations.push(event.violatedDirective + " " + event.blockedURI);
});
"""
