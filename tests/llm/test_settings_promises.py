"""The settings that bound a turn's wait on the model reach the client that
the Anthropic backend builds: OWLLAYER_LLM_MAX_RETRY_WAIT caps each wait
between retries, OWLLAYER_LLM_MAX_RETRIES bounds how many, and
OWLLAYER_LLM_TIMEOUT bounds each request.

The retries are the backend's own (CappedRetries, the client's middleware;
the SDK's retry loop is off), so the retry policy is pinned here too: what is
retried, how long each wait is, and that the same request is sent again.

The retry waits are observed, not waited for: every sleep between retries,
the backend's and (were it ever to retry again) the SDK's, is recorded and
skipped.
"""
from __future__ import annotations

import email.utils
import json
import os
import subprocess
import sys
import time
from dataclasses import replace

import anthropic
import anyio
import anyio.lowlevel
import pytest
from anthropic import _base_client

from llm import LlmError, LlmRequest, anthropic_backend
from llm.anthropic_backend import (
    CONNECT_TIMEOUT,
    FIRST_RETRY_WAIT,
    LONGEST_BACKOFF,
    AnthropicBackend,
    close_client,
    get_client,
)
from runtime.config import config
from tests.support.fake_anthropic import FakeAnthropicServer, error_response, text_response

API_KEY = "sk-ant-settings-promises"
# Honoured as asked: anything that bounds the wait comes from our settings.
RETRY_AFTER = 30


@pytest.fixture
def fake():
    with FakeAnthropicServer(api_key=API_KEY) as server:
        yield server


@pytest.fixture
async def model(fake, settings):
    settings.ANTHROPIC_API_KEY = API_KEY
    settings.ANTHROPIC_BASE_URL = fake.base_url
    yield fake
    await close_client()


class _RecordingAnyio:
    """anyio as the backend and the SDK see it, with sleep recorded instead of slept."""

    def __init__(self) -> None:
        self.sleeps: list[float] = []

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        await anyio.lowlevel.checkpoint()

    def __getattr__(self, name):
        return getattr(anyio, name)


@pytest.fixture
def retry_waits(monkeypatch) -> list[float]:
    recorder = _RecordingAnyio()
    monkeypatch.setattr(anthropic_backend, "anyio", recorder)
    monkeypatch.setattr(_base_client, "anyio", recorder)
    return recorder.sleeps


def request() -> LlmRequest:
    return LlmRequest(model="claude-test", system=[], tools=[], max_tokens=64,
                      messages=[{"role": "user", "content": [{"type": "text", "text": "Hi"}]}])


async def run(backend: AnthropicBackend) -> list:
    return [event async for event in backend.stream(request())]


async def test_the_max_retry_wait_setting_caps_each_wait_between_retries(model, settings, retry_waits):
    settings.OWLLAYER_LLM_MAX_RETRIES = 2
    settings.OWLLAYER_LLM_MAX_RETRY_WAIT = 0.25
    model.enqueue(error_response(429, retry_after=RETRY_AFTER),
                  error_response(429, retry_after=RETRY_AFTER), text_response("Done."))

    events = await run(AnthropicBackend())

    assert events[-1].content == [{"type": "text", "text": "Done."}]
    assert retry_waits == [0.25, 0.25]


async def test_a_retry_wait_under_the_cap_is_kept_as_the_server_asked(model, settings, retry_waits):
    settings.OWLLAYER_LLM_MAX_RETRIES = 1
    settings.OWLLAYER_LLM_MAX_RETRY_WAIT = RETRY_AFTER + 10
    model.enqueue(error_response(429, retry_after=RETRY_AFTER), text_response("Done."))

    await run(AnthropicBackend())

    assert retry_waits == [RETRY_AFTER]


async def test_the_max_retries_setting_bounds_how_often_a_refused_request_is_retried(
        model, settings, retry_waits):
    settings.OWLLAYER_LLM_MAX_RETRIES = 3
    settings.OWLLAYER_LLM_MAX_RETRY_WAIT = 0.1
    model.enqueue(*[error_response(429, retry_after=RETRY_AFTER) for _ in range(5)])

    with pytest.raises(LlmError) as caught:
        await run(AnthropicBackend())

    assert caught.value.code == "rate_limited"
    assert len(model.requests) == 4  # the first try and three retries
    assert retry_waits == [0.1, 0.1, 0.1]


async def test_no_retries_means_one_request_and_no_wait(model, settings, retry_waits):
    settings.OWLLAYER_LLM_MAX_RETRIES = 0
    model.enqueue(error_response(529), error_response(529))

    with pytest.raises(LlmError) as caught:
        await run(AnthropicBackend())

    assert caught.value.code == "overloaded"
    assert len(model.requests) == 1
    assert retry_waits == []


