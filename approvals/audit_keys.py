"""The audit chain's keys: HMAC keys kept outside the database.

``OWLLAYER_AUDIT_KEY`` (by default ``DJANGO_SECRET_KEY``) hashes new events
(``approvals.audit``) and signs checkpoints (``approvals.anchors``). The
key actually used is derived from the configured text, so it is never the
very bytes of a secret used elsewhere; its ``id`` names it in every event
and checkpoint without revealing it. After a change of key the older ones
stay listed in ``OWLLAYER_AUDIT_OLD_KEYS``, so what they hashed still
verifies.
"""
from __future__ import annotations

import functools
import hashlib
import hmac
from dataclasses import dataclass, field

from runtime.config import config


@dataclass(frozen=True)
class AuditKey:
    id: str
    secret: bytes = field(default=b"", repr=False)

    def sign(self, text: str) -> str:
        """The HMAC-SHA256 of ``text`` under this key, in hex."""
        return hmac.new(self.secret, text.encode("utf-8"), hashlib.sha256).hexdigest()


@functools.lru_cache(maxsize=16)
def derive_key(configured: str) -> AuditKey:
    secret = hmac.new(configured.encode("utf-8"), b"owllayer audit chain", hashlib.sha256).digest()
    key_id = hmac.new(secret, b"owllayer audit key id", hashlib.sha256).hexdigest()[:16]
    return AuditKey(key_id, secret)


def current_key() -> AuditKey:
    """The key new events are hashed and checkpoints signed with."""
    return derive_key(config().audit.key)


def key_ring() -> dict[str, AuditKey]:
    """Every key verification knows, by id: the old ones and the current one."""
    ring = {}
    for configured in (*config().audit.old_keys, config().audit.key):
        key = derive_key(configured)
        ring[key.id] = key
    return ring
