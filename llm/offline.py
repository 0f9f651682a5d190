"""A backend that needs no network: for demos and for trying a page's tools without tokens.

It answers from the conversation alone:
- "/tool <name> {json}" as the last user text calls that tool once (also
  after tool results in the same message: a turn cut before its answer);
- tool results in the last user message are told in words, one paragraph per
  result (a JSON result becomes a list of its fields, never raw JSON);
- anything else gets a short explanation listing the tools on offer, each with
  the parameters its declared schema names, and an example call built from them.
"""
from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator

from aitp.llm import LlmRequest, MessageComplete, StreamEvent, TextDelta, Usage
from runtime import ids

NO_MODEL_TEXT = (
    "No language model is configured on this server, so I can only run tools for you. "
    "Type /tool <name> followed by its arguments as JSON to call one."
)
NO_TOOLS_TEXT = "There are no tools on this page."
SYNTAX_TEXT = (
    "I could not read that command. Type /tool <name> followed by an optional JSON object "
    "of its arguments, for example: {example}"
)
# The syntax example when the page offers no tool with parameters: a tool of
# the demo store, with the arguments it takes.
FALLBACK_EXAMPLE = '/tool add_to_cart {"quantity": 2}'
NO_TOOLS_NOW_TEXT = "I cannot call a tool for this answer."

# The longest field of a result told in words.
MAX_RESULT_CHARS = 500
WORDS_PER_DELTA = 3

_COMMAND = re.compile(r"^/tool(?:\s+(?P<name>\S+))?(?P<args>.*)$", re.DOTALL)
_WORD = re.compile(r"\s*\S+\s*")


class OfflineBackend:
    name = "offline"

    def __init__(self, config: object = None) -> None:
        """Made with the configuration's llm part, as every backend is; it needs none of it."""

    async def stream(self, request: LlmRequest) -> AsyncIterator[StreamEvent]:
        async for event in streamed(*answer(request)):
            yield event


async def streamed(content: list[dict], stop_reason: str) -> AsyncIterator[StreamEvent]:
    """A scripted answer as a model's stream gives it: its text a few words at
    a time, then the whole message."""
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
    # The user's own words; the agent adds "[page]" blocks describing the page.
    text = "".join(
        block.get("text", "")
        for block in blocks
        if block.get("type") == "text" and not block.get("text", "").startswith("[page]")
    ).strip()
    # Results told, unless the user's words after them (a turn cut before its
    # answer, then a new message) ask for a tool.
    if results and not text.startswith("/tool"):
        names = _tool_names(request.messages[:-1])
        return [_text(summarise_results(results, names))], "end_turn"
    if text.startswith("/tool"):
        if (request.tool_choice or {}).get("type") == "none":
            return [_text(NO_TOOLS_NOW_TEXT)], "end_turn"
        call = parse_command(text)
        if call is None:
            return [_text(SYNTAX_TEXT.format(example=example_call(request.tools)))], "end_turn"
        name, arguments = call
        tool_use = {
            "type": "tool_use",
            "id": "toolu_off_" + ids.token_hex(6),
            "name": name,
            "input": arguments,
        }
        return [tool_use], "tool_use"

    return [_text(help_text(request.tools))], "end_turn"


# --- what the tools on offer take -------------------------------------------------------


def help_text(tools: list[dict]) -> str:
    """What this backend can do here: each tool with its parameters, and an example."""
    named = [tool for tool in tools if tool.get("name")]
    if not named:
        return NO_MODEL_TEXT + "\n\n" + NO_TOOLS_TEXT
    lines = [NO_MODEL_TEXT, "", "Tools on this page:"]
    lines += [f"- {describe_tool(tool)}" for tool in named]
    lines += ["", f"For example: `{example_call(named)}`"]
    return "\n".join(lines)


def describe_tool(tool: dict) -> str:
    """`name` (param: type, required; ...) description."""
    params = _parameters(tool)
    required = set(_schema(tool).get("required") or [])
    parts = []
    for name, schema in params.items():
        facts = [_type_words(schema)]
        if name in required:
            facts.append("required")
        parts.append(f"`{name}` ({', '.join(facts)})")
    takes = "takes " + ", ".join(parts) if parts else "takes no arguments"
    description = str(tool.get("description") or "").strip()
    return f"`{tool['name']}` {takes}" + (f": {description}" if description else "")


