"""What a server tool declares: the registry of Python handlers in code, and
the ``ToolSpec`` a ``ServerTool`` row offers.

Imports no model, so ``approvals.models`` validates rows with it and
``approvals.server_tools`` (which loads rows and runs them) builds on both,
with no import cycle between them.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aitp.tools import Risk, ToolError, ToolSpec, parse_tool

# ServerTool.Kind.PYTHON, as the row stores it.
PYTHON_KIND = "python"


@dataclass(frozen=True)
class PythonTool:
    spec: ToolSpec
    # handler(args, *, session_id, tenant_id) -> JSON-able result; sync
    # handlers run in a thread (they may use the ORM), async ones are awaited.
    handler: Callable[..., Any]


_registry: dict[str, PythonTool] = {}


def register_python_tool(name: str, *, description: str, parameters: dict | None,
                         risk: str = "none"):
    """Decorator: make a function available as the server tool ``name``."""
    spec = parse_tool(
        {"name": name, "description": description, "parameters": parameters, "risk": risk},
        origin="server", path=f"python tool {name}",
    )

    def decorator(func: Callable[..., Any]) -> Callable[..., Any]:
        existing = _registry.get(name)
        if existing is not None and existing.handler is not func:
            raise ValueError(f"python tool {name!r} is already registered")
        _registry[name] = PythonTool(spec=spec, handler=func)
        return func

    return decorator


def python_tool(name: str) -> PythonTool | None:
    return _registry.get(name)


def python_tool_names() -> list[str]:
    return sorted(_registry)


def registered_tool(name: str) -> PythonTool:
    return _registry[name]


def spec_for_row(row) -> ToolSpec:
    """The declaration a ServerTool row offers; raises ToolError when invalid.

    A Python tool row may leave description and parameters empty to use the
    handler's own, and can raise the risk above the handler's, never lower it.
    """
    description, parameters, risk = row.description, row.parameters, row.risk
    if row.kind == PYTHON_KIND:
        tool = _registry.get(row.python_handler)
        if tool is None:
            raise ToolError(f"{row.name}: python handler {row.python_handler!r} is not registered")
        description = description or tool.spec.description
        parameters = parameters if parameters is not None else tool.spec.parameters
        risk = Risk.highest(risk, tool.spec.risk).value
    return parse_tool(
        {"name": row.name, "description": description, "parameters": parameters, "risk": risk},
        origin="server", path=row.name,
    )
