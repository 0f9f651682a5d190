"""What one API key may ask of this process's speech workers.

The speech pool (jobs.py) is shared by every page of the process, whatever
its tenant; a publishable key is all a page needs to send audio. So each key
has two bounds in the pool, counted in this process:
- jobs at once: its transcriptions and syntheses waiting or running (a job
  whose turn was cancelled counts until its worker is done with it);
- seconds per minute: the seconds of speech it had transcribed in the last
  sixty seconds, the utterance counted whole when its job is admitted.
Over either, the job is refused with ``speech_rate_limited`` (``data.limit``
names the bound; ``data.retryAfterMs`` says when the seconds fit again).

Pure: the clock comes in as ``now`` (seconds, monotonic), the bounds as
arguments; the pool calls it under its own lock.
"""
from __future__ import annotations

from collections import Counter, deque
from collections.abc import Hashable
from dataclasses import dataclass

from aitp.voice.base import SpeechError

WINDOW_SECONDS = 60.0
JOBS_LIMIT = "speech_jobs_per_key"
SECONDS_LIMIT = "speech_seconds_per_key"


@dataclass(frozen=True)
class KeyLimits:
    jobs_at_once: int = 0  # 0: no bound
    seconds_per_minute: float = 0.0  # 0: no bound


class SpeechAllowance:
    def __init__(self, limits: KeyLimits) -> None:
        self.limits = limits
        self._jobs: Counter[Hashable] = Counter()
        # (when, seconds) of the utterances each key had transcribed, oldest first.
        self._heard: dict[Hashable, deque[tuple[float, float]]] = {}

    def refusal(self, key: Hashable | None, seconds: float, now: float) -> SpeechError | None:
        """Why a job of `key` with `seconds` of speech may not start now (None: it may)."""
        if key is None:
            return None
        jobs_at_once = self.limits.jobs_at_once
        if jobs_at_once and self._jobs[key] >= jobs_at_once:
            return SpeechError("speech_rate_limited", data={"limit": JOBS_LIMIT},
                               detail=f"{jobs_at_once} speech jobs of this key at once already")
        per_minute = self.limits.seconds_per_minute
        if per_minute and seconds > 0:
            heard = self._recent(key, now)
            used = sum(length for _, length in heard)
            if used + seconds > per_minute:
                return SpeechError(
                    "speech_rate_limited",
                    data={"limit": SECONDS_LIMIT, "retryAfterMs": self._retry_after_ms(heard, seconds, now)},
                    detail=f"{used:.1f} s of speech of this key in the last minute; "
                           f"{seconds:.1f} s more would pass {per_minute:g} s",
                )
        return None

    def take(self, key: Hashable | None, seconds: float, now: float) -> None:
        """A job of `key` was admitted: it counts until release()."""
        if key is None:
            return
        self._jobs[key] += 1
        if self.limits.seconds_per_minute and seconds > 0:
            self._heard.setdefault(key, deque()).append((now, seconds))

    def release(self, key: Hashable | None) -> None:
        """A job of `key` is over (done, failed, or dropped before it ran)."""
        if key is None:
            return
        self._jobs[key] -= 1
        if self._jobs[key] <= 0:
            del self._jobs[key]

    def jobs(self, key: Hashable) -> int:
        return self._jobs[key]

    def _recent(self, key: Hashable, now: float) -> deque[tuple[float, float]]:
        heard = self._heard.get(key)
        if heard is None:
            return deque()
        while heard and heard[0][0] <= now - WINDOW_SECONDS:
            heard.popleft()
        if not heard:
            del self._heard[key]
        return heard

    def _retry_after_ms(self, heard: deque[tuple[float, float]], seconds: float, now: float) -> int:
        """When enough of the last minute's speech has left the window for `seconds` more."""
        per_minute = self.limits.seconds_per_minute
        if seconds > per_minute:
            return round(WINDOW_SECONDS * 1000)  # never fits: come back with less
        used = sum(length for _, length in heard)
        for when, length in heard:
            used -= length
            if used + seconds <= per_minute:
                return max(0, round((when + WINDOW_SECONDS - now) * 1000))
        return 0
