"""Rate limits and the monthly token quota: how much one connection, session,
call, key and tenant may ask of the server.

Counting is the `limits` package's. The counters of one connection (frames,
user inputs, approval requests per call) live in that connection's memory: a
connection is held by one process, and a frame should not cost a network
round trip. Session opens per key are shared by every process through Redis
when REDIS_URL is set (this process's memory otherwise). Redis being away
lets the open through with a log line: a rate limit never refuses or closes a
session because its counter store is down.

Refusals that come in floods are logged once per window with their count
(``runtime.flood_log``), never a line per frame or per open.

Every refusal is an error event with ``data.code`` (protocol.md §10
decides the close code, where there is one):

- frames over the per-second limit are dropped; the first of each second is
  answered ``rate_limited``; a connection that goes on flooding is refused
  with ``too_many_frames`` and 1008, the code for session-level abuse (a
  retrying code would bring the same script straight back);
- user inputs over the per-minute limit: ``rate_limited``, and the turn the
  page started ends at once (``AGENT_RESPONSE {chunk:"", done:true}``);
- a call's approval requests past the limit (APPROVAL_REQUESTs and TOOL_RESULTs
  pending_approval, counted together): ``rate_limited`` with the callId;
- session opens over the per-key limit: ``rate_limited``, then 1013, which
  the client retries later, when the window has moved on;
- a tenant's used-up token quota: the spec's own ``"API key usage limit
  exceeded."`` with ``usage_limit_exceeded``, then 1008 at the handshake
  (protocol.md §10: permanent for the client), or ending the turn on a USER_INPUT.
  The turn's start check also tells the session whether its tenant has a
  quota at all; each model request of a turn that has one is reserved
  against it (``aitp.quota``).
"""
from __future__ import annotations

import asyncio
import hashlib
import logging
import time
import weakref
from collections import Counter, deque
from dataclasses import dataclass
from functools import lru_cache

from limits import RateLimitItem, RateLimitItemPerHour, RateLimitItemPerMinute, RateLimitItemPerSecond
from limits.aio.storage import RedisStorage
from limits.aio.strategies import MovingWindowRateLimiter
from limits.util import WindowStats

from aitp import protocol as p
from aitp.close_codes import CLOSE_TRY_AGAIN_LATER
from aitp.quota import USAGE_LIMIT_CODE, USAGE_LIMIT_MESSAGE, token_quota_used_up
from aitp.session import SessionMachine
from runtime import metrics
from runtime.config import LimitsConfig
from runtime.config import config as current_config
from runtime.flood_log import FloodLog
from runtime.group_write import Gathered
from runtime.recent import RecentAnswers

logger = logging.getLogger(__name__)

RATE_LIMITED = "rate_limited"
TOO_MANY_FRAMES = "too_many_frames"

# At most one rate_limited answer a second, however many frames are dropped:
# answering each would double the flood on the way out.
_NOTICE = RateLimitItemPerSecond(1)
# The characters of a key its log lines show: "pk_live_" and the 8 of its
# lookup prefix (aitp.store.keys.LOOKUP_PREFIX_LENGTH).
KEY_SHOWN = 16


# The limits: the configuration's part (0 = off).
LimitSettings = LimitsConfig


def _item(kind: type[RateLimitItem], amount: int) -> RateLimitItem | None:
    return kind(amount) if amount > 0 else None


@lru_cache(maxsize=8)
def _windows(config: LimitSettings) -> tuple[RateLimitItem | None, ...]:
    """A connection's limits (frames, dropped frames, user inputs, approval
    requests), the same items for every connection of one configuration."""
    return (
        _item(RateLimitItemPerSecond, config.frames_per_second),
        _item(RateLimitItemPerMinute, config.flood_close_drops),
        _item(RateLimitItemPerMinute, config.user_inputs_per_minute),
        # "Per call": a call lives for minutes at most, so an hour's window is its lifetime.
        _item(RateLimitItemPerHour, config.approval_requests_per_call),
    )


