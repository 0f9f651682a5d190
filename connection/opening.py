"""What a connection is built from once its key is accepted: the session
machine's limits, what HANDSHAKE_ACK offers, the tenant's server tools, and
the agent with its store, backend and quota -- put together here, once per
session.
"""
from __future__ import annotations

from dataclasses import asdict

import speech
from agent.loop import Agent, AgentConfig, TurnIO
from agent.store import AgentStore
from aitp import ports
from aitp.limits import ConnectionLimits
from aitp.quota import TokenQuota
from aitp.session import Limits
from llm import get_backend
from runtime import ids
from runtime.config import config, derived
from runtime.recent import RecentAnswers

CAPABILITIES = ("text", "tools")
VOICE_CAPABILITIES = ("text", "audio", "tools")


async def capabilities() -> tuple[str, ...]:
    """What HANDSHAKE_ACK offers: "audio" only when voice is on and both
    speech engines work (checked once per process, in a speech worker)."""
    if config().voice.enabled and await speech.audio_available_async():
        return VOICE_CAPABILITIES
    return CAPABILITIES


@derived
def session_limits() -> Limits:
    protocol = config().protocol
    return Limits(
        max_message_bytes=protocol.max_message_bytes,
        max_active_tools=protocol.max_active_tools,
        max_context_bytes=protocol.max_context_bytes,
        max_invalid_frames=protocol.max_invalid_frames,
        max_input_chars=protocol.max_input_chars,
        max_json_depth=protocol.max_json_depth,
        max_audio_seconds=config().voice.limits.max_utterance_seconds,
    )


@derived
def agent_config() -> AgentConfig:
    return AgentConfig(**asdict(config().agent))


def new_session_id() -> str:
    return "ses_" + ids.token_hex(12)


def build_agent(session, server_tools: list, io: TurnIO, limits: ConnectionLimits) -> Agent:
    """The session's agent: its tenant's prompt and server tools, the LLM
    backend, its store, and the input limits and token quota it shares with
    the connection."""
    return Agent(
        session_id=session.id,
        tenant_id=session.tenant_id,
        system_prompt=session.tenant.system_prompt,
        backend=get_backend(),
        config=agent_config(),
        io=io,
        store=AgentStore(session_id=session.id, tenant_id=session.tenant_id),
        server_tools={tool.spec.name: tool for tool in server_tools},
        limits=limits,
        quota=limits.watch_token_quota(TokenQuota(session_id=session.id, tenant_id=session.tenant_id)),
    )


# How long a tenant's server tools, once read, serve its next opens: a change
# to them (the console, the admin) reaches new sessions within this time; at
# fifty opens a second of one tenant, the read happens once instead of fifty
# times. Sessions already open keep the tools they opened with.
SERVER_TOOLS_FRESH_FOR = 1.0
_server_tools: RecentAnswers[list] = RecentAnswers(lambda: SERVER_TOOLS_FRESH_FOR)


async def load_server_tools(tenant_id: int) -> list:
    return await _server_tools.get(tenant_id, lambda: ports.approvals().load_server_tools(tenant_id))
