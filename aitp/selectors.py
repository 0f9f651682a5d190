"""Reads of the protocol's records shared by the admin, the console and the
operator pages. Who may see or change which tenant is ``tenants.selectors``."""
from __future__ import annotations

from aitp.models import Session


def session_conversation(session: Session):
    return session.messages.order_by("seq")
