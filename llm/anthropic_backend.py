"""The Anthropic Messages API backend, streamed through the official SDK.

A request that failed before streaming began (429, 529, other 5xx, connection
errors) is retried by CappedRetries, the client's middleware, honouring
retry-after up to OWLLAYER_LLM_MAX_RETRY_WAIT; once events flow nothing is
retried, because the page has already shown part of the answer. Everything
that can go wrong leaves this module as an LlmError.
"""
from __future__ import annotations

import asyncio
import email.utils
import logging
import random
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

import anthropic
import anyio
import httpx2
from anthropic.lib.streaming._messages import accumulate_event

from aitp.llm import LlmError, LlmRequest, MessageComplete, StreamEvent, TextDelta, Usage
from runtime.config import LlmConfig

logger = logging.getLogger(__name__)

# A server that does not accept a connection within this long is not going to.
CONNECT_TIMEOUT = 5.0

# Without a retry-after, the n-th retry waits about FIRST_RETRY_WAIT * 2**n
# seconds (less a random quarter), at most LONGEST_BACKOFF: the SDK's backoff.
FIRST_RETRY_WAIT = 0.5
LONGEST_BACKOFF = 8.0

# error.type in an API error body (or an SSE error event) -> our code.
ERROR_TYPE_CODES = {
    "rate_limit_error": "rate_limited",
    "overloaded_error": "overloaded",
    "api_error": "upstream_error",
    "timeout_error": "timeout",
    "authentication_error": "auth_failed",
    "permission_error": "auth_failed",
    "invalid_request_error": "bad_request",
    "not_found_error": "bad_request",
    "request_too_large": "bad_request",
}


# The configuration's llm part is what a client is made from.
AnthropicConfig = LlmConfig


class CappedRetries(anthropic.Middleware):
    """Retries a request the API refused before streaming began, each wait
    capped for a person waiting.

    The client's own retry loop is off (``max_retries=0``); this middleware,
    the SDK's public hook around each HTTP attempt, is the only one. It
    retries what the SDK would (a connection error or timeout; 408, 409, 429
    and 5xx unless the API says ``x-should-retry: false``; anything the API
    says ``x-should-retry: true`` to) at most ``max_retries`` times. It waits
    as long as ``retry-after-ms`` / ``retry-after`` asks, or else backs off
    exponentially, but never longer than ``max_wait``: a 429 asking for ten
    minutes would otherwise hold the page's turn that long. Once its retries
    are spent the last answer goes back to the SDK, and the turn ends with a
    clear "busy, try again" error. A response whose status is success is
    never retried: from there on events flow and the page shows them.
    """

    def __init__(self, *, max_retries: int, max_wait: float) -> None:
        self.max_retries = max_retries
        self.max_wait = max_wait

    async def handle_async(self, request: anthropic.APIRequest, call_next):
        attempt, retries_taken = request, 0
        while True:
            try:
                response = await call_next(attempt)
            except (anthropic.APIConnectionError, anthropic.RetryableError):
                if retries_taken >= self.max_retries:
                    raise
                headers = None
            else:
                reply = response.http_response
                if (reply.is_success or retries_taken >= self.max_retries
                        or not should_retry(reply)):
                    return response
                headers = reply.headers
                await reply.aclose()
            await anyio.sleep(self.retry_wait(retries_taken, headers))
            retries_taken += 1
            # The same request again, counted in x-stainless-retry-count.
            attempt = anthropic.APIRequest(
                options=request.options, cast_to=request.cast_to, stream=request.stream,
                stream_cls=request.stream_cls, retries_taken=request.retries_taken + retries_taken,
            )

    def retry_wait(self, retries_taken: int, headers: Any = None) -> float:
        """Seconds to wait before retry number ``retries_taken + 1``."""
        asked = _asked_wait(headers)
        if asked is not None and asked > 0:
            wait = asked
        else:
            backoff = min(FIRST_RETRY_WAIT * 2.0 ** retries_taken, LONGEST_BACKOFF)
            wait = backoff * (1 - 0.25 * random.random())
        return min(wait, self.max_wait)


def should_retry(response: httpx2.Response) -> bool:
    """Whether an error status is worth another try (the SDK's own policy)."""
    hint = response.headers.get("x-should-retry")
    if hint in ("true", "false"):
        return hint == "true"
    return response.status_code in (408, 409, 429) or response.status_code >= 500