def _retry_after_ms(reset_at: float) -> int:
    return max(0, int((reset_at - time.time()) * 1000))


# --- shared across processes ------------------------------------------------


def _storage_uri(redis_url: str) -> str:
    """limits' async Redis URIs: redis:// -> async+redis://, unix:// -> async+redis+unix://."""
    if redis_url.startswith("unix://"):
        return "async+redis+" + redis_url
    return "async+" + redis_url


class LocalMovingWindow:
    """A moving window of one process's hits per key: what limits'
    ``MovingWindowRateLimiter`` decides over its ``MemoryStorage`` (a hit is
    refused while ``limit`` hits of the key are younger than ``period``
    seconds), with each key's hits in a deque, oldest first. That store
    keeps them in a list it grows at the front, a copy of the whole list per
    hit: at thousands of opens a minute of one key, most of an open's cost."""

    # Past this many keys, those with no hit in the window are dropped.
    PRUNE_ABOVE = 10_000

    def __init__(self, limit: int, period: float) -> None:
        self.limit = limit
        self.period = period
        self.hits: dict[str, deque[float]] = {}

    def hit(self, key: str) -> float | None:
        """None: counted, allowed; else the seconds until one more would be."""
        now = time.time()
        hits = self.hits.get(key)
        if hits is None:
            if len(self.hits) >= self.PRUNE_ABOVE:
                self._prune(now)
            hits = self.hits[key] = deque()
        while hits and hits[0] <= now - self.period:
            hits.popleft()
        if len(hits) >= self.limit:
            return hits[0] + self.period - now
        hits.append(now)
        return None

    def _prune(self, now: float) -> None:
        self.hits = {key: hits for key, hits in self.hits.items()
                     if hits and hits[-1] > now - self.period}


class SharedLimits:
    """Counters every process sees: Redis when configured, else this process."""

    def __init__(self, config: LimitSettings) -> None:
        self.config = config
        self.opens = _item(RateLimitItemPerMinute, config.session_opens_per_key_per_minute)
        self.limiter: MovingWindowRateLimiter | None = None
        self.local: LocalMovingWindow | None = None
        if config.redis_url:
            self.limiter = MovingWindowRateLimiter(RedisStorage(
                _storage_uri(config.redis_url), implementation="redispy",
                key_prefix=config.prefix, wrap_exceptions=True,
                socket_timeout=config.redis_timeout, socket_connect_timeout=config.redis_timeout,
            ))
        elif self.opens is not None:
            self.local = LocalMovingWindow(config.session_opens_per_key_per_minute, 60.0)
        # The opens asked for while the store is counting others go together.
        self._counted = Gathered(self._count_opens)
        # Opens refused, per key, logged once per window.
        self.refusals = FloodLog(logger, config.flood_log_interval)

    async def session_open_retry_after(self, raw_key: str) -> float | None:
        """None when this key may open one more session now; else the
        seconds until it may. The key is counted by a digest, never stored."""
        if self.opens is None:
            return None
        digest = hashlib.sha256(raw_key.encode("utf-8", "surrogatepass")).hexdigest()[:32]
        if self.local is not None:
            wait = self.local.hit(digest)
            return None if wait is None else max(1.0, wait)
        return await self._counted.ask(digest=digest)

    async def _count_opens(self, opens: list[dict]) -> list[float | None]:
        """``session_open_retry_after`` of several opens: in the store, each
        key's opens are counted at once (a hit of that many), and only when
        that would pass the limit one at a time, so that exactly the opens
        the window still holds are let through. A store that is down or
        slow lets every one of them open."""
        wanted = Counter(request["digest"] for request in opens)
        try:
            # asyncio.timeout, not wait_for: no task of its own per call.
            async with asyncio.timeout(self.config.redis_timeout):
                answers = await asyncio.gather(*(self._count_key(digest, count)
                                                 for digest, count in wanted.items()))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            # Fail open: a missing counter store must not refuse pages.
            logger.warning("session opens per key not counted (counter store unavailable: %s)",
                           type(exc).__name__)
            return [None] * len(opens)
        by_key = dict(zip(wanted, answers, strict=True))
        return [by_key[request["digest"]].pop() for request in opens]

    async def _count_key(self, digest: str, count: int) -> list[float | None]:
        """For ``count`` opens of one key, None for each one let through and
        the seconds to wait for each one refused."""
        assert self.limiter is not None and self.opens is not None
        if count > 1 and await self.limiter.hit(self.opens, "opens", digest, cost=count):
            return [None] * count
        allowed = 0
        while allowed < count and await self.limiter.hit(self.opens, "opens", digest):
            allowed += 1
        if allowed == count:
            return [None] * count
        stats = await self.limiter.get_window_stats(self.opens, "opens", digest)
        wait = max(1.0, stats.reset_time - time.time())
        # Popped from the end: the first opens asked for are the ones let through.
        return [wait] * (count - allowed) + [None] * allowed


