"""The Anthropic backend against a fake Messages API server, through the real SDK."""
from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import ssl
import subprocess
from dataclasses import replace

import pytest

from llm import LlmError, LlmRequest, MessageComplete, TextDelta, Usage, get_backend, reset_backend
from llm.anthropic_backend import (
    AnthropicBackend,
    AnthropicConfig,
    close_client,
    get_client,
    reset_client,
)
from llm.offline import OfflineBackend
from runtime.config import config
from tests.support.fake_anthropic import (
    FakeAnthropicServer,
    broken_stream,
    error_response,
    in_stream_error,
    text_response,
    tool_use_response,
)

API_KEY = "sk-ant-test-0123456789"


@pytest.fixture
def fake():
    with FakeAnthropicServer() as server:
        yield server


def llm_config(**changes) -> AnthropicConfig:
    """The configured llm part with a key, no retries and a 1 s timeout, and these changes."""
    return replace(config().llm, api_key=API_KEY, max_retries=0, timeout=1.0, **changes)


@pytest.fixture
async def backend(fake, settings):
    settings.ANTHROPIC_API_KEY = API_KEY
    settings.ANTHROPIC_BASE_URL = fake.base_url
    settings.OWLLAYER_LLM_MAX_RETRIES = 2
    settings.OWLLAYER_LLM_TIMEOUT = 5.0
    yield AnthropicBackend()
    await close_client()


def make_request(text: str = "Hello", **overrides) -> LlmRequest:
    fields = {
        "model": "claude-test",
        "system": [{"type": "text", "text": "You are a shop assistant."}],
        "messages": [{"role": "user", "content": [{"type": "text", "text": text}]}],
        "tools": [],
        "max_tokens": 256,
    }
    fields.update(overrides)
    return LlmRequest(**fields)


async def collect(backend, request: LlmRequest | None = None) -> tuple[list[str], MessageComplete]:
    """The text deltas and the final message, checking the event order on the way."""
    deltas: list[str] = []
    completes: list[MessageComplete] = []
    async for event in backend.stream(request or make_request()):
        assert not completes, "an event arrived after MessageComplete"
        if isinstance(event, TextDelta):
            deltas.append(event.text)
        else:
            assert isinstance(event, MessageComplete)
            completes.append(event)
    assert len(completes) == 1
    return deltas, completes[0]


async def failure(backend, request: LlmRequest | None = None) -> tuple[list[str], LlmError]:
    """The text deltas seen before the stream failed, and the LlmError it failed with."""
    deltas: list[str] = []
    with pytest.raises(LlmError) as caught:
        async for event in backend.stream(request or make_request()):
            assert isinstance(event, TextDelta), "a failing stream must not complete"
            deltas.append(event.text)
    return deltas, caught.value


async def test_streams_text_as_deltas_then_one_complete_message_with_usage(backend, fake):
    fake.enqueue(text_response("Hello there, how can I help?", chunks=4, usage={
        "input_tokens": 21, "output_tokens": 9,
        "cache_read_input_tokens": 7, "cache_creation_input_tokens": 3,
    }))

    deltas, complete = await collect(backend)

    assert len(deltas) == 4
    assert "".join(deltas) == "Hello there, how can I help?"
    assert complete.content == [{"type": "text", "text": "Hello there, how can I help?"}]
    assert complete.stop_reason == "end_turn"
    assert complete.usage == Usage(input_tokens=21, output_tokens=9,
                                   cache_read_tokens=7, cache_write_tokens=3)


async def test_passes_max_tokens_as_the_stop_reason(backend, fake):
    fake.enqueue(text_response("Cut sho", stop_reason="max_tokens"))

    _, complete = await collect(backend)

    assert complete.stop_reason == "max_tokens"


async def test_sends_system_messages_tools_and_tool_choice_with_the_api_key(backend, fake):
    system = [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}]
    tools = [{
        "name": "add_to_cart",
        "description": "Add a product to the cart.",
        "input_schema": {"type": "object", "properties": {"sku": {"type": "string"}}},
        "cache_control": {"type": "ephemeral"},
    }]
    request = make_request("Add A1", system=system, tools=tools, tool_choice={"type": "auto"})

    await collect(backend, request)

    [sent] = fake.requests
    assert sent["model"] == "claude-test"
    assert sent["max_tokens"] == 256
    assert sent["stream"] is True
    assert sent["system"] == system
    assert sent["messages"] == request.messages
    assert sent["tools"] == tools
    assert sent["tool_choice"] == {"type": "auto"}
    assert sent.api_key == API_KEY


async def test_leaves_out_tools_and_tool_choice_when_there_are_none(backend, fake):
    await collect(backend, make_request(tools=[], tool_choice=None))

    [sent] = fake.requests
    assert "tools" not in sent
    assert "tool_choice" not in sent


