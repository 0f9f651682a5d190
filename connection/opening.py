"""What a connection is built from once its key is accepted: the session
machine's limits, what HANDSHAKE_ACK offers, the tenant's server tools, and
the agent with its store, backend and quota -- put together here, once per
session.
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import asdict, replace

import speech
from agent.conversation import Conversation
from agent.loop import Agent, AgentConfig, TurnIO
from agent.store import AgentStore
from aitp import liveness, notify, ports, preview, processes, resume, selectors, services, store, visitors
from aitp import protocol as p
from aitp.close_codes import CLOSE_ABNORMAL
from aitp.limits import ConnectionLimits
from aitp.models import ConversationMessage, Session, TurnRecord
from aitp.operator_commands import SUPERSEDED
from aitp.quota import TokenQuota
from aitp.session import Limits
from aitp.store.admission import Refusal
from aitp.store.port import NOT_RESUMABLE, ResumeOutcome
from connection import holding
from llm import get_backend
from runtime import ids
from runtime.config import config, derived
from runtime.db import db_call
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


# A socket offering a preview ticket that is not good (aitp.preview).
PREVIEW_REFUSAL = Refusal("preview_ticket_invalid",
                          "This preview has expired, is not for this page or is no longer yours: "
                          "reload the console's preview.",
                          "preview ticket invalid")


async def good_preview_ticket(text: str, *, origin: str) -> preview.Ticket | None:
    """The ticket a socket offered, when this server made it lately for a
    page of this origin and the member it names is still an active member of
    the key's tenant (a member removed, or a user deactivated, since the
    console page was drawn holds a ticket that vouches for nothing); None
    otherwise."""
    ticket = preview.read(text, origin=origin)
    if ticket is None or not await db_call(selectors.is_member_of_keys_tenant, ticket.user_id, ticket.key_id):
        return None
    return ticket


def handshake_info(session_id: str, init: p.HandshakeInit, *, origin: str, channel_name: str,
                   token: resume.ResumeToken | None, preview_ticket: preview.Ticket | None = None,
                   ) -> store.HandshakeInfo:
    """What the store is told of this open; ``preview_ticket``: a good one
    the socket offered (``good_preview_ticket``)."""
    return store.HandshakeInfo(
        session_id=session_id,
        origin=origin,
        user_agent=init.userAgent or "",
        viewport=init.viewport or "",
        sdk_version=init.sdkVersion or "",
        protocol_version=init.protocolVersion,
        channel_name=channel_name,
        process=processes.current_id(),
        resume_token_hash=token.secret_hash if token is not None else "",
        preview_key_id=preview_ticket.key_id if preview_ticket is not None else None,
    )


# A socket offering the token of a session whose socket is still open (a
# reload or a dropped network the server has not seen close yet, another
# tab) asks that socket to close (``superseded``, again every second: a
# session being held past its socket hears it once held) and asks for the
# session again until it is free, at most this long; then a new session opens.
RESUME_WAIT_SECONDS = 5.0
RESUME_ASK_EVERY = 0.1
SUPERSEDE_EVERY = 1.0

# ``continue_or_open``'s answer when the session became held by this process
# meanwhile (its socket's close was seen after this socket's handshake):
# ``connection.holding`` continues it.
HELD_HERE = ResumeOutcome(still_open=True)


async def continue_session(raw_key: str, token: resume.ResumeToken,
                           info: store.HandshakeInfo) -> ResumeOutcome:
    """The session ``token`` names, continued on this socket (its next token
    ``info.resume_token_hash``), or why not."""
    loop = asyncio.get_running_loop()
    give_up = loop.time() + RESUME_WAIT_SECONDS
    asked_gone, ask_again = False, loop.time()
    while True:
        outcome = await db_call(store.current().session_resume, raw_key=raw_key, token=token,
                                next_hash=info.resume_token_hash, info=info,
                                window=config().protocol.resume_window)
        if not outcome.still_open:
            return outcome
        if holding.holding(token.session_id):
            return HELD_HERE
        if not asked_gone:
            asked_gone = True
            # A session whose process was killed is closed as the sweep would,
            # at once, and then continued.
            if await db_call(_closed_if_its_process_is_gone, token.session_id):
                continue
        if loop.time() >= ask_again:
            ask_again = loop.time() + SUPERSEDE_EVERY
            await notify.asend(notify.session_group(token.session_id), "session.command",
                               command=SUPERSEDED, process=processes.current_id())
        if loop.time() >= give_up:
            return NOT_RESUMABLE
        await asyncio.sleep(RESUME_ASK_EVERY)


async def continue_or_open(raw_key: str, token: resume.ResumeToken | None, info: store.HandshakeInfo
                           ) -> tuple[Session | None, Refusal | None, resume.ResumeToken | None] | ResumeOutcome:
    """(session, refusal, the client's next token when the session its
    token names is continued); otherwise a new session, as ``info`` says;
    ``HELD_HERE`` when this process now holds the session."""
    if token is not None:
        following = resume.new_token(token.session_id)
        outcome = await continue_session(raw_key, token, replace(
            info, session_id=token.session_id, resume_token_hash=following.secret_hash))
        if outcome is HELD_HERE:
            return outcome
        if outcome.refusal is not None:
            return None, outcome.refusal, None
        if outcome.session is not None:
            return outcome.session, None, following
    session, refusal = await db_call(store.current().session_open, raw_key=raw_key, info=info)
    return session, refusal, None


def _closed_if_its_process_is_gone(session_id: str) -> bool:
    process = Session.objects.filter(id=session_id, ended_at__isnull=True).values_list(
        "process", flat=True).first()
    if not process or not liveness.gone_ids({process}):
        return False
    return services.sessions_close_of_processes(process_ids=[process], code=CLOSE_ABNORMAL,
                                                reason="server process lost", mark_stopped=True) > 0


def _stored_conversation(session_id: str) -> tuple[list[dict], int]:
    messages = list(ConversationMessage.objects.filter(session_id=session_id).order_by("seq")
                    .values("seq", "role", "content", "turn"))
    numbers = [m["turn"] for m in messages] + list(
        TurnRecord.objects.filter(session_id=session_id).values_list("number", flat=True))
    return messages, max(numbers, default=0)


async def restore(agent: Agent) -> None:
    """A continued session's agent: its conversation and its count of turns as stored."""
    messages, turns = await db_call(_stored_conversation, agent.session_id)
    agent.conversation = Conversation.restored(messages)
    agent.turn = turns


