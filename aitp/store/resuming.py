"""Continuing a session on a new socket (docs/protocol.md §3a): the rule,
once, for both stores. A resume is rare beside an open, so both run it
through the ORM.

A session may be continued by a socket that offers its current token, with
the same key, from the same origin, within the resume window of its close,
when that close was not final (a close the deployed client does not retry:
a refusal, an operator's end, a revoked key, the quota). The claim is one
conditional update that also replaces the token: of two sockets offering
one token, at once or one after the other, one continues the session. The
key's session cap and the tenant's ceiling count the session again, as an
open does (the day's count of sessions does not: it is the same session).

A session whose socket dropped while this process goes on holding it (its
turn still running: ``connection.holding``) is still open: the claim of such
a session asks for an open row of this process instead of a closed one.
"""
from __future__ import annotations

from datetime import timedelta

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from aitp.close_codes import FINAL_CODES
from aitp.models import Session
from aitp.resume import ResumeToken
from aitp.store import admission, keys
from aitp.store.port import HandshakeInfo, ResumeOutcome


def session_resume(*, raw_key: str, token: ResumeToken, next_hash: str, info: HandshakeInfo,
                   window: float, held: dict | None = None) -> ResumeOutcome:
    now = timezone.now()
    key = keys.api_key_lookup(raw_key)
    refusal = admission.api_key_refusal(key, origin=info.origin, preview_key_id=info.preview_key_id, now=now)
    if refusal is not None:
        return ResumeOutcome(refusal=refusal)
    named = Session.objects.filter(id=token.session_id, api_key_id=key.pk, origin=info.origin[:500],
                                   resume_token_hash=token.secret_hash)
    if held is not None:
        claimable = named.filter(ended_at__isnull=True, process=info.process)
    else:
        claimable = named.filter(ended_at__gte=now - timedelta(seconds=window)).exclude(
            close_code__in=FINAL_CODES)
    with transaction.atomic():
        row = claimable.first()
        # The token in the update's condition: of two claims, one changes the row.
        claimed = row is not None and claimable.update(**_reopened(row, info, now, next_hash, held))
        if not claimed:
            return ResumeOutcome(still_open=named.filter(ended_at__isnull=True).exists())
        locked = keys.api_key_lookup(raw_key, for_update=True)
        refusal = admission.refusal_counting_rows(locked, origin=info.origin, now=now,
                                                  preview_key_id=info.preview_key_id)
        if refusal is not None:
            transaction.set_rollback(True)
            return ResumeOutcome(refusal=refusal)
        session = Session.objects.get(id=token.session_id)
    session.tenant, session.api_key = locked.tenant, locked
    return ResumeOutcome(session=session)


def readable_session(*, key, token: ResumeToken, origin: str, window: float) -> Session | None:
    """The session whose conversation a page may read again with this token
    (docs/protocol.md §3b), ``key`` being one the page may use from
    ``origin``: the session the token would continue, or the one it is the
    current token of while a socket holds it. Reading spends nothing: the
    token still serves its next socket."""
    if window <= 0:
        return None
    named = Session.objects.filter(id=token.session_id, api_key_id=key.pk, origin=origin[:500],
                                   resume_token_hash=token.secret_hash)
    open_or_continuable = named.filter(ended_at__isnull=True) | named.filter(
        ended_at__gte=timezone.now() - timedelta(seconds=window)).exclude(close_code__in=FINAL_CODES)
    return open_or_continuable.first()


def _reopened(row: Session, info: HandshakeInfo, now, next_hash: str, held: dict | None) -> dict:
    """The fields of a row a new socket continues: its last socket joins the
    earlier ones (a held session's turn goes on: its state stays)."""
    opened = (row.socket_opened_at or row.started_at).isoformat()
    if held is not None:
        last = {"opened_at": opened, **held}
    else:
        last = {"opened_at": opened, "closed_at": row.ended_at.isoformat(), "code": row.close_code,
                "reason": row.close_reason}
    return {
        **({} if held is not None else {"state": Session.State.IDLE}),
        "earlier_sockets": [*row.earlier_sockets, last], "socket_opened_at": now,
        "ended_at": None, "close_code": None, "close_reason": "",
        "channel_name": info.channel_name, "process": info.process,
        "user_agent": info.user_agent[:500], "viewport": info.viewport[:40],
        "sdk_version": info.sdk_version[:40], "protocol_version": info.protocol_version[:40],
        "last_seen_at": now, "last_activity_at": now, "resume_token_hash": next_hash,
        "resumes": F("resumes") + 1,
    }
