"""Where a session's rows are written: one interface (``port.SessionStore``)
and two implementations keeping the same promises, which the contract tests
hold both to: the fast one the server runs (statements prepared once,
several sessions' writes in one transaction, usage written behind) and a
plain one (the ORM, one transaction per write; OWLLAYER_STORE=plain), the
reference the fast one is measured and checked against."""
from __future__ import annotations

from aitp.store.port import HandshakeInfo, SessionStore
from runtime.config import config

__all__ = ["HandshakeInfo", "SessionStore", "current"]


# One store of each kind per process, made when first named: they hold no
# state of their own, so a change of settings only chooses between them.
_made: dict[str, SessionStore] = {}


def current() -> SessionStore:
    """The store the configuration names."""
    name = config().store.implementation
    made = _made.get(name)
    if made is None:
        made = _made.setdefault(name, _make(name))
    return made


def _make(name: str) -> SessionStore:
    if name == "plain":
        from aitp.store.plain import PlainStore

        return PlainStore()
    from aitp.store.fast import FastStore  # it needs the quota, which needs the statements here

    return FastStore()
