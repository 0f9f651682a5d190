"""The tools the page declared, and how the client answers a TOOL_CALL for
one of them: as the browser does, the handler never sees arguments that do
not fit the tool's declared parameters."""
from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from aitp.tools import ToolError, aitp_to_json_schema, validate_arguments

ToolHandler = Callable[[str, dict], Any]


class PageTools:
    """The tools of the last CONTEXT_UPDATE, by name: a TOOL_CALL for one of
    them is answered only when its arguments fit its parameters."""

    def __init__(self) -> None:
        self.declared: dict[str, dict] = {}

    def declare(self, tools: Iterable[Any]) -> None:
        self.declared = {tool["name"]: tool for tool in tools if isinstance(tool, dict) and "name" in tool}

    async def answer(self, payload: dict, handler: ToolHandler,
                     reply: Callable[..., Awaitable[dict]]) -> None:
        """Answer one TOOL_CALL through ``reply(call_id, result=..., error=...)``:
        with the handler's return value, or its exception as the error."""
        problems = arguments_problems(self.declared.get(payload["name"]), payload["args"])
        if problems:
            await reply(payload["callId"], error="invalid arguments: " + "; ".join(problems))
            return
        try:
            result = await maybe_await(handler(payload["name"], payload["args"]))
        except Exception as exc:  # the handler's failure is the tool's error, as in the browser
            await reply(payload["callId"], error=str(exc) or type(exc).__name__)
        else:
            await reply(payload["callId"], result=result)


def arguments_problems(tool: dict | None, args: Any) -> list[str]:
    """Why ``args`` do not fit a declared tool's parameters (empty: they do),
    checked by the server's own function (``aitp.tools.validate_arguments``).
    A tool this client never declared, or declared with parameters the
    server refuses, is left to the handler."""
    if tool is None:
        return []
    try:
        schema = aitp_to_json_schema(tool.get("parameters"))
    except ToolError:
        return []
    return validate_arguments(schema, args)


async def maybe_await(value: Any) -> Any:
    if inspect.isawaitable(value):
        return await value
    return value
