"""Traces of the agent's turns (OWLLAYER_TRACES, runtime/tracing.py): one trace
per turn, its spans in the turn's shape, the trace carried into a webhook's
request and onto the turn's log lines, and sent to a collector over OTLP/HTTP
by a real server process.

The turns run through the real consumer, the real SDK and the fake Messages
API (tests/aitp/test_agent.py); the spans are read from an in-memory
exporter, or from a small OTLP/HTTP receiver on 127.0.0.1.
"""
from __future__ import annotations

import asyncio
import io
import ipaddress
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from aitp.models import TurnRecord
from aitp_client import AitpClient
from runtime import logs, tracing
from tests.aitp.conftest import ADD_TO_CART, ORIGIN, in_db
from tests.aitp.test_agent import (  # noqa: F401 (fixtures)
    approval_request,
    close,
    errors,
    fake,
    llm,
    open_shop,
    start_payment,
    turn,
    until_done,
)
from tests.support.fake_anthropic import text_response, tool_use_response

pytestmark = [pytest.mark.django_db(transaction=True)]

PATIENCE = 30.0
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def spans(settings, monkeypatch):
    """Traces on, their spans kept in memory as they end."""
    monkeypatch.setattr(tracing, "_memory", None)
    settings.OWLLAYER_TRACES = True
    exporter = tracing.record_in_memory()
    yield exporter
    exporter.clear()


async def ended(exporter, name: str = "turn", count: int = 1) -> list:
    """The spans ended so far, once ``count`` spans ``name`` are among them
    (a turn's span ends just after the page reads its done frame)."""
    for _ in range(int(PATIENCE / 0.01)):
        found = list(exporter.get_finished_spans())
        if sum(s.name == name for s in found) >= count:
            return found
        await asyncio.sleep(0.01)
    raise AssertionError(f"no {count} span(s) {name!r}: {[s.name for s in found]}")


def parent_name(span, by_id: dict) -> str | None:
    if span.parent is None:
        return None
    return by_id[span.parent.span_id].name


def shape(found: list) -> set[tuple[str | None, str]]:
    """(parent's name, name) of every span."""
    by_id = {s.context.span_id: s for s in found}
    return {(parent_name(s, by_id), s.name) for s in found}


# --- the shape of a turn --------------------------------------------------------------------


async def test_a_turn_with_a_page_call_its_user_approved_is_one_trace_shaped_like_the_turn(
    llm, connect, api_key, settings, spans
):
    page, call = await start_payment(llm, connect, api_key, settings)
    await page.send("APPROVAL_REQUEST", approval_request(call))
    await page.send("APPROVAL_RESPONSE", {"callId": call["payload"]["callId"], "approved": True,
                                          "result": {"paid": 42}})
    frames = await until_done(page)
    found = await ended(spans)
    await close(page)

    assert errors(frames) == []
    assert len({s.context.trace_id for s in found}) == 1
    (root,) = [s for s in found if s.parent is None]
    assert root.name == "turn"
    assert dict(root.attributes) == {"session_id": page.session_id, "turn": 1, "outcome": "answered"}
    assert {("turn", "model"), ("turn", "tool_call"), ("tool_call", "approval_wait"),
            ("turn", "store.checkpoint"), ("tool_call", "store.mark_call"),
            ("turn", "store.finish_call")} <= shape(found)
    models = [s for s in found if s.name == "model"]
    assert len(models) == 2
    assert models[0].attributes["model"] == "claude-test-model"
    assert models[0].attributes["input_tokens"] > 0
    (tool_call,) = [s for s in found if s.name == "tool_call"]
    assert dict(tool_call.attributes) == {"tool": "pay", "origin": "page", "status": "success"}
    (waited,) = [s for s in found if s.name == "approval_wait"]
    assert tool_call.start_time <= waited.start_time <= waited.end_time <= tool_call.end_time


async def test_the_turns_record_keeps_the_id_of_its_trace(llm, connect, api_key, spans):
    llm.enqueue(text_response("Hello."))
    page = await open_shop(connect, api_key)
    await turn(page, "hi")
    found = await ended(spans)
    await close(page)

    (root,) = [s for s in found if s.name == "turn"]
    record = await TurnRecord.objects.aget(session_id=page.session_id, number=1)
    assert record.trace_id == format(root.context.trace_id, "032x")


async def test_with_traces_off_the_turns_record_has_no_trace_id(llm, connect, api_key):
    llm.enqueue(text_response("Hello."))
    page = await open_shop(connect, api_key)
    await turn(page, "hi")
    await close(page)

    record = await TurnRecord.objects.aget(session_id=page.session_id, number=1)
    assert record.trace_id == ""