async def test_returns_one_tool_use_with_its_input(backend, fake):
    fake.enqueue(tool_use_response([("toolu_01", "add_to_cart", {"sku": "A1", "quantity": 2})]))

    deltas, complete = await collect(backend)

    assert deltas == []
    assert complete.stop_reason == "tool_use"
    assert complete.content == [
        {"type": "tool_use", "id": "toolu_01", "name": "add_to_cart",
         "input": {"sku": "A1", "quantity": 2}},
    ]


async def test_keeps_text_and_several_tool_uses_in_their_order(backend, fake):
    fake.enqueue(tool_use_response(
        [("toolu_a", "find_product", {"query": "red shoes"}),
         ("toolu_b", "get_cart", {}),
         ("toolu_c", "find_product", {"query": "socks", "limit": 3})],
        text="Let me check both.",
    ))

    deltas, complete = await collect(backend)

    assert "".join(deltas) == "Let me check both."
    assert [block["type"] for block in complete.content] == ["text", "tool_use", "tool_use", "tool_use"]
    assert [block.get("id") for block in complete.content[1:]] == ["toolu_a", "toolu_b", "toolu_c"]
    assert complete.content[3]["input"] == {"query": "socks", "limit": 3}
    assert complete.tool_uses == complete.content[1:]


async def test_drops_an_empty_text_block_from_the_final_content(backend, fake):
    fake.enqueue(tool_use_response([("toolu_01", "get_cart", {})], text=""))

    _, complete = await collect(backend)

    assert complete.content == [{"type": "tool_use", "id": "toolu_01", "name": "get_cart", "input": {}}]


AWKWARD_INPUT = {
    "note": 'Caf\u00e9 "quoted" back\\slash\nnew line \u65e5\u672c\u8a9e \U0001F600 end',
    "nested": {"list": [1, 2.5, None, True], "emoji": "\U0001F9C1\u200d"},
}


@pytest.mark.parametrize("ensure_ascii", [False, True], ids=["raw-utf8", "unicode-escapes"])
async def test_reassembles_tool_input_split_at_every_byte_boundary(backend, fake, ensure_ascii):
    encoded = json.dumps(AWKWARD_INPUT, ensure_ascii=ensure_ascii).encode("utf-8")
    response = tool_use_response(
        [("toolu_01", "save_note", AWKWARD_INPUT)],
        split_json_at=list(range(1, len(encoded))),
        ensure_ascii=ensure_ascii,
    )
    pieces = response.blocks[0].pieces
    if ensure_ascii:
        # Splits fall inside \uXXXX and \" escapes.
        assert any(piece.text.endswith("\\") for piece in pieces)
        assert "\\ud83d" in encoded.decode()
    else:
        # Some HTTP chunks end inside a multi-byte character.
        assert any(piece.cut is not None for piece in pieces)
    fake.enqueue(response)

    _, complete = await collect(backend)

    assert complete.content[0]["input"] == AWKWARD_INPUT


async def test_retries_a_rate_limit_after_the_wait_it_asks_for_then_succeeds(backend, fake):
    fake.enqueue(error_response(429, retry_after=0.05), text_response("Now it works."))

    _, complete = await collect(backend)

    assert complete.content == [{"type": "text", "text": "Now it works."}]
    # The server thread records "complete" once the response is written,
    # which may be just after the client has read it.
    assert fake.wait_for(lambda requests: [r.outcome for r in requests] == ["error", "complete"])


async def test_reports_overloaded_once_every_retry_was_refused(backend, fake):
    fake.enqueue(*[error_response(529, retry_after_ms=10) for _ in range(3)])

    _, error = await failure(backend)

    assert error.code == "overloaded"
    assert error.status == 529
    assert len(fake.requests) == 3  # the first try and OWLLAYER_LLM_MAX_RETRIES=2


async def test_reports_a_server_error_as_upstream_error(backend, fake, settings):
    settings.OWLLAYER_LLM_MAX_RETRIES = 0
    fake.enqueue(error_response(500, message="Internal server error"))

    _, error = await failure(AnthropicBackend())

    assert error.code == "upstream_error"
    assert error.status == 500
    assert len(fake.requests) == 1


@pytest.mark.parametrize(("status", "code"), [
    (401, "auth_failed"), (403, "auth_failed"),
    (400, "bad_request"), (404, "bad_request"), (413, "bad_request"), (422, "bad_request"),
])
async def test_maps_a_client_error_status_to_its_code_without_retrying(backend, fake, status, code):
    fake.enqueue(error_response(status))

    _, error = await failure(backend)

    assert (error.code, error.status) == (code, status)
    assert len(fake.requests) == 1