_shared: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def shared_limits(config: LimitSettings) -> SharedLimits:
    """One SharedLimits per event loop (an async Redis client belongs to the loop it started on)."""
    loop = asyncio.get_running_loop()
    shared = _shared.get(loop)
    if shared is None or (shared.config is not config and shared.config != config):
        shared = _shared[loop] = SharedLimits(config)
    return shared


# --- one connection ---------------------------------------------------------


class ConnectionWindows:
    """Fixed-window counters of one connection, in a plain dict: what limits'
    ``FixedWindowRateLimiter`` over a ``MemoryStorage`` counts (a window opens
    at its first hit and lasts the item's period; hits past the limit still
    count), without that store's lock per key and expiry timer per
    connection, which every frame of every session paid for."""

    __slots__ = ("windows",)
    # Expired windows are dropped when there are more than this many (the
    # per-call counters of a long session).
    PRUNE_ABOVE = 32

    def __init__(self) -> None:
        self.windows: dict[tuple, list] = {}  # key -> [hits, reset_at]

    def hit(self, item: RateLimitItem, *identifiers: str) -> bool:
        """Count one hit; True while the window holds at most item.amount."""
        now = time.time()
        key = (item.amount, item.GRANULARITY, item.multiples, identifiers)
        window = self.windows.get(key)
        if window is None or window[1] <= now:
            if len(self.windows) > self.PRUNE_ABOVE:
                self.windows = {k: w for k, w in self.windows.items() if w[1] > now}
            window = self.windows[key] = [0, now + item.get_expiry()]
        window[0] += 1
        return window[0] <= item.amount

    def get_window_stats(self, item: RateLimitItem, *identifiers: str) -> WindowStats:
        now = time.time()
        window = self.windows.get((item.amount, item.GRANULARITY, item.multiples, identifiers))
        if window is None or window[1] <= now:
            return WindowStats(now, item.amount)
        return WindowStats(window[1], max(0, item.amount - window[0]))