async def test_the_client_the_backend_builds_carries_every_bound_from_the_settings(
        model, settings, retry_waits):
    settings.OWLLAYER_LLM_MAX_RETRIES = 4
    settings.OWLLAYER_LLM_TIMEOUT = 7.5
    settings.OWLLAYER_LLM_MAX_RETRY_WAIT = 1.25
    model.enqueue(*[error_response(503, retry_after=RETRY_AFTER) for _ in range(4)],
                  text_response("Hello."))

    await run(AnthropicBackend())
    # The backend's client for these settings on this loop: the one that served.
    client = get_client(config().llm)

    assert len(model.requests) == 5
    assert retry_waits == [1.25] * 4
    assert isinstance(client, anthropic.AsyncAnthropic)
    assert client.timeout.read == 7.5 and client.timeout.write == 7.5
    assert client.timeout.connect == CONNECT_TIMEOUT
    assert str(client.base_url).rstrip("/") == model.base_url.rstrip("/")
    assert client.api_key == API_KEY


async def test_a_timeout_shorter_than_the_connect_timeout_bounds_the_connect_too(settings):
    settings.ANTHROPIC_API_KEY = API_KEY
    settings.ANTHROPIC_BASE_URL = "http://127.0.0.1:9"
    settings.OWLLAYER_LLM_TIMEOUT = CONNECT_TIMEOUT / 2
    try:
        client = get_client(config().llm)
        assert client.timeout.connect == CONNECT_TIMEOUT / 2
        assert client.timeout.read == CONNECT_TIMEOUT / 2
    finally:
        await close_client()


async def test_a_changed_setting_takes_effect_with_a_new_client(model, settings, retry_waits):
    settings.OWLLAYER_LLM_MAX_RETRIES = 1
    settings.OWLLAYER_LLM_MAX_RETRY_WAIT = 1.0
    first = get_client(config().llm)
    settings.OWLLAYER_LLM_MAX_RETRY_WAIT = 2.0
    model.enqueue(error_response(429, retry_after=RETRY_AFTER), text_response("Done."))

    await run(AnthropicBackend())

    assert get_client(config().llm) is not first
    assert retry_waits == [2.0]


def test_the_environment_sets_the_llm_bounds():
    # Settings are read once, at start-up: a fresh interpreter reads them.
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "owllayer_site.settings",
           "DJANGO_DEBUG": "true", "OWLLAYER_LLM_MAX_RETRY_WAIT": "1.75",
           "OWLLAYER_LLM_MAX_RETRIES": "5", "OWLLAYER_LLM_TIMEOUT": "12.5"}
    code = (
        "import json, django; django.setup();"
        "from runtime.config import config;"
        "c = config().llm;"
        "print(json.dumps([c.max_retry_wait, c.max_retries, c.timeout]))"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True, cwd=os.getcwd())
    assert json.loads(out.stdout.strip().splitlines()[-1]) == [1.75, 5, 12.5]


# --- What is retried, and how long each wait is -------------------------------


async def test_a_retry_after_ms_under_the_cap_is_kept_as_the_server_asked(model, settings, retry_waits):
    settings.OWLLAYER_LLM_MAX_RETRIES = 2
    settings.OWLLAYER_LLM_MAX_RETRY_WAIT = 5.0
    model.enqueue(error_response(429, retry_after_ms=1500, retry_after=RETRY_AFTER),
                  error_response(429, retry_after_ms=600), text_response("Done."))

    await run(AnthropicBackend())

    assert retry_waits == [1.5, 0.6]


async def test_a_retry_after_ms_that_is_not_a_number_gives_way_to_retry_after(
        model, settings, retry_waits):
    settings.OWLLAYER_LLM_MAX_RETRIES = 1
    settings.OWLLAYER_LLM_MAX_RETRY_WAIT = 5.0
    model.enqueue(replace(error_response(429), headers={"retry-after-ms": "soon",
                                                        "retry-after": "3"}),
                  text_response("Done."))

    await run(AnthropicBackend())

    assert retry_waits == [3.0]


async def test_every_session_of_a_process_shares_one_client_while_the_settings_hold(model, settings):
    first = get_client(config().llm)
    second = get_client(config().llm)

    assert second is first


async def test_a_retry_after_date_is_honoured_up_to_the_cap(model, settings, retry_waits):
    settings.OWLLAYER_LLM_MAX_RETRIES = 2
    settings.OWLLAYER_LLM_MAX_RETRY_WAIT = 600.0
    soon = email.utils.formatdate(time.time() + 120, usegmt=True)
    asked = replace(error_response(429), headers={"retry-after": soon})
    model.enqueue(asked, asked, text_response("Done."))

    await run(AnthropicBackend())

    # The date is whole seconds and the clock moves: about two minutes.
    assert len(retry_waits) == 2
    assert all(60 < wait <= 121 for wait in retry_waits)


async def test_a_retry_after_date_past_the_cap_waits_the_cap(model, settings, retry_waits):
    settings.OWLLAYER_LLM_MAX_RETRIES = 1
    settings.OWLLAYER_LLM_MAX_RETRY_WAIT = 0.5
    later = email.utils.formatdate(time.time() + 3600, usegmt=True)
    model.enqueue(replace(error_response(529), headers={"retry-after": later}),
                  text_response("Done."))

    await run(AnthropicBackend())

    assert retry_waits == [0.5]


