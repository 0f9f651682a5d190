"""A backend that needs no network: for demos and for trying a page's tools without tokens.

It answers from the conversation alone:
- "/tool <name> {json}" as the last user text calls that tool once;
- tool results in the last user message are summarised, one line per result;
- anything else gets a short explanation listing the page's tools.
"""
from __future__ import annotations

import asyncio
import json
import re
import secrets
from typing import AsyncIterator

from .base import LlmRequest, MessageComplete, StreamEvent, TextDelta, Usage

NO_MODEL_TEXT = (
    "No language model is configured on this server, so I can only run page tools for you. "
    "Type /tool <name> {json arguments} to call one. Tools on this page: {tools}."
)
SYNTAX_TEXT = (
    "I could not read that command. Type /tool <name> followed by an optional JSON object, "
    'for example: /tool add_to_cart {"sku": "A1", "quantity": 2}'
)
NO_TOOLS_NOW_TEXT = "I cannot call a tool for this answer."

# Long tool results are cut so the summary stays readable in a chat bubble.
MAX_RESULT_CHARS = 500
WORDS_PER_DELTA = 3

_COMMAND = re.compile(r"^/tool(?:\s+(?P<name>\S+))?(?P<args>.*)$", re.DOTALL)
_WORD = re.compile(r"\s*\S+\s*")


class OfflineBackend:
    name = "offline"

    async def stream(self, request: LlmRequest) -> AsyncIterator[StreamEvent]:
        content, stop_reason = answer(request)
        text = "".join(block["text"] for block in content if block["type"] == "text")
        for piece in split_words(text):
            yield TextDelta(piece)
            # Give the loop a turn between pieces, as a network stream would.
            await asyncio.sleep(0)
        yield MessageComplete(content=content, stop_reason=stop_reason, usage=Usage())


def answer(request: LlmRequest) -> tuple[list[dict], str]:
    """The content blocks and stop reason for this request."""
    last = request.messages[-1] if request.messages else {"role": "user", "content": []}
    blocks = _blocks(last) if last.get("role") == "user" else []

    results = [block for block in blocks if block.get("type") == "tool_result"]
    if results:
        names = _tool_names(request.messages[:-1])
        return [_text(summarise_results(results, names))], "end_turn"

    # The user's own words; the agent adds "[page]" blocks describing the page.
    text = "".join(
        block.get("text", "")
        for block in blocks
        if block.get("type") == "text" and not block.get("text", "").startswith("[page]")
    ).strip()
    if text.startswith("/tool"):
        if (request.tool_choice or {}).get("type") == "none":
            return [_text(NO_TOOLS_NOW_TEXT)], "end_turn"
        call = parse_command(text)
        if call is None:
            return [_text(SYNTAX_TEXT)], "end_turn"
        name, arguments = call
        tool_use = {
            "type": "tool_use",
            "id": "toolu_off_" + secrets.token_hex(6),
            "name": name,
            "input": arguments,
        }
        return [tool_use], "tool_use"

    names = [tool["name"] for tool in request.tools if tool.get("name")]
    return [_text(NO_MODEL_TEXT.replace("{tools}", ", ".join(names) or "none"))], "end_turn"


def parse_command(text: str) -> tuple[str, dict] | None:
    """("name", arguments) for "/tool name {json}", or None when it does not parse."""
    match = _COMMAND.match(text)
    if match is None or not match.group("name"):
        return None
    raw = match.group("args").strip()
    if not raw:
        return match.group("name"), {}
    try:
        arguments = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(arguments, dict):
        return None
    return match.group("name"), arguments


def summarise_results(results: list[dict], names: dict[str, str]) -> str:
    lines = []
    for result in results:
        name = names.get(result.get("tool_use_id", ""), "the tool")
        outcome = "failed" if result.get("is_error") else "succeeded"
        body = _result_text(result.get("content"))
        if len(body) > MAX_RESULT_CHARS:
            body = body[:MAX_RESULT_CHARS] + "…"
        lines.append(f"{name} {outcome}: {body}" if body else f"{name} {outcome}.")
    return "\n".join(lines)


def split_words(text: str) -> list[str]:
    """Pieces of a few words each that join back to exactly the text."""
    # Each match carries the whitespace around its word, so the matches cover
    # the whole text whenever it holds at least one word.
    words = _WORD.findall(text)
    if not words:
        return [text] if text else []
    return ["".join(words[i:i + WORDS_PER_DELTA]) for i in range(0, len(words), WORDS_PER_DELTA)]


def _tool_names(messages: list[dict]) -> dict[str, str]:
    """tool_use id -> tool name, from the assistant messages, newest last."""
    names: dict[str, str] = {}
    for message in messages:
        if message.get("role") != "assistant":
            continue
        for block in _blocks(message):
            if block.get("type") == "tool_use":
                names[block.get("id", "")] = block.get("name", "the tool")
    return names


def _blocks(message: dict) -> list[dict]:
    content = message.get("content")
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return [block for block in content or [] if isinstance(block, dict)]


def _result_text(content: object) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for block in content:
            if isinstance(block, dict) and block.get("type") == "text":
                parts.append(block.get("text", ""))
            elif isinstance(block, dict):
                parts.append(f"[{block.get('type', 'block')}]")
        return " ".join(parts)
    return json.dumps(content, ensure_ascii=False)


def _text(text: str) -> dict:
    return {"type": "text", "text": text}
