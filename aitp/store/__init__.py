"""Where a session's rows are written: one interface (``port.SessionStore``),
a plain implementation and the fast one the server runs. ``current()`` is
the store in use; ``use()`` puts another in its place (the contract tests
run the same promises against both)."""
from __future__ import annotations

from aitp.store.port import HandshakeInfo, SessionStore

__all__ = ["HandshakeInfo", "SessionStore", "current", "use"]

_current: SessionStore | None = None


def current() -> SessionStore:
    """The store in use: the fast one unless another was put in its place."""
    global _current
    if _current is None:
        from aitp.store.fast import FastStore  # it needs the quota, which needs the statements here

        _current = FastStore()
    return _current


def use(store: SessionStore) -> SessionStore:
    """Put ``store`` in use; returns the one it replaces."""
    global _current
    previous, _current = current(), store
    return previous
