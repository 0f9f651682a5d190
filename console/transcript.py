"""Stored conversation content (Anthropic content blocks) -> what the session page shows.

Pure: no Django. The stored shapes are the ones sent to the model: content is
a list of blocks (text, tool_use, tool_result), or, from older rows or other
writers, a bare string. Anything else is shown as JSON rather than dropped, so
the record is never silently incomplete.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Block:
    kind: str  # "text", "tool_use", "tool_result" or "other"
    text: str
    name: str = ""  # tool name (tool_use)
    ref: str = ""  # tool_use id (tool_use, tool_result)
    is_error: bool = False


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, indent=2, sort_keys=True, default=str)


def _result_text(content: Any) -> str:
    """A tool_result's content: a string, or a list of text/image blocks."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for item in content:
            if isinstance(item, dict) and item.get("type") == "text":
                parts.append(str(item.get("text", "")))
            else:
                parts.append(_json(item))
        return "\n".join(parts)
    return _json(content)


def message_blocks(content: Any) -> list[Block]:
    if isinstance(content, str):
        return [Block(kind="text", text=content)]
    if not isinstance(content, list):
        return [Block(kind="other", text=_json(content))]
    blocks = []
    for item in content:
        kind = item.get("type") if isinstance(item, dict) else None
        if kind == "text":
            blocks.append(Block(kind="text", text=str(item.get("text", ""))))
        elif kind == "tool_use":
            blocks.append(
                Block(
                    kind="tool_use",
                    text=_json(item.get("input", {})),
                    name=str(item.get("name", "")),
                    ref=str(item.get("id", "")),
                )
            )
        elif kind == "tool_result":
            blocks.append(
                Block(
                    kind="tool_result",
                    text=_result_text(item.get("content")),
                    ref=str(item.get("tool_use_id", "")),
                    is_error=bool(item.get("is_error", False)),
                )
            )
        else:
            blocks.append(Block(kind="other", text=_json(item)))
    return blocks


def pretty_json(value: Any) -> str:
    """For tool arguments and results on the session page."""
    if value is None:
        return ""
    return _json(value)