def new_client(config: AnthropicConfig) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(
        api_key=config.api_key,
        base_url=config.base_url,
        # The retries are CappedRetries', so that each wait is ours.
        max_retries=0,
        middleware=[CappedRetries(max_retries=config.max_retries, max_wait=config.max_retry_wait)],
        timeout=anthropic.Timeout(config.timeout, connect=min(CONNECT_TIMEOUT, config.timeout)),
        open_telemetry=None if config.traces else False,
        # The SDK's aiohttp transport: a streamed event costs the event loop
        # far less than through httpx's default transport, which re-arms the
        # socket's reader and a timeout scope on every read.
        http_client=anthropic.DefaultAioHttpClient(verify=httpx2.create_ssl_context()),
    )


# One client per process, shared by every session and kept with its open
# connections for the streams that follow. It is rebuilt when the
# configuration changes (tests point it at a fake server) or when it is used
# from another event loop: its connections belong to the loop that opened them.
_client_lock = threading.Lock()
_client_key: tuple[AnthropicConfig, asyncio.AbstractEventLoop] | None = None
_client: anthropic.AsyncAnthropic | None = None


def get_client(config: AnthropicConfig) -> anthropic.AsyncAnthropic:
    """The client of this configuration on the running loop."""
    global _client, _client_key
    key = (config, asyncio.get_running_loop())
    with _client_lock:
        if _client is None or _client_key != key:
            # A replaced client is dropped, not closed: it may belong to a
            # loop that no longer runs.
            _client = new_client(config)
            _client_key = key
        return _client


def reset_client() -> None:
    global _client, _client_key
    with _client_lock:
        _client = None
        _client_key = None


async def close_client() -> None:
    """Close the shared client if it belongs to the running loop (at shutdown, in tests)."""
    global _client, _client_key
    with _client_lock:
        client, key = _client, _client_key
        if client is None or key is None or key[1] is not asyncio.get_running_loop():
            return
        _client = None
        _client_key = None
    await client.close()


class AnthropicBackend:
    name = "anthropic"

    def __init__(self, config: AnthropicConfig | None = None) -> None:
        # Read once, here: get_backend makes a new backend when the
        # configuration changes, never a request.
        if config is None:
            from runtime.config import config as current

            config = current().llm
        self._config = config

    async def warm_up(self) -> None:
        """What the first turn would otherwise do on the serving loop, where
        every page's frames wait for it: the shared client made (its HTTP
        stack imported, its TLS trust store loaded) and the async backend of
        its transport loaded. No request is sent."""
        get_client(self._config)
        anyio.get_cancelled_exc_class()

    def check_access(self, timeout: float) -> LlmError | None:
        """One cheap request, made once at start: the list of models, one
        entry long, which the API answers only for a key it accepts (no
        tokens are spent). None when answered; else the LlmError it failed
        with (``auth_failed``: the key is refused; ``unreachable`` or
        ``timeout``: the API did not answer). Blocking, not retried."""
        client = anthropic.Anthropic(api_key=self._config.api_key, base_url=self._config.base_url,
                                     max_retries=0, timeout=timeout, open_telemetry=False)
        try:
            client.models.list(limit=1)
        except Exception as exc:
            return to_llm_error(exc, began=False, text_sent=False)
        finally:
            client.close()
        return None

    async def stream(self, request: LlmRequest) -> AsyncIterator[StreamEvent]:
        client = get_client(self._config)
        began = False
        text_sent = False
        finished = False
        message = None
        json_bufs: dict[int, bytes] = {}
        try:
            # The raw events, added up into the message by the SDK's own
            # accumulator: its stream helper also builds a second event
            # object for every delta, which nothing here reads.
            async with await client.messages.create(stream=True, **request_params(request)) as events:
                began = True
                async for event in events:
                    if message is not None or event.type == "message_start":
                        message = accumulate_event(event=event, current_snapshot=message,
                                                   json_bufs=json_bufs)
                    if event.type == "content_block_delta" and event.delta.type == "text_delta":
                        if event.delta.text:
                            text_sent = True
                            yield TextDelta(event.delta.text)
                    elif event.type == "message_stop":
                        finished = True
                if not finished or message is None:
                    raise LlmError("stream_interrupted", detail="stream ended before message_stop")
        except LlmError:
            raise
        # The SDK's stream accumulator raises assorted built-in errors on
        # malformed upstream data; every one of them must leave as an LlmError.
        except Exception as exc:
            error = to_llm_error(exc, began=began, text_sent=text_sent)
            logger.warning("llm request failed: %s (status %s): %s",
                           error.code, error.status, error.detail)
            raise error from exc
        yield complete_from_message(message)