async def test_without_a_retry_hint_the_waits_back_off_exponentially_with_jitter(
        model, settings, retry_waits):
    settings.OWLLAYER_LLM_MAX_RETRIES = 6
    settings.OWLLAYER_LLM_MAX_RETRY_WAIT = 60.0
    model.enqueue(*[error_response(500) for _ in range(6)], text_response("Done."))

    await run(AnthropicBackend())

    assert len(retry_waits) == 6
    for taken, wait in enumerate(retry_waits):
        backoff = min(FIRST_RETRY_WAIT * 2 ** taken, LONGEST_BACKOFF)
        # A random quarter at most is taken off, never added.
        assert 0.75 * backoff <= wait <= backoff, (taken, wait)
    assert retry_waits[-1] > FIRST_RETRY_WAIT * 2 ** 3  # the backoff grows past the fourth


async def test_the_backoff_is_capped_by_the_max_retry_wait_setting(model, settings, retry_waits):
    settings.OWLLAYER_LLM_MAX_RETRIES = 3
    settings.OWLLAYER_LLM_MAX_RETRY_WAIT = 0.1
    model.enqueue(*[error_response(500) for _ in range(3)], text_response("Done."))

    await run(AnthropicBackend())

    assert retry_waits == [0.1, 0.1, 0.1]


async def test_a_zero_retry_after_backs_off_instead_of_retrying_at_once(model, settings, retry_waits):
    settings.OWLLAYER_LLM_MAX_RETRIES = 1
    settings.OWLLAYER_LLM_MAX_RETRY_WAIT = 60.0
    model.enqueue(error_response(429, retry_after=0), text_response("Done."))

    await run(AnthropicBackend())

    assert len(retry_waits) == 1
    assert 0.75 * FIRST_RETRY_WAIT <= retry_waits[0] <= FIRST_RETRY_WAIT


@pytest.mark.parametrize("status", [408, 409, 429, 500, 503, 529])
async def test_a_status_worth_another_try_is_retried(model, settings, retry_waits, status):
    settings.OWLLAYER_LLM_MAX_RETRIES = 2
    settings.OWLLAYER_LLM_MAX_RETRY_WAIT = 0.1
    model.enqueue(error_response(status), text_response("Done."))

    events = await run(AnthropicBackend())

    assert events[-1].content == [{"type": "text", "text": "Done."}]
    assert len(model.requests) == 2


@pytest.mark.parametrize("status", [400, 401, 403, 404, 413, 422])
async def test_a_refusal_of_the_request_itself_is_not_retried(model, settings, retry_waits, status):
    settings.OWLLAYER_LLM_MAX_RETRIES = 2
    model.enqueue(error_response(status), text_response("Never sent."))

    with pytest.raises(LlmError):
        await run(AnthropicBackend())

    assert len(model.requests) == 1
    assert retry_waits == []


async def test_the_api_saying_not_to_retry_is_obeyed(model, settings, retry_waits):
    settings.OWLLAYER_LLM_MAX_RETRIES = 2
    model.enqueue(error_response(429, should_retry=False), text_response("Never sent."))

    with pytest.raises(LlmError) as caught:
        await run(AnthropicBackend())

    assert caught.value.code == "rate_limited"
    assert len(model.requests) == 1
    assert retry_waits == []


async def test_the_api_saying_to_retry_is_obeyed_even_for_a_refusal(model, settings, retry_waits):
    settings.OWLLAYER_LLM_MAX_RETRIES = 2
    settings.OWLLAYER_LLM_MAX_RETRY_WAIT = 0.1
    model.enqueue(error_response(400, should_retry=True), text_response("Done."))

    events = await run(AnthropicBackend())

    assert events[-1].content == [{"type": "text", "text": "Done."}]
    assert len(model.requests) == 2


async def test_a_retry_sends_the_same_request_again_and_counts_itself(model, settings, retry_waits):
    settings.OWLLAYER_LLM_MAX_RETRIES = 2
    settings.OWLLAYER_LLM_MAX_RETRY_WAIT = 0.1
    model.enqueue(error_response(529), error_response(529), text_response("Done."))

    await run(AnthropicBackend())

    sent = model.requests
    assert [dict(r) for r in sent[1:]] == [dict(sent[0])] * 2
    assert [r.headers.get("x-stainless-retry-count") for r in sent] == ["0", "1", "2"]


async def test_a_refused_connection_is_retried_as_often_as_the_setting_allows(settings, retry_waits):
    settings.ANTHROPIC_API_KEY = API_KEY
    settings.ANTHROPIC_BASE_URL = f"http://127.0.0.1:{_closed_port()}"
    settings.OWLLAYER_LLM_MAX_RETRIES = 3
    settings.OWLLAYER_LLM_MAX_RETRY_WAIT = 0.1
    try:
        with pytest.raises(LlmError) as caught:
            await run(AnthropicBackend())
    finally:
        await close_client()

    assert caught.value.code == "unreachable"
    assert retry_waits == [0.1, 0.1, 0.1]


def _closed_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
