"""Preview tickets: the console shows a key's widget, the real one against
this server, on a page of the console's own origin, which the key need not
allow (docs/widget.md, Preview).

A ticket is signed with the site's secret and names the key, the origin of
the console page it was made for and the member it was made for. A socket
that offers one (``?previewTicket=`` on its URL) from that origin, for that key,
within ``TICKET_LIFETIME`` of its making, is admitted whatever the key's
allowed origins; the key's other checks (revoked, disabled, expired, quota,
session caps) stay, and the member must still be an active member of the
key's tenant when the socket opens (``connection.opening.good_preview_ticket``).
A socket offering a ticket that is forged, expired, made for another origin
or no longer its member's is refused (``preview_ticket_invalid``); a good one
made for another key vouches for nothing (that key's allowed origins decide).
"""
from __future__ import annotations

from dataclasses import dataclass

from django.core import signing

SALT = "owllayer.widget-preview"
TICKET_LIFETIME = 15 * 60  # seconds
LONGEST_TICKET = 300


@dataclass(frozen=True)
class Ticket:
    key_id: int
    origin: str
    user_id: int


def issue(*, key_id: int, origin: str, user_id: int) -> str:
    return signing.dumps({"k": key_id, "o": origin, "u": user_id}, salt=SALT)


def read(text: str, *, origin: str) -> Ticket | None:
    """The ticket, when it is one this server made, still young, for a page
    of this origin; None otherwise."""
    if not text or len(text) > LONGEST_TICKET:
        return None
    try:
        data = signing.loads(text, salt=SALT, max_age=TICKET_LIFETIME)
    except signing.BadSignature:  # SignatureExpired included
        return None
    if not isinstance(data, dict) or data.get("o") != origin:
        return None
    key_id, user_id = data.get("k"), data.get("u")
    if not isinstance(key_id, int) or not isinstance(user_id, int):
        return None
    return Ticket(key_id=key_id, origin=origin, user_id=user_id)
