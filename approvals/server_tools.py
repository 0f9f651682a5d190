"""Tools that run on the server: a tenant's webhooks and Python handlers in code.

A Python tool is registered with ``@register_python_tool`` (the registry and
what a row declares live in ``approvals.tool_specs``, which the models use
too); a tenant offers
it (or a webhook) to its sessions with an enabled ``ServerTool`` row.
``load_server_tools`` turns those rows into ``ServerToolDef`` objects that the
agent runs.
"""
from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from django.db import connection

from aitp.tools import ToolError, ToolSpec
from approvals.models import Policy, ServerTool
from approvals.tool_specs import (
    PythonTool,
    python_tool,
    python_tool_names,
    register_python_tool,
    registered_tool,
    spec_for_row,
)
from approvals.webhooks import ToolRunError, call_webhook, tool_networks
from runtime.config import config
from runtime.db import db_call

logger = logging.getLogger(__name__)

__all__ = [
    "PythonTool", "ServerToolDef", "ToolRunError", "load_server_tools", "python_tool",
    "python_tool_def", "python_tool_names", "register_python_tool", "spec_for_row",
]

Runner = Callable[..., Awaitable[Any]]


@dataclass(frozen=True)
class ServerToolDef:
    spec: ToolSpec  # origin="server"
    policy: str  # user / operator / user_and_operator
    runner: Runner = field(repr=False, compare=False)

    @property
    def name(self) -> str:
        return self.spec.name

    async def run(self, args: dict, *, session_id: str, tenant_id: int, call_id: str = "") -> Any:
        """Run the tool; raises ToolRunError with a message fit for the model."""
        return await self.runner(args, session_id=session_id, tenant_id=tenant_id, call_id=call_id)


def _python_runner(tool: PythonTool) -> Runner:
    handler = tool.handler
    is_async = inspect.iscoroutinefunction(handler)
    name = tool.spec.name

    async def run(args: dict, *, session_id: str, tenant_id: int, call_id: str) -> Any:
        try:
            if is_async:
                return await handler(args, session_id=session_id, tenant_id=tenant_id)
            return await db_call(handler, args, session_id=session_id, tenant_id=tenant_id)
        except ToolRunError:
            raise
        except Exception as exc:
            # A bug in a handler: log it whole, give the model a plain fact.
            logger.exception("session %s: python tool %s failed", session_id, name)
            raise ToolRunError("tool failed") from exc

    return run


def _webhook_runner(row: ServerTool) -> Runner:
    url, secret, timeout, name = row.webhook_url, row.webhook_secret, row.timeout_seconds, row.name
    max_bytes = config().webhooks.max_bytes
    networks = tool_networks(row.webhook_networks)

    async def run(args: dict, *, session_id: str, tenant_id: int, call_id: str) -> Any:
        try:
            return await call_webhook(
                url=url, secret=secret, tool=name, arguments=args, session_id=session_id,
                call_id=call_id, timeout=timeout, max_bytes=max_bytes, allowed_networks=networks,
            )
        except RecursionError:
            # JSON nested past what json.loads can walk (a few hundred KiB of
            # "[" is enough): a plain fact for the model, not Python's words.
            raise ToolRunError("webhook returned JSON nested too deeply") from None

    return run


def python_tool_def(name: str, *, policy: str = Policy.USER) -> ServerToolDef:
    """A registered Python tool as the agent runs it, without a database row."""
    tool = registered_tool(name)
    return ServerToolDef(spec=tool.spec, policy=Policy(policy).value, runner=_python_runner(tool))


def _def_for_row(row: ServerTool) -> ServerToolDef | None:
    try:
        spec = spec_for_row(row)
    except ToolError as exc:
        logger.warning("tenant %s: server tool %s skipped: %s", row.tenant_id, row.name, exc.message)
        return None
    if row.kind == ServerTool.Kind.PYTHON:
        runner = _python_runner(registered_tool(row.python_handler))
    elif row.kind == ServerTool.Kind.WEBHOOK and row.webhook_url.startswith(("http://", "https://")):
        runner = _webhook_runner(row)
    else:
        logger.warning("tenant %s: server tool %s skipped: no usable webhook url",
                       row.tenant_id, row.name)
        return None
    return ServerToolDef(spec=spec, policy=row.approval_policy, runner=runner)


async def load_server_tools(tenant_id: int) -> list[ServerToolDef]:
    """The tenant's enabled server tools, ready to run (one query, on the
    database threads: the async ORM would queue it behind every other
    session's work on one thread)."""
    return await db_call(server_tools_for_tenant, tenant_id)


def server_tools_for_tenant(tenant_id: int) -> list[ServerToolDef]:
    defs = []
    for row in ServerTool.objects.raw(_enabled_tools_sql(connection.vendor), [tenant_id, True]):
        tool_def = _def_for_row(row)
        if tool_def is not None:
            defs.append(tool_def)
    return defs


@functools.cache
def _enabled_tools_sql(vendor: str) -> str:
    """Every session open reads its tenant's tools: the query's text is built
    once per database instead of compiled by the ORM each time."""
    quote = connection.ops.quote_name
    meta = ServerTool._meta
    column = {f.name: quote(f.column) for f in meta.concrete_fields}
    return (f"SELECT * FROM {quote(meta.db_table)} WHERE {column['tenant']} = %s "
            f"AND {column['enabled']} = %s ORDER BY {column['name']}")
