"""A socket relaying a session another process holds (docs/protocol.md §3a).

A reload or a dropped network may bring the page's next socket to another
process than the one holding its session past the old socket (one behind a
load balancer that does not keep a visitor on one process). The session
does not move: its turn goes on where it runs, and this socket relays. The
socket asks the holding process (a ``relay`` command to the session's
group, through the channel layer: Redis) with what a claim needs; that
process claims the row for it, as it would for a socket of its own
(``connection.holding.HeldSocket.relay``), and answers with where the
client goes on. This socket's HANDSHAKE_ACK is numbered there; then the
page's frames go to the holding process's channel for the session and its
frames come back (``AitpConsumer.relay_through``), the missed ones first.

A holding process killed while a socket relays it: the socket sees it gone
and sends the page away (1001); its next socket continues the session from
the database, as after any kill.

No answer within ``RELAY_WAIT_SECONDS`` (the holding process is busy, or
its socket is open and cannot be held): the session is let go as before
(``connection.opening.continue_session``) and continued from the database.
"""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import asdict, replace
from typing import Any

from aitp import liveness, notify, processes, resume, store
from aitp.close_codes import CLOSE_GOING_AWAY
from aitp.models import Session
from aitp.operator_commands import RELAY
from runtime.db import db_call

logger = logging.getLogger(__name__)

# connection.runner.ConnectionRunner, which imports this module: named, not imported.
ConnectionRunner = Any

RELAY_WAIT_SECONDS = 3.0
HOLDER_CHECK_SECONDS = 2.0
# The watches of this process's relaying sockets (a task is kept only while referenced).
_watching: set[asyncio.Task] = set()


def _holder(token: resume.ResumeToken) -> str | None:
    """The live process holding the open row the token is the current one
    of, when it is another."""
    process = Session.objects.filter(id=token.session_id, ended_at__isnull=True,
                                     resume_token_hash=token.secret_hash).values_list("process", flat=True).first()
    if not process or process == processes.current_id() or liveness.gone_ids({process}):
        return None
    return process


async def relayed(new: ConnectionRunner, raw_key: str, token: resume.ResumeToken, last_seq: int | None,
                  info: store.HandshakeInfo) -> bool:
    """Continue the session ``token`` names through the process holding it:
    True when the handshake was answered (relayed, or refused); False when
    no other process holds it, or that process did not take it up."""
    holder = await db_call(_holder, token)
    if holder is None:
        return False
    layer = new.socket.channel_layer
    reply = await layer.new_channel()
    following = resume.new_token(token.session_id)
    claim = replace(info, session_id=token.session_id, resume_token_hash=following.secret_hash)
    group, channel = notify.session_group(token.session_id), new.socket.channel_name
    await notify.asend(group, "session.command", command=RELAY, reply=reply, channel=channel,
                       apiKey=raw_key, sessionId=token.session_id, tokenHash=token.secret_hash,
                       lastSeq=last_seq, info=asdict(claim), answerBy=time.time() + RELAY_WAIT_SECONDS)
    try:
        answer = await asyncio.wait_for(layer.receive(reply), RELAY_WAIT_SECONDS)
    except TimeoutError:
        # Too late for this socket: should the holder relay to it all the
        # same, it is held again at once (this socket ignores what it sends).
        await notify.asend(group, "session.command", command=RELAY, gone=True, channel=channel)
        return False
    if answer.get("type") == "relay.refused":
        new.machine.refuse(answer["code"], answer["message"], answer["reason"])
        return True
    new.machine.capabilities = tuple(answer["capabilities"])
    new.machine.accept_handshake(token.session_id, resume_token=following.text, resumed=True,
                                 numbered_from=answer["position"], last_input=answer["lastInput"])
    await new.flush()
    socket, groups = new.give_up_socket()
    await notify.leave(layer, groups, socket.channel_name)
    socket.relay_through(answer["holder"])
    watch = asyncio.create_task(_watch(socket, holder))
    _watching.add(watch)
    watch.add_done_callback(_watching.discard)
    logger.info("session %s: this socket relays it to the process holding it", token.session_id)
    return True


async def _watch(socket: Any, holder: str) -> None:
    """While the socket relays, the holding process is looked at every
    ``HOLDER_CHECK_SECONDS``: once it is gone (killed), the page is sent
    away (1001) and comes back to continue from the database."""
    while socket.relayed_to is not None:
        await asyncio.sleep(HOLDER_CHECK_SECONDS)
        if socket.relayed_to is not None and await db_call(liveness.gone_ids, {holder}):
            logger.info("the process %s a socket relayed to is gone: the page is sent away", holder)
            socket.relayed_to = None
            await socket.close(code=CLOSE_GOING_AWAY)