class ConnectionLimits:
    """What the consumer asks before acting on a frame. Each ``allow_*``
    queues its own answer on the session machine and returns False when the
    frame must not be acted on."""

    def __init__(self, config: LimitSettings, shared: SharedLimits | None = None) -> None:
        self.config = config
        self.shared = shared
        # This connection's own counters: a small store it alone uses.
        self._local = ConnectionWindows()
        self._frames, self._drops, self._inputs, self._approvals = _windows(config)
        self._token_quota = None
        # Its refusals, logged once per window with their count (the machine
        # is the one its frames go to, for the session id and invalid frames).
        self._floods = FloodLog(logger, config.flood_log_interval)
        self._machine: SessionMachine | None = None
        self._invalid_seen = 0

    async def allow_frame(self, machine: SessionMachine) -> bool:
        """Every inbound frame, before it is parsed."""
        self._machine = machine
        self._count_invalid(machine)
        if machine.close is not None:
            return False  # closing: nothing more is read, answered or logged
        if self._frames is None or self._local.hit(self._frames, "frames"):
            return True
        metrics.rate_limited("frames")
        self._floods.count("frames", subject=_whose(machine), what="frames dropped",
                           detail=f"over {self.config.frames_per_second} a second",
                           level=logging.WARNING)
        if self._drops is not None and not self._local.hit(self._drops, "dropped"):
            logger.warning("session %s: closed for flooding (over %d frames a second)",
                           machine.session_id, self.config.frames_per_second)
            machine.refuse(
                TOO_MANY_FRAMES,
                f"Too many messages (more than {self.config.frames_per_second} a second, "
                "again and again); the connection is closed.",
                "too many messages",
            )
        elif self._local.hit(_NOTICE, "notice"):
            stats = self._local.get_window_stats(self._frames, "frames")
            machine.error(
                RATE_LIMITED,
                f"Too many messages: at most {self.config.frames_per_second} a second; "
                "messages over the limit are dropped.",
                limit="frames_per_second", retryAfterMs=_retry_after_ms(stats.reset_time),
            )
        return False

    async def allow_user_input(self, machine: SessionMachine, *, tenant_id: int) -> bool:
        """A USER_INPUT the machine accepted as a new turn. A refusal queues
        its error; the consumer then ends that turn at once with an empty
        done (protocol.md §5)."""
        refusal = None
        if self._inputs is not None and not self._local.hit(self._inputs, "inputs"):
            metrics.rate_limited("user_inputs")
            self._floods.count("inputs", subject=_whose(machine), what="user inputs refused",
                               detail=f"over {self.config.user_inputs_per_minute} a minute")
            stats = self._local.get_window_stats(self._inputs, "inputs")
            refusal = p.error_event(
                RATE_LIMITED,
                f"Too many messages: at most {self.config.user_inputs_per_minute} a minute. "
                "Please wait a moment.",
                limit="user_inputs_per_minute", retryAfterMs=_retry_after_ms(stats.reset_time),
            )
        else:
            verdict = await _quota_checked(tenant_id, machine.session_id)
            if verdict is not None and self._token_quota is not None:
                # The turn about to start reserves its requests against this quota (0: none).
                self._token_quota.limit = verdict.quota
            if verdict is not None and verdict.used_up:
                refusal = p.error_event(USAGE_LIMIT_CODE, USAGE_LIMIT_MESSAGE)
        if refusal is None:
            return True
        machine.send(refusal)
        return False

    def watch_token_quota(self, quota):
        """The session's side of its tenant's token quota (``aitp.quota.TokenQuota``),
        given to its agent: each turn's start check here tells it the quota."""
        self._token_quota = quota
        return quota

    async def check_approval_request(self, call_id: str) -> p.Message | None:
        """An approval request (APPROVAL_REQUEST, or TOOL_RESULT
        pending_approval: one count) for a call this session holds: None
        while the call is under its limit, else the error to answer with."""
        if self._approvals is None or self._local.hit(self._approvals, "approvals", call_id):
            return None
        metrics.rate_limited("approval_requests")
        self._floods.count("approvals", subject=_whose(self._machine), what="approval requests refused",
                           detail=f"over {self.config.approval_requests_per_call} for one tool call")
        return p.error_event(
            RATE_LIMITED,
            f"Too many approval requests for this call: at most "
            f"{self.config.approval_requests_per_call}.",
            limit="approval_requests_per_call", callId=call_id,
        )

    async def allow_session_open(self, machine: SessionMachine, raw_key: str) -> bool:
        """A HANDSHAKE_INIT about to be looked up. Over the key's limit: an
        error, then 1013 (the client retries later, when it can succeed)."""
        if self.shared is None:
            return True
        retry_after = await self.shared.session_open_retry_after(raw_key)
        if retry_after is None:
            return True
        # Logged by its lookup prefix (what the console shows), never whole.
        prefix = raw_key[:KEY_SHOWN]
        metrics.rate_limited("session_opens")
        self.shared.refusals.count(
            prefix, subject=f"key {prefix!r}", what="session opens refused",
            detail=f"over {self.config.session_opens_per_key_per_minute} a minute",
            level=logging.WARNING)
        machine.send(p.error_event(
            RATE_LIMITED,
            "Too many new sessions for this API key; try again in a minute.",
            limit="session_opens_per_key_per_minute", retryAfterMs=int(retry_after * 1000),
        ))
        machine.refused = RATE_LIMITED
        machine.close_now(CLOSE_TRY_AGAIN_LATER, "too many sessions opened, retry later")
        return False

    def audio_refused(self, machine: SessionMachine) -> None:
        """A microphone chunk refused as too fast (``audio_too_fast``)."""
        metrics.rate_limited("audio")
        self._floods.count("audio", subject=_whose(machine), what="audio chunks dropped",
                           detail="microphone audio faster than allowed")

    def close(self) -> None:
        """The connection is ending: its refusals not logged yet are, now."""
        if self._machine is not None:
            self._count_invalid(self._machine)
        self._floods.close()

    def _count_invalid(self, machine: SessionMachine) -> None:
        # The machine counts the invalid frames it refused (each answered
        # with its own error); they are logged here, with the others.
        new = machine.invalid_frames - self._invalid_seen
        if new > 0:
            self._invalid_seen = machine.invalid_frames
            self._floods.count("invalid", subject=_whose(machine), what="invalid frames refused",
                               times=new)


