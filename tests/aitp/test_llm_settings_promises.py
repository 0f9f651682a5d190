"""The settings that bound a turn's wait on the model reach the client that
the Anthropic backend builds: OWLLAYER_LLM_MAX_RETRY_WAIT caps each wait
between retries, OWLLAYER_LLM_MAX_RETRIES bounds how many, and
OWLLAYER_LLM_TIMEOUT bounds each request.

The retry waits are observed, not waited for: the SDK's sleep between
retries is recorded and skipped.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import anthropic
import anyio
import pytest
from anthropic import _base_client

from aitp.llm import LlmError, LlmRequest
from aitp.llm.anthropic_backend import (
    CONNECT_TIMEOUT,
    AnthropicBackend,
    AnthropicConfig,
    close_client,
    get_client,
)
from tests.support.fake_anthropic import FakeAnthropicServer, error_response, text_response

API_KEY = "sk-ant-settings-promises"
# Honoured by the SDK as asked (it ignores only hints over 60 s): anything
# else that bounds the wait comes from our settings.
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
    """anyio as the SDK sees it, with sleep recorded instead of slept."""

    def __init__(self) -> None:
        self.sleeps: list[float] = []

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        await anyio.sleep(0)

    def __getattr__(self, name):
        return getattr(anyio, name)


@pytest.fixture
def retry_waits(monkeypatch) -> list[float]:
    recorder = _RecordingAnyio()
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


async def test_the_client_the_backend_builds_carries_every_bound_from_the_settings(model, settings):
    settings.OWLLAYER_LLM_MAX_RETRIES = 4
    settings.OWLLAYER_LLM_TIMEOUT = 7.5
    settings.OWLLAYER_LLM_MAX_RETRY_WAIT = 1.25
    model.enqueue(text_response("Hello."))

    await run(AnthropicBackend())
    # The backend's client for these settings on this loop: the one that served.
    client = get_client(AnthropicConfig.from_settings())

    assert len(model.requests) == 1
    assert isinstance(client, anthropic.AsyncAnthropic)
    assert client.max_retries == 4
    assert client.timeout.read == 7.5 and client.timeout.write == 7.5
    assert client.timeout.connect == CONNECT_TIMEOUT
    assert client._max_retry_wait == 1.25
    assert str(client.base_url).rstrip("/") == model.base_url.rstrip("/")
    assert client.api_key == API_KEY


async def test_a_timeout_shorter_than_the_connect_timeout_bounds_the_connect_too(settings):
    settings.ANTHROPIC_API_KEY = API_KEY
    settings.ANTHROPIC_BASE_URL = "http://127.0.0.1:9"
    settings.OWLLAYER_LLM_TIMEOUT = CONNECT_TIMEOUT / 2
    try:
        client = get_client(AnthropicConfig.from_settings())
        assert client.timeout.connect == CONNECT_TIMEOUT / 2
        assert client.timeout.read == CONNECT_TIMEOUT / 2
    finally:
        await close_client()


async def test_a_changed_setting_takes_effect_with_a_new_client(model, settings):
    settings.OWLLAYER_LLM_MAX_RETRY_WAIT = 1.0
    first = get_client(AnthropicConfig.from_settings())
    settings.OWLLAYER_LLM_MAX_RETRY_WAIT = 2.0
    second = get_client(AnthropicConfig.from_settings())
    assert second is not first and second._max_retry_wait == 2.0


def test_the_environment_sets_the_llm_bounds():
    # Settings are read once, at start-up: a fresh interpreter reads them.
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "owllayer_site.settings",
           "DJANGO_DEBUG": "true", "OWLLAYER_LLM_MAX_RETRY_WAIT": "1.75",
           "OWLLAYER_LLM_MAX_RETRIES": "5", "OWLLAYER_LLM_TIMEOUT": "12.5"}
    code = (
        "import json, django; django.setup();"
        "from aitp.llm.anthropic_backend import AnthropicConfig as C;"
        "c = C.from_settings();"
        "print(json.dumps([c.max_retry_wait, c.max_retries, c.timeout]))"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True, cwd=os.getcwd())
    assert json.loads(out.stdout.strip().splitlines()[-1]) == [1.75, 5, 12.5]
