"""Reads of the protocol's records shared by the admin, the console and the
operator pages. Who may see or change which tenant is ``tenants.selectors``."""
from __future__ import annotations

from pathlib import Path

from aitp.models import ApiKey, Session
from aitp.store import keys
from runtime.config import config


def session_conversation(session: Session):
    return session.messages.order_by("seq")


def is_the_demo_pages_key(key: ApiKey, key_file: Path | None = None) -> bool:
    """Whether ``key`` is the one saved in the demo key file
    (``OWLLAYER_DEMO_KEY_FILE``, .demo-key), which the demo store's pages use
    (``manage.py ensure_demo`` writes it; the console warns before revoking it)."""
    try:
        raw_key = (key_file or config().console.demo_key_file).read_text().strip()
    except FileNotFoundError:
        return False
    if not raw_key.startswith(key.prefix):
        return False
    found = keys.api_key_lookup(raw_key)
    return found is not None and found.pk == key.pk
