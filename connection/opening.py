"""What a connection is built from once its key is accepted: the session
machine's limits, what HANDSHAKE_ACK offers, the tenant's server tools, and
the agent with its store, backend and quota -- put together here, once per
session.
"""
from __future__ import annotations

from django.conf import settings

from aitp import ids, ports, voice
from aitp.agent import Agent, AgentConfig, TurnIO
from aitp.agent_store import AgentStore
from aitp.conf import from_settings
from aitp.limits import ConnectionLimits
from aitp.llm import get_backend
from aitp.quota import TokenQuota
from aitp.recent import RecentAnswers
from aitp.session import Limits

CAPABILITIES = ("text", "tools")
VOICE_CAPABILITIES = ("text", "audio", "tools")


async def capabilities() -> tuple[str, ...]:
    """What HANDSHAKE_ACK offers: "audio" only when voice is on and both
    speech engines work (checked once per process, in a speech worker)."""
    if settings.OWLLAYER_VOICE and await voice.audio_available_async():
        return VOICE_CAPABILITIES
    return CAPABILITIES


@from_settings
def limits_from_settings() -> Limits:
    return Limits(
        max_message_bytes=settings.OWLLAYER_MAX_MESSAGE_BYTES,
        max_active_tools=settings.OWLLAYER_MAX_ACTIVE_TOOLS,
        max_context_bytes=settings.OWLLAYER_MAX_CONTEXT_BYTES,
        max_invalid_frames=settings.OWLLAYER_MAX_INVALID_FRAMES,
        max_input_chars=settings.OWLLAYER_MAX_INPUT_CHARS,
        max_json_depth=settings.OWLLAYER_MAX_JSON_DEPTH,
        max_audio_seconds=settings.OWLLAYER_VOICE_MAX_UTTERANCE_SECONDS,
    )


@from_settings
def agent_config_from_settings() -> AgentConfig:
    return AgentConfig(
        model=settings.OWLLAYER_MODEL,
        max_tokens=settings.OWLLAYER_MAX_TOKENS,
        tool_timeout=settings.OWLLAYER_TOOL_TIMEOUT,
        approval_timeout=settings.OWLLAYER_APPROVAL_TIMEOUT,
        max_tool_rounds=settings.OWLLAYER_MAX_TOOL_ROUNDS,
        history_messages=settings.OWLLAYER_HISTORY_MESSAGES,
        stream_interval=settings.OWLLAYER_STREAM_INTERVAL,
        max_json_depth=settings.OWLLAYER_MAX_JSON_DEPTH,
    )


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
        config=agent_config_from_settings(),
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