def request_params(request: LlmRequest) -> dict[str, Any]:
    params: dict[str, Any] = {
        "model": request.model,
        "max_tokens": request.max_tokens,
        "messages": request.messages,
    }
    if request.system:
        params["system"] = request.system
    if request.tools:
        params["tools"] = request.tools
    if request.tool_choice is not None:
        params["tool_choice"] = request.tool_choice
    return params


def complete_from_message(message: Any) -> MessageComplete:
    content: list[dict] = []
    for block in message.content:
        if block.type == "text":
            if block.text:
                content.append({"type": "text", "text": block.text})
        elif block.type == "tool_use":
            content.append(
                {"type": "tool_use", "id": block.id, "name": block.name, "input": block.input}
            )
        else:
            content.append(block.to_dict(mode="json", exclude_none=True))
    usage = message.usage
    return MessageComplete(
        content=content,
        stop_reason=message.stop_reason or "end_turn",
        usage=Usage(
            input_tokens=usage.input_tokens or 0,
            output_tokens=usage.output_tokens or 0,
            cache_read_tokens=usage.cache_read_input_tokens or 0,
            cache_write_tokens=usage.cache_creation_input_tokens or 0,
        ),
    )


def to_llm_error(exc: Exception, *, began: bool, text_sent: bool) -> LlmError:
    """Map an SDK or transport exception to an LlmError.

    began: the response headers had arrived and events were flowing.
    text_sent: at least one TextDelta had been yielded to the caller.
    """
    if isinstance(exc, anthropic.APIStatusError) and exc.status_code < 400:
        # An SSE error event inside a 200 stream: the body names the cause.
        error_type = str(exc.type or "")
        code = ERROR_TYPE_CODES.get(error_type, "upstream_error")
        return LlmError(code, detail=f"error event {error_type or 'without type'}")
    if text_sent:
        return LlmError("stream_interrupted", detail=_describe(exc))
    if isinstance(exc, anthropic.APIStatusError):
        status = exc.status_code
        return LlmError(
            _status_code(status, str(exc.type or "")),
            status=status,
            detail=f"http {status} {exc.type or ''}".strip(),
        )
    if isinstance(exc, (anthropic.APITimeoutError, httpx2.TimeoutException)):
        return LlmError("timeout", detail=_describe(exc))
    if isinstance(exc, anthropic.APIConnectionError):
        return LlmError("unreachable", detail=_describe(exc))
    if isinstance(exc, (httpx2.TransportError, httpx2.StreamError)):
        return LlmError("stream_interrupted" if began else "unreachable", detail=_describe(exc))
    return LlmError("upstream_error", detail=_describe(exc))


def _status_code(status: int, error_type: str) -> str:
    if status == 429:
        return "rate_limited"
    if status == 529:
        return "overloaded"
    if status in (401, 403):
        return "auth_failed"
    if status == 408:
        return "timeout"
    if status in (400, 404, 413, 422):
        return "bad_request"
    return ERROR_TYPE_CODES.get(error_type, "upstream_error") if status < 500 else "upstream_error"


def _retry_after(headers: Any) -> float | None:
    """Seconds the server asked us to wait, from retry-after-ms or retry-after."""
    for name, scale in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        raw = headers.get(name)
        if raw is None:
            continue
        try:
            value = float(raw) / scale
        except ValueError:
            continue
        if value >= 0:
            return value
    return None


def _asked_wait(headers: Any) -> float | None:
    """Seconds a retry hint asks for: retry-after-ms, retry-after in seconds or as a date."""
    if headers is None:
        return None
    seconds = _retry_after(headers)
    if seconds is not None:
        return seconds
    date = email.utils.parsedate_tz(headers.get("retry-after") or "")
    return None if date is None else email.utils.mktime_tz(date) - time.time()


def _describe(exc: BaseException) -> str:
    # The cause of an SDK connection error is the transport error that says
    # what actually happened (refused, reset, incomplete body).
    text = f"{type(exc).__name__}: {exc}"
    cause = exc.__cause__
    if isinstance(exc, anthropic.AnthropicError) and cause is not None:
        text += f" ({type(cause).__name__}: {cause})"
    return text[:300]