async def test_a_server_tool_the_user_approves_waits_for_the_approval_in_a_span_of_its_call(
    llm, connect, api_key, tenant, settings, spans
):
    await in_db(offer_cancel_order)(tenant)
    llm.enqueue(tool_use_response([("toolu_cancel", "cancel_order", {"number": "A1003"})]),
                text_response("Cancelled."))
    page = await open_shop(connect, api_key)
    await page.send("USER_INPUT", {"modality": "text", "content": "cancel it"})
    request = await page.recv_until("APPROVAL_REQUEST")
    await page.send("APPROVAL_RESPONSE", {"callId": request["payload"]["callId"], "approved": True})
    await until_done(page)
    found = await ended(spans)
    await close(page)

    assert ("tool_call", "approval_wait") in shape(found)
    (waited,) = [s for s in found if s.name == "approval_wait"]
    assert dict(waited.attributes) == {"asked_by": "server", "decision": "approved"}
    (tool_call,) = [s for s in found if s.name == "tool_call"]
    assert dict(tool_call.attributes) == {"tool": "cancel_order", "origin": "server", "status": "success"}
    assert ("tool_call", "store.approval_request_server") in shape(found)


def offer_cancel_order(tenant) -> None:
    from demo.order_tools import demo_tools_install

    demo_tools_install(tenant=tenant, policy="user")


# --- off ------------------------------------------------------------------------------------


async def test_with_traces_off_a_turn_exports_nothing_and_a_span_is_the_shared_no_op(
    llm, connect, api_key, settings, spans
):
    settings.OWLLAYER_TRACES = False
    llm.enqueue(text_response("Hello."))
    page = await open_shop(connect, api_key)
    await turn(page, "hi")
    await close(page)

    assert spans.get_finished_spans() == ()
    with tracing.trace("turn", turn=1) as root, tracing.span("model") as child:
        assert root is child is tracing.NO_SPAN
        assert tracing.current_trace_id() == ""
        headers: dict[str, str] = {}
        tracing.inject(headers)
        assert headers == {}
    assert spans.get_finished_spans() == ()


def test_outside_a_turn_a_span_is_the_no_op_even_with_traces_on(spans):
    with tracing.span("store.flush") as child:
        assert child is tracing.NO_SPAN
    assert spans.get_finished_spans() == ()


# --- a webhook joins the trace --------------------------------------------------------------


class _Headers(BaseHTTPRequestHandler):
    received: list[dict[str, str]] = []

    def log_message(self, *args) -> None:
        pass

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        type(self).received.append(dict(self.headers))
        body = b'{"ok": true}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def webhook(settings) -> Iterator[tuple[str, list[dict[str, str]]]]:
    """(url of a webhook receiver on 127.0.0.1, the headers of what it received)."""
    settings.OWLLAYER_WEBHOOK_ALLOWED_NETWORKS = (ipaddress.ip_network("127.0.0.1/32"),)
    received: list[dict[str, str]] = []
    handler = type("Handler", (_Headers,), {"received": received})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/hook", received
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def offer_webhook(tenant, url: str) -> None:
    from approvals.models import ServerTool

    ServerTool.objects.create(tenant=tenant, name="look_up", description="Looks it up",
                              kind=ServerTool.Kind.WEBHOOK, webhook_url=url,
                              webhook_networks="127.0.0.1/32")


async def test_a_webhook_request_carries_the_traceparent_of_the_turns_trace(
    llm, connect, api_key, tenant, spans, webhook
):
    url, received = webhook
    await in_db(offer_webhook)(tenant, url)
    llm.enqueue(tool_use_response([("toolu_look", "look_up", {})]), text_response("Found it."))
    page = await open_shop(connect, api_key)
    frames = await turn(page, "look it up")
    found = await ended(spans)
    await close(page)

    assert errors(frames) == []
    (headers,) = received
    version, trace_id, parent_id, flags = headers["traceparent"].split("-")
    (root,) = [s for s in found if s.name == "turn"]
    (called,) = [s for s in found if s.name == "webhook"]
    assert version == "00" and int(flags, 16) & 1  # sampled
    assert trace_id == format(root.context.trace_id, "032x")
    assert parent_id == format(called.context.span_id, "016x")
    assert ("tool_call", "webhook") in shape(found)
    assert dict(called.attributes) == {"tool": "look_up", "status_code": 200}


async def test_a_webhook_that_does_not_answer_ends_its_span_as_an_error(spans, webhook):
    from opentelemetry.trace import StatusCode

    from approvals.webhooks import ToolRunError, call_webhook

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]
    with tracing.trace("turn"), pytest.raises(ToolRunError):
        await call_webhook(url=f"http://127.0.0.1:{closed}/hook", secret="s", tool="look_up",
                           arguments={}, session_id="ses_1", call_id="tc_1", timeout=5.0)

    (called,) = [s for s in spans.get_finished_spans() if s.name == "webhook"]
    assert called.status.status_code == StatusCode.ERROR


# --- the log lines --------------------------------------------------------------------------