def _whose(machine: SessionMachine | None) -> str:
    session_id = machine.session_id if machine is not None else None
    return f"session {session_id or '(before its handshake)'}"


def connection_limits() -> ConnectionLimits:
    """The consumer's limits for one new connection (call inside the event loop)."""
    config = _limit_settings()
    return ConnectionLimits(config, shared_limits(config))


def _limit_settings() -> LimitSettings:
    return current_config().limits


# --- the monthly token quota --------------------------------------------------


@dataclass(frozen=True)
class QuotaVerdict:
    quota: int  # 0: none
    used_up: bool


async def _quota_checked(tenant_id: int, session_id: str | None) -> QuotaVerdict | None:
    """The quota check of a new turn (None: not checked). A database that
    cannot answer lets the turn start: its own first write fails it properly
    (error, then done), where a failure here would leave the page's message
    unanswered."""
    from django.db import DatabaseError

    try:
        return await _quota_verdict(tenant_id)
    except DatabaseError as exc:
        logger.warning("session %s: token quota not checked (%s)", session_id, type(exc).__name__)
        return None


def _usage_flush_interval() -> float:
    return current_config().store.usage_flush_interval


# tenant id -> its quota and whether it is used up: the verdict of the last
# read, reused for OWLLAYER_USAGE_FLUSH_INTERVAL seconds. The counts it reads
# are written that late anyway (each model request is held to the quota
# exactly, by its reservation); a tenant with many sessions reads it once per
# interval instead of once per USER_INPUT.
_quota_verdicts: RecentAnswers[QuotaVerdict] = RecentAnswers(_usage_flush_interval)


async def _quota_verdict(tenant_id: int) -> QuotaVerdict:
    from runtime.db import db_call
    from tenants.models import Tenant

    def check() -> QuotaVerdict:
        tenant = Tenant.objects.filter(pk=tenant_id).only("monthly_token_quota").first()
        if tenant is None or not tenant.monthly_token_quota:
            return QuotaVerdict(0, False)
        return QuotaVerdict(tenant.monthly_token_quota, token_quota_used_up(tenant))

    return await _quota_verdicts.get(tenant_id, lambda: db_call(check))
