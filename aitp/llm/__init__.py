"""LLM backends behind one small interface (see base.py).

get_backend() picks the backend named by settings.OWLLAYER_LLM ("anthropic" or
"offline"). Django and the SDK are imported only when a backend is asked for,
so importing the shapes from here stays cheap and works without settings.
"""
from __future__ import annotations

import sys
import threading

from .base import (
    LlmBackend,
    LlmError,
    LlmRequest,
    MessageComplete,
    StreamEvent,
    TextDelta,
    Usage,
)

__all__ = [
    "LlmBackend",
    "LlmError",
    "LlmRequest",
    "MessageComplete",
    "StreamEvent",
    "TextDelta",
    "Usage",
    "get_backend",
    "reset_backend",
]

_lock = threading.Lock()
_backend: LlmBackend | None = None


def get_backend() -> LlmBackend:
    """The process-wide backend for settings.OWLLAYER_LLM (rebuilt if that setting changes)."""
    global _backend
    from django.conf import settings

    choice = settings.OWLLAYER_LLM
    with _lock:
        if _backend is None or _backend.name != choice:
            if choice == "anthropic":
                from .anthropic_backend import AnthropicBackend

                _backend = AnthropicBackend()
            elif choice == "offline":
                from .offline import OfflineBackend

                _backend = OfflineBackend()
            else:
                raise ValueError(f"unknown llm backend {choice!r}")
        return _backend


def reset_backend() -> None:
    """Forget the backend and the shared SDK client (tests that change settings call this)."""
    global _backend
    with _lock:
        _backend = None
    # Only when the SDK was ever loaded: resetting must not import it.
    module = sys.modules.get(f"{__name__}.anthropic_backend")
    if module is not None:
        module.reset_client()
