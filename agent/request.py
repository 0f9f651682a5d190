"""What the agent asks the model each round -- the system prompt with the
tool guidance, the page's tools as the model gets them (risk noted), the
conversation window with its cache breakpoint --, the asking itself (the
token quota reserved, the answer streamed to the page and the voice), and
what of its answer the record may hold.
"""
from __future__ import annotations

import contextlib
import logging

from agent.parts import AgentConfig
from agent.text import TextStreamer, bounded_history
from agent.voice import Speaker
from aitp import protocol as p
from aitp.ledger import INVALID_ARGS, Outcome, checked_arguments, unusable_arguments
from aitp.llm import LlmBackend, LlmError, LlmRequest, MessageComplete, TextDelta, Usage
from aitp.quota import TokenQuota
from aitp.tools import Risk, ToolSurface

logger = logging.getLogger(__name__)

TOOL_GUIDANCE = (
    "You act inside the user's web page through tools that the page declares.\n"
    "- Tools of risk none or low: call them directly when they serve the user's request; do not ask "
    "for confirmation.\n"
    "- Tools of risk high or critical: call them directly as well. The page itself asks the user to "
    "approve the action before it runs. Never ask the user to confirm in the chat or by voice "
    "instead, and never say the action happened until its tool result says so.\n"
    "- If a tool result is an error, or the user declined, say so plainly and do not retry the same "
    "call unasked.\n"
    "- The page the user is on is described in [page] blocks; after a tool navigates, a new [page] "
    "block shows the new page and its tools."
)

RISK_NOTES = {
    Risk.HIGH: " (risk: high; the user approves it in the page before it runs)",
    Risk.CRITICAL: " (risk: critical; the user approves it in the page before it runs)",
}


# Declared, never callable (tool_choice none), when the page has no tools but
# the history holds tool blocks.
NO_TOOLS_PLACEHOLDER = {
    "name": "no_tools_on_this_page",
    "description": "The page offers no tools right now. This tool cannot be called.",
    "input_schema": {"type": "object", "properties": {}},
}


class ToolParams:
    """The tools as the model gets them, built once per tool surface (a
    fresh list each time; its dicts are shared, and nothing writes to them)."""

    def __init__(self) -> None:
        self._for: ToolSurface | None = None
        self._tools: list[dict] = []

    def __call__(self, surface: ToolSurface) -> list[dict]:
        if self._for is not surface:
            tools = surface.anthropic_tools()
            by_name = {spec.name: spec for spec in surface.effective}
            for tool in tools:
                note = RISK_NOTES.get(by_name[tool["name"]].risk) if tool["name"] in by_name else None
                if note:
                    tool["description"] = (tool.get("description") or "") + note
            self._for, self._tools = surface, tools
        return list(self._tools)


def system_blocks(system_prompt: str) -> list[dict]:
    prompt = (system_prompt or "").strip()
    text = f"{prompt}\n\n{TOOL_GUIDANCE}" if prompt else TOOL_GUIDANCE
    return [{"type": "text", "text": text, "cache_control": {"type": "ephemeral"}}]


def build_request(*, config: AgentConfig, system_prompt: str, history: list[dict], tools: list[dict],
                  force_answer: bool) -> LlmRequest:
    # The history's own messages (nothing downstream writes to them); only
    # the last is copied, to carry the cache breakpoint: one at the end of
    # the conversation, so the next round (and the next turn) reads
    # everything before it from the cache.
    messages = list(bounded_history(history, config.history_messages))
    last = messages[-1]
    content = [dict(block) for block in last["content"]]
    content[-1]["cache_control"] = {"type": "ephemeral"}
    messages[-1] = {"role": last["role"], "content": content}
    tool_choice = {"type": "none"} if (force_answer and tools) else None
    if not tools and _has_tool_blocks(messages):
        # The API refuses tool_use/tool_result blocks in a request that
        # defines no tools, and a navigation can leave the page with none.
        tools = [dict(NO_TOOLS_PLACEHOLDER)]
        tool_choice = {"type": "none"}
    return LlmRequest(
        model=config.model,
        system=system_blocks(system_prompt),
        messages=messages,
        tools=tools,
        max_tokens=config.max_tokens,
        tool_choice=tool_choice,
    )


