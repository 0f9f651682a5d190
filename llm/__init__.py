"""LLM backends behind one small interface (aitp/llm.py, the protocol app's: its
quotas count a request's tokens), above that app and below the agent.

get_backend() makes the backend the configuration names (``config().llm.backend``,
a dotted path; OWLLAYER_LLM=anthropic, demo or offline stand for the three here). Django
and the SDK are imported only when a backend is asked for, so importing the
shapes from here stays cheap and works without settings.
"""
from __future__ import annotations

import sys
import threading

from aitp.llm import (
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
_made_for: object = None  # the llm part _backend was made with


def get_backend() -> LlmBackend:
    """The process-wide backend for the configuration's llm part (made again
    when that part changes): its class, imported by dotted path, is given the part."""
    global _backend, _made_for
    from django.utils.module_loading import import_string

    from runtime.config import config

    llm = config().llm
    with _lock:
        if _backend is None or _made_for != llm:
            _backend = import_string(llm.backend)(llm)
            _made_for = llm
        return _backend


def reset_backend() -> None:
    """Forget the backend and the shared SDK client (tests that change settings call this)."""
    global _backend, _made_for
    with _lock:
        _backend = _made_for = None
    # Only when the SDK was ever loaded: resetting must not import it.
    module = sys.modules.get(f"{__name__}.anthropic_backend")
    if module is not None:
        module.reset_client()
