"""The small interface every LLM backend speaks: a request in, a stream of events out.

Kept free of Django and of any SDK so the agent turn can be tested with a
hand-written backend, and so the request and result shapes stay plain data
(Anthropic Messages API dicts) that can be stored and sent back verbatim.
The protocol app keeps the interface (its quotas count a request's tokens:
aitp/quota.py); the backends live above it, in llm/.
"""
from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass
class LlmRequest:
    model: str
    # Anthropic system text blocks; they may carry cache_control.
    system: list[dict[str, Any]]
    # Anthropic MessageParam dicts: {"role": ..., "content": [blocks] or "text"}.
    messages: list[dict[str, Any]]
    # Anthropic tool dicts (name, description, input_schema, maybe cache_control); may be [].
    tools: list[dict[str, Any]]
    max_tokens: int
    # e.g. {"type": "none"} to force an answer without tools.
    tool_choice: dict[str, Any] | None = None


@dataclass
class Usage:
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0


@dataclass
class TextDelta:
    text: str


@dataclass
class MessageComplete:
    # Final assistant content blocks as plain JSON dicts, ready to send back to
    # the API: {"type": "text", "text": ...} and
    # {"type": "tool_use", "id": ..., "name": ..., "input": {...}}, in order,
    # without empty text blocks (the API rejects those when sent back).
    content: list[dict[str, Any]]
    stop_reason: str
    usage: Usage = field(default_factory=Usage)

    @property
    def tool_uses(self) -> list[dict[str, Any]]:
        return [block for block in self.content if block.get("type") == "tool_use"]

    @property
    def text(self) -> str:
        return "".join(block["text"] for block in self.content if block.get("type") == "text")


StreamEvent = TextDelta | MessageComplete


# Sentences a page user may see. They say what happened and what to do, never
# why in upstream terms: the detail goes to the log.
ERROR_MESSAGES: dict[str, str] = {
    "rate_limited": "The assistant is busy right now, please try again shortly.",
    "overloaded": "The assistant is overloaded right now, please try again shortly.",
    "upstream_error": "The assistant ran into a problem, please try again.",
    "timeout": "The assistant took too long to answer, please try again.",
    "unreachable": "The assistant cannot be reached right now, please try again later.",
    "stream_interrupted": "The answer was interrupted, please try again.",
    "auth_failed": "The assistant is not set up correctly on this server.",
    "bad_request": "The assistant could not handle this request.",
}


class LlmError(Exception):
    """Every upstream failure, whatever the backend, as one of a few codes.

    code: rate_limited, overloaded, upstream_error, timeout, unreachable,
    stream_interrupted, auth_failed or bad_request.
    message: a short sentence safe to show a page user.
    detail: a short technical fact for the log (never shown to a page user).
    """

    def __init__(
        self,
        code: str,
        message: str | None = None,
        status: int | None = None,
        *,
        detail: str = "",
    ) -> None:
        if code not in ERROR_MESSAGES:
            raise ValueError(f"unknown llm error code {code!r}")
        self.code = code
        self.message = message or ERROR_MESSAGES[code]
        self.status = status
        self.detail = detail
        super().__init__(f"{code}: {detail or self.message}")


class LlmBackend(Protocol):
    name: str

    def stream(self, request: LlmRequest) -> AsyncIterator[StreamEvent]:
        """Yield TextDelta events as text arrives, then exactly one MessageComplete, then stop.

        Raises LlmError for every upstream failure (never a raw SDK or HTTP
        exception). Cancellable at any await: on CancelledError it closes the
        HTTP stream and re-raises. Iterate it inside contextlib.aclosing() so
        that leaving the loop early closes the stream at once.
        """
        ...