def _has_tool_blocks(messages: list[dict]) -> bool:
    return any(
        isinstance(block, dict) and block.get("type") in ("tool_use", "tool_result")
        for message in messages
        for block in message["content"]
    )


def as_recorded(content: list[dict], *, max_depth: int,
                session_id: str) -> tuple[list[dict], list[Outcome | None]]:
    """The model's message as the record may hold it, and for each of its
    tool_uses the outcome it ends with unrun, if any.

    What the model writes gets the check a page's frame gets
    (``aitp.protocol.find_unstorable``): its text keeps each character
    the layers cannot hold (U+0000, a lone surrogate) as U+FFFD, as the
    page was sent it (``agent.loop``), and so do a tool_use's id and name;
    a tool_use whose input no later layer
    could hold (the ledger's row, the conversation, a TOOL_CALL frame,
    the next model request) keeps an empty input and ends
    ``invalid_args``, the model told why in general terms."""
    recorded: list[dict] = []
    refused: list[Outcome | None] = []
    for block in content:
        kind = block.get("type")
        if kind == "text":
            text = p.storable_text(block["text"])
            if text is not block["text"]:
                block = {**block, "text": text}
        elif kind == "tool_use":
            fixed = {key: p.storable_text(block[key]) for key in ("id", "name")
                     if isinstance(block.get(key), str) and p.text_problem(block[key])}
            code = checked_arguments(block.get("input"), max_depth=max_depth)
            if code is not None:
                logger.warning("session %s: the model's input for %s cannot be used (%s)",
                               session_id, fixed.get("name", block.get("name")), code)
                fixed["input"] = {}
            refused.append(None if code is None
                           else Outcome(INVALID_ARGS, error=unusable_arguments(code)))
            if fixed:
                block = {**block, **fixed}
        recorded.append(block)
    return recorded, refused


async def ask_model(
    backend: LlmBackend, quota: TokenQuota | None, request: LlmRequest, usage: Usage,
    streamer: TextStreamer, full_text: list[str], speaker: Speaker | None = None,
) -> MessageComplete:
    """One model request, reserved against the tenant's token quota first
    (no room: ``QuotaExceeded`` ends the turn), its usage added to the
    turn's, then settled: the reservation released, the real tokens
    counted. A request that fails or is cancelled releases it."""
    if quota is None:
        completion = await _stream(backend, request, streamer, full_text, speaker)
        add_usage(usage, completion.usage)
        return completion
    reservation = await quota.reserve(request)
    try:
        completion = await _stream(backend, request, streamer, full_text, speaker)
    except BaseException:
        await quota.release(reservation)
        raise
    add_usage(usage, completion.usage)
    await quota.settle(reservation, completion.usage)
    return completion


async def _stream(
    backend: LlmBackend, request: LlmRequest, streamer: TextStreamer, full_text: list[str],
    speaker: Speaker | None = None,
) -> MessageComplete:
    separator_due = bool(full_text)
    async with contextlib.aclosing(backend.stream(request)) as events:
        async for event in events:
            if isinstance(event, TextDelta):
                # Sent, spoken and stored alike: what no later layer could
                # hold (U+0000, a lone surrogate) is U+FFFD (as_recorded).
                text = p.storable_text(event.text)
                if separator_due and text:
                    full_text.append("\n\n")
                    streamer.push("\n\n")
                    if speaker is not None:
                        speaker.feed("\n\n")
                    separator_due = False
                full_text.append(text)
                streamer.push(text)
                if speaker is not None:
                    speaker.feed(text)
            elif isinstance(event, MessageComplete):
                return event
    raise LlmError("stream_interrupted", "The answer was cut off. Please try again.")


def add_usage(total: Usage, more: Usage) -> None:
    total.input_tokens += more.input_tokens
    total.output_tokens += more.output_tokens
    total.cache_read_tokens += more.cache_read_tokens
    total.cache_write_tokens += more.cache_write_tokens
