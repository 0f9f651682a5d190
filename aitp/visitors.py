"""Visitor tokens: a tenant's backend vouching for who is on the page
(docs/protocol.md §3c), so that a visitor's conversations are linked across
visits and devices. Without one, nothing links a page to an earlier visit:
no cookie of ours, no fingerprint.

A visitor token is a JWT signed with HS256 and the tenant's visitor secret
(``Tenant.visitor_secret``, shown in the console). Its ``sub`` is the
tenant's own id for the visitor (1-128 characters); ``exp`` is required and
at most ``MAX_LIFETIME`` ahead; ``iat`` and ``nbf``, when present, are
checked too. Clocks may differ by ``CLOCK_SKEW`` either way. Any other
algorithm, ``none`` included, is refused.

Also here, pure: the short account of a visitor's earlier conversations
the agent is given at the start of a new one, bounded in characters.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

import jwt

from aitp import transcript

ALGORITHM = "HS256"
# How far the clocks of the tenant's backend and this server may differ.
CLOCK_SKEW = 30
# The longest a token may be valid from now: visitor tokens are short-lived.
MAX_LIFETIME = 24 * 3600
MAX_VISITOR_ID = 128
MAX_TOKEN_CHARS = 4096

INVALID = "invalid_visitor_token"


@dataclass(frozen=True)
class VisitorRefusal:
    code: str
    message: str


def visitor_id(token: str, secret: str, *, now: float) -> str | VisitorRefusal:
    """The visitor the token vouches for, or why it does not."""
    if not secret:
        return VisitorRefusal(INVALID, "This tenant has no visitor secret.")
    if len(token) > MAX_TOKEN_CHARS:
        return VisitorRefusal(INVALID, "The visitor token is too long.")
    try:
        # The signature and the claims' presence here; the times below, against ``now``.
        claims = jwt.decode(token, secret, algorithms=[ALGORITHM], options={
            "require": ["exp", "sub"], "verify_exp": False, "verify_nbf": False, "verify_iat": False,
            "verify_sub": False})
    except jwt.InvalidSignatureError:
        return VisitorRefusal(INVALID, "The visitor token's signature does not match this tenant's secret.")
    except jwt.InvalidTokenError:
        return VisitorRefusal(INVALID, "The visitor token is not a JWT signed with HS256 that names its "
                                       "visitor (sub) and its expiry (exp).")
    subject = claims["sub"]
    if not isinstance(subject, str) or not 0 < len(subject) <= MAX_VISITOR_ID or not subject.isprintable():
        return VisitorRefusal(INVALID, f"The visitor token's sub must be 1 to {MAX_VISITOR_ID} printable "
                                       "characters.")
    return _timely(claims, now) or subject


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _timely(claims: dict, now: float) -> VisitorRefusal | None:
    """Why the token's times do not hold now, clocks ``CLOCK_SKEW`` apart either way."""
    expires, starts = claims["exp"], [claims[name] for name in ("nbf", "iat") if name in claims]
    if not _number(expires) or not all(_number(start) for start in starts):
        return VisitorRefusal(INVALID, "The visitor token's exp, nbf and iat must be numbers (seconds).")
    if expires < now - CLOCK_SKEW:
        return VisitorRefusal(INVALID, "The visitor token has expired.")
    if any(start > now + CLOCK_SKEW for start in starts):
        return VisitorRefusal(INVALID, "The visitor token is not valid yet.")
    if expires > now + MAX_LIFETIME + CLOCK_SKEW:
        return VisitorRefusal(INVALID, "The visitor token may be valid for at most 24 hours.")
    return None


# The account of earlier conversations: at most this many conversations,
# questions of each, characters of a question, and characters in all.
EARLIER_CONVERSATIONS = 3
QUESTIONS_EACH = 3
QUESTION_CHARS = 160
EARLIER_CHARS = 2000

EARLIER_HEADING = ("Earlier conversations with this visitor (newest first; for context only: "
                   "what they asked then may no longer hold):")


@dataclass(frozen=True)
class Earlier:
    """One earlier conversation: when it started and its stored messages."""
    started_at: datetime
    messages: list  # ConversationMessage rows (or anything with role, turn and content)


def earlier_account(conversations: Iterable[Earlier]) -> str:
    """A few lines for the system prompt: per conversation (newest first),
    its day, the visitor's first questions and the tools the agent called.
    "" when there is nothing to tell."""
    lines: list[str] = []
    for conversation in list(conversations)[:EARLIER_CONVERSATIONS]:
        entries, _ = transcript.visible_history(conversation.messages)
        questions = [_shortened(e["text"]) for e in entries if e["role"] == "user"][:QUESTIONS_EACH]
        tools = sorted({e["name"] for e in entries if e["role"] == "tool"})
        if not questions:
            continue
        line = f"- {conversation.started_at:%d %b %Y}: asked " + "; ".join(f'"{q}"' for q in questions)
        lines.append(line + (f" (tools used: {', '.join(tools)})" if tools else ""))
    account = "\n".join([EARLIER_HEADING, *lines]) if lines else ""
    return account[:EARLIER_CHARS]


def _shortened(text: str) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= QUESTION_CHARS else flat[:QUESTION_CHARS - 1] + "…"
