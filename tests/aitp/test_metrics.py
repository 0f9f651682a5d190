"""The figures a host's monitoring reads: what a session, a turn, a call and
a refusal add, the endpoint that serves them (its own address, a token when
set), and two processes of one host answering a scrape with their sum."""
from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from django.test import override_settings
from prometheus_client.parser import text_string_to_metric_families

from aitp_client import AitpClient, AitpRefused
from runtime import metrics, metrics_server
from tests.aitp.conftest import ADD_TO_CART, ORIGIN, open_page
from tests.aitp.test_agent import errors, fake, llm, open_shop, turn  # noqa: F401 (fixtures)
from tests.support.fake_anthropic import error_response, text_response

ROOT = Path(__file__).resolve().parents[2]
PATIENCE = 30.0
ADD_ONE = '/tool add_to_cart {"quantity": 1}'


def read(text: str) -> dict[tuple[str, frozenset], float]:
    return {(sample.name, frozenset(sample.labels.items())): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def value(found: dict, name: str, **labels: str) -> float:
    return found.get((name, frozenset(labels.items())), 0.0)


def figures() -> dict:
    return read(metrics.exposition()[0].decode())


def added(before: dict, after: dict, name: str, **labels: str) -> float:
    return value(after, name, **labels) - value(before, name, **labels)


async def until_done(page, timeout: float = PATIENCE) -> list[dict]:
    frames = []
    while True:
        frame = await page.recv(timeout)
        frames.append(frame)
        if frame["type"] == "AGENT_RESPONSE" and frame["payload"]["done"]:
            return frames


# --- what the product records (this process) --------------------------------------------


@pytest.mark.django_db(transaction=True)
async def test_a_turn_with_a_page_tool_counts_the_turn_its_call_its_time_and_its_first_text(
        connect, api_key):
    before = figures()
    page = await open_page(connect, api_key, tools=[ADD_TO_CART])
    await page.send("USER_INPUT", {"modality": "text", "content": ADD_ONE})
    call = await page.recv_until("TOOL_CALL", PATIENCE)
    await page.send("TOOL_RESULT", {"callId": call["payload"]["callId"], "status": "success",
                                    "result": {"cart": 1}})
    await until_done(page)
    during = figures()
    await page.close()
    after = figures()

    assert added(before, during, "owllayer_sessions_opened_total") == 1
    assert added(before, during, "owllayer_sessions_live") == 1
    assert added(before, after, "owllayer_sessions_live") == 0
    assert added(before, after, "owllayer_turns_total", outcome="answered") == 1
    assert added(before, after, "owllayer_turn_seconds_count") == 1
    assert added(before, after, "owllayer_time_to_first_token_seconds_count") == 1
    assert added(before, after, "owllayer_tool_call_seconds_count", origin="page", outcome="success") == 1
    assert added(before, after, "owllayer_database_call_seconds_count") > 0
    assert added(before, after, "owllayer_channel_layer_seconds_count", operation="join") >= 1


@pytest.mark.django_db(transaction=True)
async def test_a_page_tool_that_fails_is_counted_with_its_outcome(connect, api_key):
    before = figures()
    page = await open_page(connect, api_key, tools=[ADD_TO_CART])
    await page.send("USER_INPUT", {"modality": "text", "content": ADD_ONE})
    call = await page.recv_until("TOOL_CALL", PATIENCE)
    await page.send("TOOL_RESULT", {"callId": call["payload"]["callId"], "status": "error",
                                    "result": None, "error": "out of stock"})
    await until_done(page)
    await page.close()
    after = figures()

    assert added(before, after, "owllayer_tool_call_seconds_count", origin="page", outcome="error") == 1
    assert added(before, after, "owllayer_tool_call_seconds_count", origin="page", outcome="success") == 0


@pytest.mark.django_db(transaction=True)
async def test_the_models_tokens_are_counted_by_kind_and_its_failures_by_code(llm, connect, api_key):
    llm.enqueue(text_response("Hello!", usage={"input_tokens": 120, "output_tokens": 7,
                                                "cache_read_input_tokens": 50,
                                                "cache_creation_input_tokens": 30}),
                error_response(401))
    before = figures()
    page = await open_shop(connect, api_key)

    assert errors(await turn(page, "hi")) == []
    assert [e["data"]["code"] for e in errors(await turn(page, "and again"))] == ["auth_failed"]
    await page.close()
    after = figures()

    assert [added(before, after, "owllayer_llm_tokens_total", kind=kind)
            for kind in ("input", "output", "cache_read", "cache_write")] == [120, 7, 50, 30]
    assert added(before, after, "owllayer_llm_errors_total", code="auth_failed") == 1
    assert added(before, after, "owllayer_turns_total", outcome="answered") == 1
    assert added(before, after, "owllayer_turns_total", outcome="failed") == 1


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(("key", "code"), [("pk_live_" + "x" * 40, "invalid_api_key"),
                                           (None, "missing_api_key")],
                         ids=["a-wrong-key", "no-key"])
async def test_a_connection_refused_before_its_session_opens_is_counted_by_its_error_code(
        connect, api_key, key, code):
    before = figures()
    page = await connect()
    refusal = await page.handshake(key)
    assert refusal["payload"]["data"]["code"] == code
    await page.close()
    after = figures()

    assert added(before, after, "owllayer_session_refusals_total", code=code) == 1
    assert added(before, after, "owllayer_sessions_opened_total") == 0


@pytest.mark.django_db(transaction=True)
@override_settings(OWLLAYER_USER_INPUTS_PER_MINUTE=1)
async def test_an_input_over_the_rate_limit_counts_a_refused_turn_and_a_rate_limit_refusal(
        connect, api_key):
    before = figures()
    page = await open_page(connect, api_key)
    await page.send("USER_INPUT", {"modality": "text", "content": "hello"})
    await until_done(page)
    await page.send("USER_INPUT", {"modality": "text", "content": "hello again"})
    await until_done(page)
    await page.close()
    after = figures()

    assert added(before, after, "owllayer_turns_total", outcome="answered") == 1
    assert added(before, after, "owllayer_turns_total", outcome="refused") == 1
    assert added(before, after, "owllayer_rate_limited_total", limit="user_inputs") == 1


@pytest.mark.django_db(transaction=True)
async def test_with_metrics_off_a_session_and_its_turn_record_nothing(connect, api_key, settings):
    settings.OWLLAYER_METRICS = False
    before = figures()
    page = await open_page(connect, api_key)
    await page.send("USER_INPUT", {"modality": "text", "content": "hello"})
    await until_done(page)
    await page.close()

    assert figures() == before


# --- the endpoint ------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def endpoint(settings):
    """Start the endpoint on a free loopback port; ``endpoint(token)``."""
    servers = []

    def start(token: str = "") -> str:
        settings.OWLLAYER_METRICS_ADDRESS = f"127.0.0.1:{free_port()}"
        settings.OWLLAYER_METRICS_TOKEN = token
        server = metrics_server.start()
        assert server is not None
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def test_the_endpoint_serves_the_figures_in_prometheus_text_format_at_metrics_only(endpoint):
    url = endpoint()

    answer = httpx.get(url + "/metrics")
    elsewhere = httpx.get(url + "/")

    assert answer.status_code == 200
    assert answer.headers["content-type"].startswith("text/plain; version=")
    assert "owllayer_sessions_opened_total" in answer.text
    assert elsewhere.status_code == 404


@pytest.mark.parametrize("sent", [None, "Bearer not-the-token", "the-token"],
                         ids=["no-token", "a-wrong-token", "the-token-without-bearer"])
def test_with_a_token_set_a_scrape_without_it_is_refused(endpoint, sent):
    url = endpoint(token="the-token")

    answer = httpx.get(url + "/metrics", headers={"Authorization": sent} if sent else {})

    assert answer.status_code == 401
    assert "owllayer_" not in answer.text


def test_with_a_token_set_a_scrape_with_it_gets_the_figures(endpoint):
    url = endpoint(token="the-token")

    answer = httpx.get(url + "/metrics", headers={"Authorization": "Bearer the-token"})

    assert answer.status_code == 200
    assert "owllayer_sessions_opened_total" in answer.text


def test_the_endpoint_listens_on_the_loopback_address_unless_told_otherwise():
    env = {name: v for name, v in os.environ.items() if not name.startswith("OWLLAYER_METRICS")}
    shown = subprocess.run(
        [sys.executable, "-c", "import django; django.setup(); from django.conf import settings; "
                               "print(settings.OWLLAYER_METRICS, settings.OWLLAYER_METRICS_ADDRESS)"],
        env={**env, "DJANGO_SETTINGS_MODULE": "owllayer_site.settings"}, cwd=ROOT,
        capture_output=True, text=True, check=True).stdout.split()

    assert shown[0] == "True"
    host, _ = metrics_server.parse_address(shown[1])
    assert metrics_server.is_loopback(host)
    assert not metrics_server.is_loopback(metrics_server.parse_address("0.0.0.0:9464")[0])


def test_an_address_that_is_taken_is_logged_and_the_process_goes_on(settings, caplog):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        settings.OWLLAYER_METRICS_ADDRESS = f"127.0.0.1:{taken.getsockname()[1]}"
        settings.OWLLAYER_METRICS_DIR = ""

        assert metrics_server.start() is None

    assert "metrics not served" in caplog.text
    assert "OWLLAYER_METRICS_DIR" in caplog.text


# --- two processes of one host -------------------------------------------------------------


async def scrape(port: int) -> dict:
    async with httpx.AsyncClient() as http:
        answer = await http.get(f"http://127.0.0.1:{port}/metrics")
    assert answer.status_code == 200
    return read(answer.text)


async def a_turn_with_a_tool(server, raw_key: str) -> None:
    async with AitpClient(server.ws_url(), api_key=raw_key, origin=ORIGIN) as page:
        await page.context_update("/", "Home", [ADD_TO_CART], {})
        await page.user_input(ADD_ONE)
        call = await page.recv_until(lambda f: f["type"] == "TOOL_CALL", timeout=PATIENCE)
        await page.tool_result(call["payload"]["callId"], result={"cart": 1})
        await page.recv_until(lambda f: f["type"] == "AGENT_RESPONSE" and f["payload"]["done"],
                              timeout=PATIENCE)


async def a_wrong_key(server) -> None:
    with pytest.raises(AitpRefused) as refused:
        async with AitpClient(server.ws_url(), api_key="pk_live_" + "z" * 40, origin=ORIGIN):
            pass
    assert refused.value.code == "invalid_api_key"


@pytest.mark.django_db(transaction=True)
async def test_two_processes_sharing_a_host_answer_every_scrape_with_the_sum_of_both(
        daphne_factory, api_key, tmp_path):
    port = free_port()
    shared = {"OWLLAYER_METRICS_DIR": str(tmp_path / "metrics"),
              "OWLLAYER_METRICS_ADDRESS": f"127.0.0.1:{port}"}
    first, second = daphne_factory(shared), daphne_factory(shared)
    turns = {first: 3, second: 2}

    await asyncio.gather(*(a_turn_with_a_tool(server, api_key.raw)
                           for server, count in turns.items() for _ in range(count)))
    await asyncio.gather(a_wrong_key(first), a_wrong_key(second), a_wrong_key(second))

    scrapes = [await scrape(port) for _ in range(12)]
    for found in scrapes:
        assert value(found, "owllayer_turns_total", outcome="answered") == 5
        assert value(found, "owllayer_tool_call_seconds_count", origin="page", outcome="success") == 5
        assert value(found, "owllayer_sessions_opened_total") == 5
        assert value(found, "owllayer_session_refusals_total", code="invalid_api_key") == 3
        pids = {dict(labels).get("pid") for name, labels in found if name == "owllayer_process_draining"}
        assert pids == {str(first.process.pid), str(second.process.pid)}

    # A process that stops leaves its counts in the sum, and its live figures out of it.
    os.kill(second.process.pid, signal.SIGTERM)
    await asyncio.to_thread(second.process.wait, PATIENCE)
    found = await scrape(port)
    assert value(found, "owllayer_turns_total", outcome="answered") == 5
    assert {dict(labels).get("pid") for name, labels in found
            if name == "owllayer_process_draining"} == {str(first.process.pid)}


@pytest.mark.django_db(transaction=True)
async def test_a_figure_that_cannot_be_recorded_is_logged_and_the_turn_ends_as_ever(
        connect, api_key, monkeypatch, caplog):
    def broken() -> None:
        raise OSError("No space left on device")

    monkeypatch.setattr(metrics, "_made", broken)
    monkeypatch.setattr(metrics, "_failed_at", 0.0)
    page = await open_page(connect, api_key)
    await page.send("USER_INPUT", {"modality": "text", "content": "hello"})

    frames = await until_done(page)
    await page.close()

    assert frames[-1]["payload"]["done"] is True
    failures = [r for r in caplog.records if r.name == "runtime.metrics"]
    assert len(failures) == 1  # once, not once per figure
    assert "could not be recorded" in failures[0].getMessage()


@pytest.mark.django_db(transaction=True)
async def test_a_turn_cut_by_the_page_leaving_counts_as_cut_with_its_call_disconnected(connect, api_key):
    before = figures()
    page = await open_page(connect, api_key, tools=[ADD_TO_CART])
    await page.send("USER_INPUT", {"modality": "text", "content": ADD_ONE})
    await page.recv_until("TOOL_CALL", PATIENCE)

    await page.close()  # the call is never answered
    after = figures()

    assert added(before, after, "owllayer_turns_total", outcome="cut") == 1
    assert added(before, after, "owllayer_turns_total", outcome="answered") == 0
    assert added(before, after, "owllayer_tool_call_seconds_count", origin="page",
                 outcome="disconnected") == 1
