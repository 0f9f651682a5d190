"""The WebSocket close codes the server sends, and what each makes the
deployed client do (protocol.md §10; wire-compat §2): 1003, 1008 and 1011
are final, every other code makes it reconnect after 2 s x attempt."""

from __future__ import annotations

# Final: bad or revoked key, foreign origin, version mismatch, usage limit,
# an operator ended the session, session-level abuse. The reason is shown.
CLOSE_POLICY = 1008
# Final as well: only for a bug of ours we cannot recover from.
CLOSE_INTERNAL_ERROR = 1011
# Retried: the server is stopping; the page reconnects to another process.
CLOSE_GOING_AWAY = 1001
# Retried later: capacity, the database briefly down, a client not reading.
CLOSE_TRY_AGAIN_LATER = 1013
# Never sent (RFC 6455 §7.4): what a session's row records when the process
# holding it is gone, as the page saw the connection drop.
CLOSE_ABNORMAL = 1006
# The page's own close when it means to leave: a session it could resume is
# not held for its next socket (docs/protocol.md §3a).
CLOSE_NORMAL = 1000
# The operators' watch socket (not AITP): a refused or lost staff login.
CLOSE_FORBIDDEN = 4403
# The session went on on a newer socket that offered its resume token (a
# reload whose old socket the server still held, another tab): only clients
# that resume are sent it, and they do not come back (protocol.md §3a).
CLOSE_CONTINUED_ELSEWHERE = 4409

# What the deployed client does not retry.
FINAL_CODES = frozenset({1003, CLOSE_POLICY, CLOSE_INTERNAL_ERROR})
# RFC 6455 §7.4: 1004, 1005, 1006 and 1015 must never be sent; 3000-4999
# are the applications'.
SENDABLE_CODES = frozenset({1000, 1001, 1002, 1003, 1007, 1008, 1009, 1010, 1011, 1012, 1013, 1014})
# A close frame's reason: at most 123 bytes of UTF-8.
MAX_CLOSE_REASON_BYTES = 123


def sendable(code: int) -> bool:
    """Whether a close frame may carry ``code``."""
    return code in SENDABLE_CODES or 3000 <= code <= 4999
