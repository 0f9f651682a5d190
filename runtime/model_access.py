"""What this process knows of its access to the model: the key accepted,
refused, the API unreachable, or not known yet.

Found at start by the server's check of the key (``owllayer_site.serve``:
one cheap request), then kept up to date by the turns: a turn whose model
request was refused for its key (``auth_failed``) or could not reach the API
(``unreachable``) says so, and a turn that got an answer says the model
answers again. Per process and cheap: one module-level value, read by the
admin's banner (``owllayer_site.context_processors``) on every admin page.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from datetime import UTC, datetime

ACCEPTED = "accepted"
REFUSED = "refused"
UNREACHABLE = "unreachable"
UNKNOWN = "unknown"

# A failed turn's error code -> what it says of the model's access.
ERROR_STATES = {"auth_failed": REFUSED, "unreachable": UNREACHABLE}


@dataclass(frozen=True)
class ModelAccess:
    state: str  # ACCEPTED, REFUSED, UNREACHABLE or UNKNOWN
    detail: str  # for people: what was answered ("http 401 authentication_error")
    since: datetime | None
    found_by: str  # "the start-up check" or "a turn"

    @property
    def failing(self) -> bool:
        return self.state in (REFUSED, UNREACHABLE)


_lock = threading.Lock()
_current = ModelAccess(UNKNOWN, "", None, "")


def current() -> ModelAccess:
    return _current


def record(state: str, detail: str = "", *, found_by: str) -> ModelAccess:
    """The access found now; a state that did not change keeps its first moment."""
    global _current
    with _lock:
        if _current.state != state or _current.detail != detail:
            _current = ModelAccess(state, detail, datetime.now(UTC), found_by)
        return _current


def turn_failed(code: str, detail: str = "") -> None:
    """A turn's model request failed with ``code`` (an ``LlmError`` code)."""
    state = ERROR_STATES.get(code)
    if state is not None:
        record(state, detail, found_by="a turn")


def turn_answered() -> None:
    """A turn got the model's answer: the key is accepted. Nothing is
    written when that was known already (the common case: one comparison)."""
    if _current.state != ACCEPTED:
        record(ACCEPTED, found_by="a turn")

