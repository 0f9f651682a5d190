"""The process's bounded pool of speech jobs: engines work here, never on the event loop.

At most OWLLAYER_VOICE_JOBS transcriptions or syntheses run at once in one
process; more wait their turn in the pool's queue. One long transcription
thus never delays another session's frames: the event loop only awaits.
"""
from __future__ import annotations

import asyncio
import contextvars
import functools
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")

_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None
_size = 0


def pool_size() -> int:
    from django.conf import settings

    return settings.OWLLAYER_VOICE_JOBS


def _executor() -> ThreadPoolExecutor:
    global _pool, _size
    size = pool_size()
    with _lock:
        if _pool is None or _size != size:
            old, _pool, _size = _pool, ThreadPoolExecutor(size, thread_name_prefix="voice"), size
            if old is not None:
                old.shutdown(wait=False)
        return _pool


async def run(fn: Callable[..., T], *args) -> T:
    """fn(*args) in the speech pool; awaiting it leaves the event loop free."""
    loop = asyncio.get_running_loop()
    call = functools.partial(contextvars.copy_context().run, fn, *args)
    return await loop.run_in_executor(_executor(), call)


def shutdown() -> None:
    """Stop the pool (tests that change OWLLAYER_VOICE_JOBS, process exit)."""
    global _pool
    with _lock:
        pool, _pool = _pool, None
    if pool is not None:
        pool.shutdown(wait=False, cancel_futures=True)