async def test_reports_a_key_the_api_refuses_as_auth_failed_without_revealing_it(backend, fake):
    fake.api_key = "sk-ant-the-right-key"

    _, error = await failure(backend)

    assert error.code == "auth_failed"
    assert API_KEY not in error.message
    assert API_KEY not in str(error)


async def test_reports_a_stream_that_stops_half_way_as_interrupted(backend, fake):
    fake.enqueue(broken_stream(6, response=text_response("one two three four five six", chunks=6)))

    deltas, error = await failure(backend)

    assert deltas, "some text arrived before the break"
    assert error.code == "stream_interrupted"


async def test_reports_a_stream_cut_before_any_text_as_interrupted_without_retrying(backend, fake):
    fake.enqueue(broken_stream(1))

    deltas, error = await failure(backend)

    assert deltas == []
    assert error.code == "stream_interrupted"
    assert len(fake.requests) == 1


async def test_reports_a_stream_that_ends_without_message_stop_as_interrupted(backend, fake):
    fake.enqueue(broken_stream(5, abrupt=False))

    _, error = await failure(backend)

    assert error.code == "stream_interrupted"


@pytest.mark.parametrize(("error_type", "code"), [
    ("overloaded_error", "overloaded"),
    ("rate_limit_error", "rate_limited"),
    ("api_error", "upstream_error"),
])
async def test_maps_an_error_event_inside_the_stream_to_its_code(backend, fake, error_type, code):
    fake.enqueue(in_stream_error(error_type, "Something upstream", after_events=4))

    deltas, error = await failure(backend)

    assert deltas, "the error event came after some text"
    assert error.code == code


async def test_reports_a_first_token_slower_than_the_read_timeout_as_timeout(backend, fake, settings):
    settings.OWLLAYER_LLM_TIMEOUT = 0.3
    fake.enqueue(text_response("Too late.", first_event_delay=30))

    _, error = await failure(AnthropicBackend())

    assert error.code == "timeout"


async def test_reports_a_refused_connection_as_unreachable(backend, settings):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed_port = probe.getsockname()[1]
    settings.ANTHROPIC_BASE_URL = f"http://127.0.0.1:{closed_port}"
    settings.OWLLAYER_LLM_MAX_RETRIES = 0

    _, error = await failure(AnthropicBackend())

    assert error.code == "unreachable"


