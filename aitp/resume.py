"""Resume tokens: what lets a new socket continue a session whose socket
dropped (docs/protocol.md §3a).

A token is ``<session id>.<secret>``: the session it names and 32 random
bytes. The session row keeps only the secret's SHA-256, replaced at every
socket, so a token serves one socket: a second socket offering it, at once
or later, gets a session of its own. Whether the row may be continued (its
key, origin, window and how it closed) is the store's rule
(``aitp.store.resuming``).
"""
from __future__ import annotations

import hashlib
import re
import secrets
from dataclasses import dataclass

_TOKEN = re.compile(r"(ses_[0-9a-f]{1,36})\.([A-Za-z0-9_-]{43})")


@dataclass(frozen=True)
class ResumeToken:
    text: str
    session_id: str
    secret_hash: str


def secret_hash(secret: str) -> str:
    return hashlib.sha256(secret.encode("ascii")).hexdigest()


def new_token(session_id: str) -> ResumeToken:
    secret = secrets.token_urlsafe(32)
    return ResumeToken(f"{session_id}.{secret}", session_id, secret_hash(secret))


def parse(text: str | None) -> ResumeToken | None:
    """The token a client offered, or None when it is not one."""
    match = _TOKEN.fullmatch(text or "")
    if match is None:
        return None
    return ResumeToken(text or "", match.group(1), secret_hash(match.group(2)))
