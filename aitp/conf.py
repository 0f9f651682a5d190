"""Values built from Django settings once per process instead of on every
connection, and built again whenever a setting changes
(``override_settings``, which sends ``setting_changed``)."""
from __future__ import annotations

from collections.abc import Callable
from functools import cache
from typing import TypeVar

from django.core.signals import setting_changed

T = TypeVar("T")

# The cache_clear of each value built.
_clears: list[Callable[[], None]] = []


def from_settings(build: Callable[[], T]) -> Callable[[], T]:
    """``build()`` once; again after any setting changed. What it builds is
    shared by every caller: an immutable value."""
    cached = cache(build)
    _clears.append(cached.cache_clear)
    return cached


def _forget(**_kwargs: object) -> None:
    for clear in _clears:
        clear()


setting_changed.connect(_forget, dispatch_uid="aitp.conf.forget")
