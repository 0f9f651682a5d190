"""A reload in the middle of an answer, with the demo store behind nginx in
front of two daphne processes: the example block (docs/nginx/owllayer.conf)
as tests/test_reverse_proxy.py runs it, with both processes as its upstream.

With ``hash $remote_addr consistent;`` in place of ``least_conn;`` (docs/
operations.md, "The reverse proxy") a visitor stays on one process, so the
reloaded page's socket reaches the process holding the session and gets the
rest of the answer, once. A reload that nginx sends to the other process
gets it too: that process's socket relays the session, which goes on where
it runs (over Redis).

Chromium opens the store over TLS at nginx (the test's own certificate
authority: the page's context ignores certificate errors), so the key allows
the origin ``https://127.0.0.1:<nginx's port>``. The processes are the
daphne_factory's (without --proxy-headers: nothing here reads the client's
address, and every client is 127.0.0.1). To send a reload to the other
process, the test marks the first one ``down`` and reloads nginx (SIGHUP):
the page's open socket stays where it is until the page closes it.
"""
from __future__ import annotations

import re
import signal
import subprocess
import threading
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest
from asgiref.sync import sync_to_async
from playwright.async_api import Browser, Page, expect

from aitp.models import ServerProcess, Session
from tests.browser.conftest import MODEL_API_KEY, SOON
from tests.browser.store_support import (
    WIDGET,
    answers,
    idle,
    nothing_dropped,
    open_panel,
    say,
    send,
    session_when,
    status,
    wire,
)
from tests.support.certificates import CertificateAuthority
from tests.support.daphne import DaphneFactory, DaphneServer, free_port
from tests.support.fake_anthropic import (
    FakeAnthropicServer,
    StreamedMessage,
    TextBlock,
    text_response,
)
from tests.test_reverse_proxy import NGINX_BLOCK, SERVER_NAME, main_conf, nginx_binary, wait_for_port

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

# The balancing line of the example, and the one docs/operations.md gives to
# keep each visitor on one process.
LEAST_CONN = "least_conn;"
STICKY = "hash $remote_addr consistent;"
# The example's two upstream addresses, in the order of its lines.
EXAMPLE_UPSTREAMS = ("127.0.0.1:8001", "127.0.0.1:8002")
NGINX_STOP_TIMEOUT = 10.0

# A long answer the model writes slowly: word00 ... word79, one word a delta.
WORDS = [f"word{number:02d}" for number in range(80)]
WORD_DELTAS = [WORDS[0]] + [" " + word for word in WORDS[1:]]
LONG_ANSWER = "".join(WORD_DELTAS)
# The stream waits after this many deltas (after message_start,
# content_block_start and the first ping) until the test lets it go on.
DELTAS_BEFORE_THE_RELOAD = 20
BEFORE_THE_RELOAD = "".join(WORD_DELTAS[:DELTAS_BEFORE_THE_RELOAD])
QUESTION = "Tell me eighty words."
NEXT_QUESTION = "Which word came last?"
NEXT_ANSWER = "The last word was word79."


# --- nginx in front of two processes ---------------------------------------------------


def proxy_block(*, upstreams: list[tuple[int, bool]], balance: str, http_port: int,
                https_port: int, cert: Path, key: Path) -> str:
    """The example block with this machine's ports and certificate, ``balance``
    in place of ``least_conn;`` and each example upstream replaced by
    ``(port, down)``: a ``down`` one gets no new connections."""
    text = NGINX_BLOCK.read_text()
    changes = [
        (LEAST_CONN, balance),
        ("listen 80;", f"listen 127.0.0.1:{http_port};"),
        ("listen [::]:80;", ""),
        ("listen 443 ssl;", f"listen 127.0.0.1:{https_port} ssl;"),
        ("listen [::]:443 ssl;", ""),
        ("ssl_certificate /etc/ssl/owllayer/fullchain.pem;", f"ssl_certificate {cert};"),
        ("ssl_certificate_key /etc/ssl/owllayer/privkey.pem;", f"ssl_certificate_key {key};"),
    ]
    for example, (port, down) in zip(EXAMPLE_UPSTREAMS, upstreams, strict=True):
        [line] = re.findall(rf"^\s*server {re.escape(example)} [^\n]*;$", text, re.MULTILINE)
        new = line.replace(example, f"127.0.0.1:{port}")
        changes.append((line, new[:-1] + " down;" if down else new))
    for old, new in changes:
        assert text.count(old) == 1, f"{old!r} is not in {NGINX_BLOCK} exactly once"
        text = text.replace(old, new)
    return text