async def test_the_json_log_lines_of_a_traced_turn_carry_its_trace_id(
    llm, connect, api_key, spans, caplog
):
    written = io.StringIO()
    handler = logging.StreamHandler(written)
    handler.addFilter(logs.SessionFields())
    handler.setFormatter(logs.JsonFormatter())
    caplog.set_level(logging.INFO, logger="agent.loop")
    logging.getLogger("agent.loop").addHandler(handler)
    try:
        llm.enqueue(text_response("Hello."))
        page = await open_shop(connect, api_key)
        await turn(page, "hi")
        found = await ended(spans)
        await close(page)
    finally:
        logging.getLogger("agent.loop").removeHandler(handler)

    (root,) = [s for s in found if s.name == "turn"]
    lines = [json.loads(line) for line in written.getvalue().splitlines()]
    (done,) = [line for line in lines if "turn 1 done" in line["message"]]
    assert done["trace_id"] == format(root.context.trace_id, "032x")
    assert done["session_id"] == page.session_id


def test_a_line_logged_outside_a_trace_has_no_trace_id():
    made = logging.LogRecord("agent.loop", logging.INFO, __file__, 1, "hello", (), None)
    logs.SessionFields().filter(made)

    assert "trace_id" not in json.loads(logs.JsonFormatter().format(made))


# --- to a collector, from a real server -----------------------------------------------------


class _Collector(BaseHTTPRequestHandler):
    exported: list[ExportTraceServiceRequest] = []
    paths: list[str] = []

    def log_message(self, *args) -> None:
        pass

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        type(self).paths.append(self.path)
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        type(self).exported.append(request)
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()


@pytest.fixture
def collector() -> Iterator[tuple[str, type[_Collector]]]:
    """(the OTLP/HTTP base url of a receiver on 127.0.0.1, what it received)."""
    handler = type("Collector", (_Collector,), {"exported": [], "paths": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", handler
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def received_spans(handler: type[_Collector]) -> list[tuple[str, dict, object]]:
    """(service name, span attributes as a dict, the span) of everything received."""
    found = []
    for request in handler.exported:
        for resource_spans in request.resource_spans:
            resource = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    found.append((resource.get("service.name"), span))
    return found


async def test_a_server_with_traces_on_sends_the_turns_spans_to_the_collector_over_otlp_http(
    daphne_factory, api_key, collector
):
    url, handler = collector
    server = daphne_factory(OWLLAYER_TRACES="true", OTEL_EXPORTER_OTLP_ENDPOINT=url,
                            OTEL_SERVICE_NAME=None)
    async with AitpClient(server.ws_url(), api_key=api_key.raw, origin=ORIGIN) as page:
        await page.context_update("/", "Home", [ADD_TO_CART], {})
        await page.user_input('/tool add_to_cart {"quantity": 1}')
        call = await page.recv_until(lambda f: f["type"] == "TOOL_CALL", timeout=PATIENCE)
        await page.tool_result(call["payload"]["callId"], result={"cart": 1})
        await page.recv_until(lambda f: f["type"] == "AGENT_RESPONSE" and f["payload"]["done"],
                              timeout=PATIENCE)
    # Stopping drains the server, and the drain sends the spans still in their batch.
    os.kill(server.process.pid, signal.SIGTERM)
    await asyncio.to_thread(server.process.wait, PATIENCE)

    found = received_spans(handler)
    assert set(handler.paths) == {"/v1/traces"}
    assert {service for service, _ in found} == {"owllayer-server"}
    spans_by_name = {span.name: span for _, span in found}
    assert {"turn", "model", "tool_call", "store.checkpoint"} <= spans_by_name.keys()
    turn_span, tool_call = spans_by_name["turn"], spans_by_name["tool_call"]
    assert tool_call.trace_id == turn_span.trace_id and tool_call.parent_span_id == turn_span.span_id
    attributes = {a.key: a.value for a in turn_span.attributes}
    assert attributes["outcome"].string_value == "answered"
    assert attributes["session_id"].string_value.startswith("ses_")


# --- the settings ---------------------------------------------------------------------------


def settings_in_a_fresh_process(**overrides: str) -> subprocess.CompletedProcess:
    env = {name: v for name, v in os.environ.items()
           if not name.startswith(("OWLLAYER_TRACES", "OTEL_"))}
    return subprocess.run(
        [sys.executable, "-c", "import django; django.setup(); from django.conf import settings; "
                               "print(settings.OWLLAYER_TRACES, settings.OTEL_EXPORTER_OTLP_ENDPOINT, "
                               "settings.OTEL_SERVICE_NAME)"],
        env={**env, **overrides, "DJANGO_SETTINGS_MODULE": "owllayer_site.settings"}, cwd=ROOT,
        capture_output=True, text=True)


def test_traces_are_off_by_default_and_would_go_to_a_collector_on_this_host():
    shown = settings_in_a_fresh_process()

    assert shown.stdout.split() == ["False", "http://127.0.0.1:4318", "owllayer-server"]


def test_a_collector_endpoint_that_is_not_an_http_url_stops_the_server_at_start_naming_it():
    shown = settings_in_a_fresh_process(OWLLAYER_TRACES="true",
                                        OTEL_EXPORTER_OTLP_ENDPOINT="collector:4318")

    assert shown.returncode != 0
    assert "OTEL_EXPORTER_OTLP_ENDPOINT must be an http:// or https:// url" in shown.stderr
