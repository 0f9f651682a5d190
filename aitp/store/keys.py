"""A plaintext API key to its row: the hash, the lookup prefix, the read of
a key for a session open and the recent reads it reuses."""
from __future__ import annotations

import hashlib
import hmac
from collections.abc import Callable

from aitp.models import ApiKey
from aitp.store import open_statements
from runtime.config import config
from runtime.recent import RecentAnswers

KEY_PREFIX = "pk_live_"
# The lookup prefix: "pk_live_" + 8 characters of the random part. Unique per
# key, shown in the console and admin, useless on its own.
LOOKUP_PREFIX_LENGTH = len(KEY_PREFIX) + 8
# Longer is never a key: not even hashed.
LONGEST_KEY = 200

# prefix -> the key's row with its tenant.
KeyRead = Callable[..., "ApiKey | None"]


def key_hash(raw_key: str) -> str:
    secret = config().store.key_hash_secret.encode()
    return hmac.new(secret, raw_key.encode(), hashlib.sha256).hexdigest()


def api_key_lookup(raw_key: str, *, for_update: bool = False,
                   read: KeyRead = open_statements.key_with_tenant) -> ApiKey | None:
    """The key row (its tenant with it) for a plaintext key, whatever its
    status; None if unknown. ``for_update`` locks the key's and its tenant's
    rows (inside a transaction; FOR NO KEY UPDATE on PostgreSQL).
    ``read``: how the row of a lookup prefix is read (the statement built
    once, or the ORM's)."""
    if not raw_key or len(raw_key) < LOOKUP_PREFIX_LENGTH or len(raw_key) > LONGEST_KEY:
        return None
    key = read(raw_key[:LOOKUP_PREFIX_LENGTH], for_update=for_update)
    if key is None:
        # Hash anyway so an unknown prefix costs the same as a wrong key.
        key_hash(raw_key)
        return None
    if not hmac.compare_digest(key.key_hash, key_hash(raw_key)):
        return None
    return key


def matches(key: ApiKey | None, raw_key: str) -> bool:
    """Whether this row is the one of this plaintext key."""
    return key is not None and len(raw_key) <= LONGEST_KEY and \
        hmac.compare_digest(key.key_hash, key_hash(raw_key))


# How long a key read for a session open serves the next opens of that key
# (this process): the first check (known, usable, from this origin) and the
# tenant the session belongs to. The admission reads the key's row again
# under its lock, and that row decides: a key revoked or changed since still
# refuses at once. A tenant's system prompt or quota changed reaches sessions
# opened this much later. Only keys that exist are remembered: a key just
# created works at once, and a wrong key is looked up every time.
KEY_READ_FRESH_FOR = 1.0
_recent_keys: RecentAnswers[ApiKey | None] = RecentAnswers(lambda: KEY_READ_FRESH_FOR)


def key_for_open(raw_key: str) -> ApiKey | None:
    """``api_key_lookup`` for a session open, the row read at most
    KEY_READ_FRESH_FOR seconds ago standing in for a new read."""
    prefix = raw_key[:LOOKUP_PREFIX_LENGTH] if raw_key else ""
    known = _recent_keys.known(prefix, None)
    if matches(known, raw_key):
        return known
    key = api_key_lookup(raw_key)
    if key is not None:
        _recent_keys.learned(prefix, key)
    return key


def remembered_key_id(raw_key: str) -> int | None:
    """The id of this plaintext key when this process has read it for an
    open (however long ago: a key's id never changes), else None. Reads
    no database: for the event loop."""
    known = _recent_keys.remembered(raw_key[:LOOKUP_PREFIX_LENGTH] if raw_key else "", None)
    return known.pk if matches(known, raw_key) else None


def key_changed(key: ApiKey) -> None:
    """This process's next open of the key reads it again."""
    _recent_keys.forget(key.prefix)