async def session_agent(session, server_tools: list, io: TurnIO, limits: ConnectionLimits,
                        visitor_token: str | None, *, continued: bool
                        ) -> tuple[Agent, visitors.VisitorRefusal | None]:
    """The session's agent (``build_agent``), its conversation restored when
    the session is continued; a new session offered a visitor token is linked
    to its visitor and its agent told of the visitor's earlier conversations
    (or why the token was refused: the session opens unlinked)."""
    refused, earlier = None, ""
    if visitor_token is not None and not continued:
        refused, earlier = await db_call(_visitor_linked, session, visitor_token)
    agent = build_agent(session, server_tools, io, limits, earlier=earlier)
    if continued:
        await restore(agent)
    return agent, refused


def _visitor_linked(session, token: str) -> tuple[visitors.VisitorRefusal | None, str]:
    found = visitors.visitor_id(token, selectors.visitor_secret(session.tenant_id), now=time.time())
    if isinstance(found, visitors.VisitorRefusal):
        return found, ""
    services.session_link_visitor(session_id=session.id, visitor_id=found)
    return None, visitors.earlier_account(
        selectors.visitor_earlier(session.tenant_id, found, before_session=session.id))


def build_agent(session, server_tools: list, io: TurnIO, limits: ConnectionLimits, *,
                earlier: str = "") -> Agent:
    """The session's agent: its tenant's prompt (and what ``earlier``
    conversations of its visitor were) and server tools, the LLM backend,
    its store, and the input limits and token quota it shares with the
    connection."""
    return Agent(
        session_id=session.id,
        tenant_id=session.tenant_id,
        system_prompt="\n\n".join(part for part in (session.tenant.system_prompt, earlier) if part),
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