async def test_cancelling_mid_stream_closes_the_http_stream(backend, fake):
    fake.enqueue(text_response("word " * 80, chunks=80, event_delay=0.02))
    first_text = asyncio.Event()
    seen: list[str] = []

    async def consume() -> None:
        async for event in backend.stream(make_request()):
            if isinstance(event, TextDelta):
                seen.append(event.text)
                first_text.set()

    task = asyncio.create_task(consume())
    await asyncio.wait_for(first_text.wait(), timeout=5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task

    assert fake.wait_for(lambda requests: requests[0].outcome == "client_disconnected")
    assert len(seen) < 80
    # The shared client is still usable afterwards.
    _, complete = await collect(backend)
    assert complete.stop_reason == "end_turn"


async def test_leaving_the_loop_early_closes_the_http_stream(backend, fake):
    fake.enqueue(text_response("word " * 80, chunks=80, event_delay=0.02))

    async with contextlib.aclosing(backend.stream(make_request())) as events:
        async for event in events:
            assert isinstance(event, TextDelta)
            break

    # The socket closes on the loop's next turn: wait without blocking it.
    assert await asyncio.to_thread(
        fake.wait_for, lambda requests: requests[0].outcome == "client_disconnected")


async def test_a_turn_after_the_api_dropped_the_pooled_connection_still_streams(backend, fake):
    fake.enqueue(text_response("First."), text_response("Second."))
    deltas, _ = await collect(backend)
    assert "".join(deltas) == "First."

    fake.drop_connections()  # no loop turn in between: the client may not know yet
    deltas, complete = await collect(backend)

    assert "".join(deltas) == "Second."
    assert complete.stop_reason == "end_turn"


@pytest.fixture
def tls_fake(tmp_path, settings):
    """A fake Messages API over HTTPS on 127.0.0.1, with a certificate of its
    own (made here by the openssl binary) that no trust store holds."""
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    with FakeAnthropicServer(tls=context) as server:
        settings.ANTHROPIC_API_KEY = API_KEY
        settings.ANTHROPIC_BASE_URL = server.base_url
        settings.OWLLAYER_LLM_MAX_RETRIES = 0
        settings.OWLLAYER_LLM_TIMEOUT = 5.0
        server.cert = cert
        yield server


async def test_streams_from_a_model_api_over_tls_whose_certificate_is_trusted(tls_fake, monkeypatch):
    monkeypatch.setenv("SSL_CERT_FILE", str(tls_fake.cert))  # the trust store the client loads
    tls_fake.enqueue(text_response("Over TLS.", chunks=3))
    try:
        deltas, complete = await collect(AnthropicBackend())
    finally:
        await close_client()

    assert "".join(deltas) == "Over TLS."
    assert complete.content == [{"type": "text", "text": "Over TLS."}]


async def test_refuses_a_model_api_whose_certificate_is_not_trusted(tls_fake, monkeypatch):
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    tls_fake.enqueue(text_response("Never read."))
    try:
        deltas, error = await failure(AnthropicBackend())
    finally:
        await close_client()

    assert deltas == []
    assert error.code == "unreachable"
    assert tls_fake.requests == []  # nothing crossed a connection it could not trust


async def test_builds_a_new_client_when_the_base_url_changes():
    first = llm_config(base_url="http://127.0.0.1:9")
    second = llm_config(base_url="http://127.0.0.1:10")
    try:
        client = get_client(first)
        assert get_client(first) is client
        assert get_client(second) is not client
        assert str(get_client(second).base_url).startswith("http://127.0.0.1:10")
    finally:
        await close_client()


async def test_the_sdk_client_makes_open_telemetry_spans_only_when_traces_are_turned_on():
    quiet = llm_config(base_url="http://127.0.0.1:9")
    traced = llm_config(base_url="http://127.0.0.1:9", traces=True)
    try:
        assert get_client(quiet)._tracer is None
        assert get_client(traced)._tracer is not None
    finally:
        await close_client()


def test_the_traces_setting_reaches_the_backend_configuration(settings):
    settings.OWLLAYER_LLM_TRACES = False
    assert config().llm.traces is False
    settings.OWLLAYER_LLM_TRACES = True
    assert config().llm.traces is True


async def test_a_backend_reads_its_configuration_once_not_on_every_request(backend, fake, settings):
    settings.ANTHROPIC_BASE_URL = "http://127.0.0.1:9"  # nothing listens there
    fake.enqueue(text_response("Hello.", chunks=1))

    deltas, complete = await collect(backend)

    assert ("".join(deltas), complete.stop_reason, len(fake.requests)) == ("Hello.", "end_turn", 1)


def test_get_backend_follows_the_llm_setting_and_keeps_one_instance(settings):
    reset_backend()
    try:
        settings.OWLLAYER_LLM = "offline"
        offline = get_backend()
        assert isinstance(offline, OfflineBackend)
        assert get_backend() is offline

        settings.ANTHROPIC_API_KEY = API_KEY
        settings.OWLLAYER_LLM = "anthropic"
        anthropic_backend = get_backend()
        assert isinstance(anthropic_backend, AnthropicBackend)
        assert get_backend() is anthropic_backend

        reset_backend()
        assert get_backend() is not anthropic_backend
    finally:
        reset_backend()


def test_a_long_retry_after_is_capped_for_an_interactive_turn():
    import httpx2

    from llm.anthropic_backend import CappedRetries

    retries = CappedRetries(max_retries=2, max_wait=2.5)
    assert retries.retry_wait(0, httpx2.Headers({"retry-after": "600"})) == 2.5
    assert retries.retry_wait(0, httpx2.Headers({"retry-after": "1"})) == 1


async def test_warming_up_makes_the_client_the_first_turn_uses_without_sending_a_request(
        backend, fake, monkeypatch):
    import anthropic

    made = []
    monkeypatch.setattr(anthropic, "AsyncAnthropic",
                        lambda *a, _make=anthropic.AsyncAnthropic, **k: made.append(1) or _make(*a, **k))
    reset_client()
    await backend.warm_up()
    assert (len(made), fake.requests) == (1, [])
    fake.enqueue(text_response("Hello.", chunks=1))
    await collect(backend)
    assert (len(made), len(fake.requests)) == (1, 1)


async def test_streams_running_at_the_same_time_all_go_through_the_one_client(backend, fake, monkeypatch):
    import anthropic

    made = []
    monkeypatch.setattr(anthropic, "AsyncAnthropic",
                        lambda *a, _make=anthropic.AsyncAnthropic, **k: made.append(1) or _make(*a, **k))
    reset_client()
    streams = 12
    fake.enqueue(*[text_response(f"Answer {n}.", chunks=2) for n in range(streams)])

    answers = await asyncio.gather(*(collect(backend) for _ in range(streams)))

    assert sorted(complete.text for _, complete in answers) == sorted(f"Answer {n}." for n in range(streams))
    assert (len(made), len(fake.requests)) == (1, streams)