@dataclass
class Nginx:
    """Debian's nginx in the foreground, everything in ``directory``."""

    directory: Path
    cert: Path
    key: Path
    http_port: int = field(default_factory=free_port)
    https_port: int = field(default_factory=free_port)
    process: subprocess.Popen | None = None

    @property
    def origin(self) -> str:
        return f"https://127.0.0.1:{self.https_port}"

    def configure(self, upstreams: list[tuple[int, bool]], balance: str) -> None:
        (self.directory / "owllayer.conf").write_text(proxy_block(
            upstreams=upstreams, balance=balance, http_port=self.http_port,
            https_port=self.https_port, cert=self.cert, key=self.key))

    def start(self) -> None:
        (self.directory / "nginx.conf").write_text(main_conf(self.directory))
        with open(self.directory / "nginx-output.log", "wb") as out:
            self.process = subprocess.Popen(
                [nginx_binary(), "-p", str(self.directory), "-e", str(self.error_log),
                 "-c", str(self.directory / "nginx.conf"), "-g", "daemon off;"],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            )
        wait_for_port(self.https_port, self.process, self.error_log)

    @property
    def error_log(self) -> Path:
        return self.directory / "error.log"

    def log(self) -> str:
        try:
            return self.error_log.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def reload(self, upstreams: list[tuple[int, bool]], balance: str) -> None:
        """Reconfigure: new connections follow the new block once this returns
        (the old worker keeps the connections it has until they close)."""
        assert self.process is not None and self.process.poll() is None
        self.configure(upstreams, balance)
        started_before = self.log().count("start worker process ")
        self.process.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + SOON
        # The master starts the new worker, then tells the old one to stop
        # accepting: its "gracefully shutting down" comes after that.
        while not (self.log().count("start worker process ") > started_before
                   and "gracefully shutting down" in self.log().split("reconfiguring")[-1]):
            assert self.process.poll() is None, f"nginx exited:\n{self.log()}"
            assert time.monotonic() < deadline, f"nginx did not reload:\n{self.log()}"
            time.sleep(0.05)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGQUIT)  # nginx's graceful stop
            try:
                self.process.wait(NGINX_STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(NGINX_STOP_TIMEOUT)


@dataclass
class ProxiedStore:
    """The store on two daphne processes behind nginx, with a key of a fresh tenant."""

    factory: DaphneFactory
    servers: list[DaphneServer]
    nginx: Nginx
    raw_key: str

    @property
    def url(self) -> str:
        return f"{self.nginx.origin}/demo/?apiKey={quote(self.raw_key, safe='')}"

    def server_of(self, process_id: str) -> DaphneServer:
        """The daphne process a session row's ``process`` names."""
        row = ServerProcess.objects.get(id=process_id)
        [server] = [server for server in self.servers if server.process.pid == row.pid]
        return server

    def other_than(self, server: DaphneServer) -> DaphneServer:
        [other] = [each for each in self.servers if each is not server]
        return other

    def route_only_to(self, server: DaphneServer, balance: str) -> None:
        """nginx sends new connections to ``server`` alone."""
        self.nginx.reload([(each.port, each is not server) for each in self.servers], balance)


def model_env(model: FakeAnthropicServer) -> dict[str, str]:
    """The anthropic agent, the real SDK talking to the fake Messages API."""
    return {
        "OWLLAYER_LLM": "anthropic",
        "ANTHROPIC_API_KEY": MODEL_API_KEY,
        "ANTHROPIC_BASE_URL": model.base_url,
        "OWLLAYER_LLM_MAX_RETRIES": "0",
    }


@pytest.fixture
def behind_nginx(daphne_factory, model, tmp_path):
    """start(balance) -> the store on two processes behind nginx balancing with ``balance``."""
    nginx_binary()  # skips (or fails in CI) before anything starts
    ca = CertificateAuthority.create("Reload Test CA")
    cert, key = ca.issue(tmp_path, SERVER_NAME)
    nginx = Nginx(tmp_path, cert, key)
    started: list[ProxiedStore] = []

    def start(balance: str) -> ProxiedStore:
        from aitp import tenancy

        # As docs/operations.md runs them behind a proxy that ends TLS.
        env = {**model_env(model), "OWLLAYER_HTTPS": "true",
               "OWLLAYER_TRUST_X_FORWARDED_PROTO": "true", "ALLOWED_HOSTS": "127.0.0.1"}
        servers = [daphne_factory(env), daphne_factory(env)]
        nginx.configure([(server.port, False) for server in servers], balance)
        nginx.start()
        tenant = tenancy.tenant_create(slug="owl-store", name="Owl Store")
        _, raw_key = tenancy.key_create(tenant=tenant, name="browser",
                                        allowed_origins=[nginx.origin])
        store = ProxiedStore(daphne_factory, servers, nginx, raw_key)
        started.append(store)
        return store

    try:
        yield start
    finally:
        nginx.stop()
        for store in started:
            for server in store.servers:
                print(f"--- daphne log ({server!r}) ---\n{server.logs()}")
        print(f"--- nginx error log ---\n{nginx.log()}")


@pytest.fixture
async def page(browser: Browser) -> AsyncIterator[Page]:
    """A page that accepts nginx's certificate (the test's own authority)."""
    context = await browser.new_context(viewport={"width": 1280, "height": 800},
                                        ignore_https_errors=True)
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


@pytest.fixture
def held_answer(model) -> Iterator[threading.Event]:
    """The model's long answer, held after DELTAS_BEFORE_THE_RELOAD deltas
    until the event is set, then the answer to the next question."""
    go_on = threading.Event()
    model.enqueue(
        StreamedMessage(blocks=[TextBlock(WORD_DELTAS)], event_delay=0.05, hold=go_on,
                        hold_after_events=3 + DELTAS_BEFORE_THE_RELOAD),
        text_response(NEXT_ANSWER),
    )
    yield go_on
    go_on.set()  # a stream still held ends with the test


# --- what the page and the processes show ----------------------------------------------


def messages(page: Page):
    """The widget's messages, the visitor's and the agent's."""
    return page.locator(f"{WIDGET} .log > .msg")


async def entry_texts(page: Page) -> list[str]:
    """What the widget's log shows, entry by entry: messages, notes, tool lines."""
    return [text.strip() for text in await page.locator(f"{WIDGET} .log > *").all_inner_texts()]


def spoken(request: dict) -> list[str]:
    """The conversation's text blocks in a Messages API request, without the page's."""
    return [block["text"] for message in request["messages"] for block in message["content"]
            if block["type"] == "text" and not block["text"].startswith("[page]")]


def sockets_opened(*servers: DaphneServer) -> list[int]:
    """The page sockets each daphne accepted so far (its access log's WSCONNECT lines)."""
    return [len(re.findall(r'"WSCONNECT /owllayer"', server.logs())) for server in servers]


async def both_up(store: ProxiedStore) -> None:
    """Each process is registered and ready, answering on its own address."""
    async with httpx.AsyncClient(trust_env=False) as http:
        for server in store.servers:
            ready = await http.get(f"{server.http_url}/readyz")
            assert ready.status_code == 200 and ready.json()["status"] == "ready", ready.text
    pids = {row.pid async for row in ServerProcess.objects.filter(stopped_at__isnull=True)}
    assert {server.process.pid for server in store.servers} <= pids


async def session_row(page: Page) -> Session:
    return await Session.objects.aget(id=await wire(page, "sessionId"))


async def ask_and_hold(page: Page, store: ProxiedStore) -> tuple[Session, DaphneServer]:
    """Open the store through nginx and ask: the answer is held half way.
    The page's session row and the process serving it."""
    await page.goto(store.url)
    await open_panel(page)
    await expect(status(page)).to_have_text("Online")
    await send(page, QUESTION)
    await expect(messages(page).last).to_have_text(BEFORE_THE_RELOAD)
    row = await session_row(page)
    assert row.process, "the session row names no process"
    return row, await sync_to_async(store.server_of)(row.process)


# --- the tests ---------------------------------------------------------------------------


async def completed_once(page: Page, first: Session) -> Session:
    """The reloaded page shows the conversation again, the whole answer once,
    and was sent the rest of it, numbered on from where it left off; its
    session row, continued once."""
    await expect(answers(page)).to_have_count(1)
    await expect(answers(page)).to_have_text(LONG_ANSWER)
    await idle(page)
    # The question read back from the server, then the answer, once.
    assert await entry_texts(page) == [QUESTION, LONG_ANSWER]
    frames = await wire(page, "frames")
    assert frames[0]["type"] == "HANDSHAKE_ACK" and frames[0]["payload"]["resumed"] is True
    assert frames[0]["payload"]["sessionId"] == first.id and frames[0]["meta"]["seq"] > 0
    assert await wire(page, "repeated") == 0
    return await session_when(page, lambda row: row.resumes == 1)


async def asked_next_with_the_whole_answer(page: Page, model: FakeAnthropicServer) -> None:
    answer = await say(page, NEXT_QUESTION)

    assert answer == NEXT_ANSWER
    assert len(model.requests) == 2
    assert spoken(model.requests[-1]) == [QUESTION, LONG_ANSWER, NEXT_QUESTION]
    assert await entry_texts(page) == [QUESTION, LONG_ANSWER, NEXT_QUESTION, NEXT_ANSWER]
    await expect(status(page)).to_have_text("Online")
    await nothing_dropped(page)


async def test_behind_nginx_keeping_a_visitor_on_one_process_a_reload_mid_answer_completes_it_once(
        behind_nginx, model, held_answer, page):
    store = await sync_to_async(behind_nginx)(STICKY)
    await both_up(store)
    first, serving = await ask_and_hold(page, store)
    other = store.other_than(serving)
    opened = sockets_opened(serving, other)

    # The model goes on while the page reloads: some of what it writes reaches
    # no page, the rest reaches the reloaded one.
    held_answer.set()
    await page.reload()

    after = await completed_once(page, first)
    # The reloaded page's socket reached the process that held the session.
    assert (after.id, after.process) == (first.id, first.process)
    assert sockets_opened(serving, other) == [opened[0] + 1, opened[1]]
    await asked_next_with_the_whole_answer(page, model)
    assert sockets_opened(serving, other) == [opened[0] + 1, opened[1]]


@pytest.mark.redis
async def test_behind_nginx_a_reload_that_reaches_the_other_process_is_relayed_and_completes_the_answer_once(
        behind_nginx, model, held_answer, page):
    store = await sync_to_async(behind_nginx)(LEAST_CONN)
    await both_up(store)
    first, serving = await ask_and_hold(page, store)
    other = store.other_than(serving)

    # The answer is still being written on the first process when the
    # reloaded page reaches the other one.
    await sync_to_async(store.route_only_to)(other, LEAST_CONN)
    opened = sockets_opened(serving, other)
    held_answer.set()
    await page.reload()

    after = await completed_once(page, first)
    # The page's socket is the other process's; the session stays where it runs.
    assert (after.id, after.process) == (first.id, first.process)
    assert sockets_opened(serving, other) == [opened[0], opened[1] + 1]
    await asked_next_with_the_whole_answer(page, model)