def example_call(tools: list[dict]) -> str:
    """A command for the first tool that takes arguments, with values its schema allows."""
    for tool in tools:
        params = _parameters(tool)
        if not tool.get("name") or not params:
            continue
        required = _schema(tool).get("required") or list(params)
        args = {name: _example_value(params[name]) for name in required if name in params}
        return f"/tool {tool['name']} {json.dumps(args, ensure_ascii=False)}"
    return FALLBACK_EXAMPLE


def _schema(tool: dict) -> dict:
    schema = tool.get("input_schema")
    return schema if isinstance(schema, dict) else {}


def _parameters(tool: dict) -> dict[str, dict]:
    properties = _schema(tool).get("properties")
    if not isinstance(properties, dict):
        return {}
    return {name: (value if isinstance(value, dict) else {}) for name, value in properties.items()}


def _type_words(schema: dict) -> str:
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return "one of " + ", ".join(json.dumps(v, ensure_ascii=False) for v in schema["enum"])
    kind = schema.get("type")
    if kind == "array" and isinstance(schema.get("items"), dict):
        return "list of " + _type_words(schema["items"])
    return str(kind) if isinstance(kind, str) else "any value"


_EXAMPLE_IN_TEXT = re.compile(r"\be\.g\.,?\s*([^\s,;)]+)")
_EXAMPLES = {"number": 1, "integer": 1, "boolean": True, "object": {}, "array": []}


def _example_value(schema: dict):
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return schema["enum"][0]
    kind = schema.get("type")
    if kind == "string":
        # "The order number, e.g. A1001" shows what a real one looks like.
        found = _EXAMPLE_IN_TEXT.search(str(schema.get("description") or ""))
        return found.group(1).rstrip(".") if found else "text"
    return _EXAMPLES.get(kind, "text")


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


# --- tool results in words ----------------------------------------------------------------


def summarise_results(results: list[dict], names: dict[str, str]) -> str:
    """One paragraph per result: "<name> succeeded." or "<name> failed: <why>",
    then what a JSON result holds as a list of its fields, in words."""
    return "\n\n".join(
        _summarise(names.get(result.get("tool_use_id", ""), "the tool"), result)
        for result in results
    )


def _summarise(name: str, result: dict) -> str:
    failed = bool(result.get("is_error"))
    body = _result_text(result.get("content")).strip()
    try:
        data = json.loads(body) if body else None
    except ValueError:
        data = body
    if failed:
        why = data if isinstance(data, str) else (_words(data) if data is not None else "")
        return f"{name} failed: {_cut(why)}" if why else f"{name} failed."
    if isinstance(data, dict) and data:
        fields = [f"- {_label(key).capitalize()}: {_cut(_words(value))}" for key, value in data.items()]
        return "\n".join([f"{name} succeeded.", *fields])
    if data is None or data == {} or data == []:
        return f"{name} succeeded."
    return f"{name} succeeded: {_cut(_words(data))}"


_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")


def _label(key: object) -> str:
    """productId, line_total -> "product id", "line total"."""
    return _CAMEL.sub(" ", str(key)).replace("_", " ").lower().strip() or "value"


def _words(value: object) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if value is None:
        return "none"
    if isinstance(value, str):
        return value
    if isinstance(value, (int, float)):
        return json.dumps(value)
    if isinstance(value, dict):
        return ", ".join(_field_words(key, item) for key, item in value.items()) or "nothing"
    if isinstance(value, list):
        if not value:
            return "none"
        if all(isinstance(item, dict) for item in value):
            return "; ".join(f"({_words(item)})" for item in value)
        return ", ".join(_words(item) for item in value)
    return str(value)


def _field_words(key: object, value: object) -> str:
    """One field of a nested object: "total 299.98", "no items"."""
    if value == [] or value == {}:
        return f"no {_label(key)}"
    return f"{_label(key)} {_words(value)}"


def _cut(text: str) -> str:
    # Long results are cut so the answer stays readable in a chat bubble.
    return text if len(text) <= MAX_RESULT_CHARS else text[:MAX_RESULT_CHARS] + "…"


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
