"""The channel layers: the Redis one, made to outlive Redis trouble, and the
in-memory one of the embedded default, made to scale with sessions.

In memory: Channels' ``InMemoryChannelLayer`` sweeps every channel and every
group for expired messages and memberships on each receive and each group
send, so with thousands of sessions every message costs a walk over all of
them. Here the sweep runs at most once per ``sweep_interval`` seconds (one
by default): expiries are counted in whole seconds anyway.

Redis:

channels-redis assumes Redis is always there: one failed command inside a
consumer's channel receive ends Channels' dispatch loop, and daphne closes
the page with 1011, which the deployed client never retries. Here Redis is
treated as what it is for us, a carrier of notifications (the database holds
the record):

- the blocking receive retries with backoff while Redis is away, so open
  sockets stay open;
- ``group_add``, ``group_discard``, ``group_send``, ``send`` and
  ``group_has_members`` (whether anyone listens, for aitp.live) log and carry
  on: a notification lost while Redis is away is a hint that was not given,
  and every receiver re-reads the database anyway;
- the joins and leaves of a process's connections that meet in time share
  one round trip (``runtime.group_write.Gathered``): at fifty opens a second
  each connection's own pipeline was a tenth of the process's time;
- each process remembers which of its channels joined which groups, and adds
  them again when Redis answers after an outage or comes back empty (Redis
  here keeps nothing on disk: a restart forgets every group);
- one WARNING line when Redis becomes unreachable, one INFO line when it is
  back, never a line per retry;
- a receive cancelled while it waits for channels-redis' per-channel clean
  lock gives its place back (see ``ReleasingChannelLock``).

Timeouts: the receive is a blocking read of ``blocking_read`` seconds; the
socket timeout of the host entry must be longer (settings check this), or
every idle receive ends in a read timeout.
"""
from __future__ import annotations

import asyncio
import logging
import random
import time

from channels.layers import InMemoryChannelLayer as ChannelsInMemoryChannelLayer
from channels_redis.core import ChannelLock, RedisChannelLayer
from channels_redis.utils import create_pool
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from runtime import ids
from runtime.group_write import Gathered

logger = logging.getLogger(__name__)

# What "Redis is away" looks like from redis-py (a refused or dropped
# connection, a read that never came back). Anything else is a bug and raises.
REDIS_DOWN_ERRORS = (RedisConnectionError, RedisTimeoutError, OSError)

# After a Redis restart every pooled connection is dead, and redis-py finds
# out only by using it ("Connection closed by server"): a command retries on a
# fresh connection this many times, quickly, before Redis counts as away.
# Timeouts are not retried (a read that timed out may have run).
STALE_CONNECTION_RETRIES = 2

# The first retry waits this long; each further one doubles, up to retry_max.
FIRST_RETRY_DELAY = 0.1


def _raise_if_cancelled() -> None:
    """Never go round again for a consumer that is being stopped: a
    cancellation that lands between channels-redis' receive lock and its
    read can be lost on the way (the task stays "cancelling" and would read
    on for ever, holding up the event loop's shutdown)."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError()


class InMemoryChannelLayer(ChannelsInMemoryChannelLayer):
    def __init__(self, *args, sweep_interval: float = 1.0, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.sweep_interval = sweep_interval
        self.swept_at: float | None = None

    def _clean_expired(self) -> None:
        now = time.monotonic()
        if self.swept_at is not None and now - self.swept_at < self.sweep_interval:
            return
        self.swept_at = now
        super()._clean_expired()


class ReleasingChannelLock(ChannelLock):
    """channels-redis' per-channel lock, whose waiters leave no trace when
    they are cancelled.

    channels-redis counts a waiter before it waits and uncounts it only on
    release, so a receive cancelled while waiting (a page closing while the
    previous message's backup is being cleaned) leaves the count one too
    high: the lock is then never dropped, and stays bound to the event loop
    it first waited on. A layer used from a later loop (a management
    command, a test) then fails every receive that has to wait on it with
    "bound to a different event loop".
    """

    async def acquire(self, channel):
        try:
            return await super().acquire(channel)
        except BaseException:
            self.wait_counts[channel] -= 1
            if self.wait_counts[channel] < 1:
                del self.locks[channel]
                del self.wait_counts[channel]
            raise


class RedisOutage:
    """Whether Redis answers, as this process last saw it: one WARNING line
    when it stops, one INFO line when it is back, and the waits between
    attempts while it is away."""

    def __init__(self, retry_max: float) -> None:
        self.retry_max = retry_max
        self.reachable = True
        self.unreachable_since: float | None = None
        # Set by every failure: the groups of this process may be missing.
        self.rejoin_needed = False
        self.failures = 0

    def failed(self, error: BaseException) -> None:
        self.failures += 1
        self.rejoin_needed = True
        if not self.reachable:
            return
        self.reachable = False
        self.unreachable_since = time.monotonic()
        logger.warning(
            "channel layer: Redis is unreachable (%s: %s); pages stay connected, "
            "notifications between processes are lost until it is back",
            type(error).__name__, error,
        )

    def answered(self, groups: int) -> None:
        if self.reachable:
            return
        self.reachable = True
        away = time.monotonic() - (self.unreachable_since or time.monotonic())
        logger.info(
            "channel layer: Redis is back after %.1f s; the %d groups of this process are rejoined",
            away, groups,
        )

    def next_delay(self, delay: float) -> float:
        """The wait before the next attempt, with jitter so that processes do
        not all knock at once when Redis comes back."""
        return min(self.retry_max, delay * 2) if delay else FIRST_RETRY_DELAY

    async def pause(self, delay: float) -> None:
        await asyncio.sleep(delay * random.uniform(0.8, 1.2))


class Memberships:
    """Which of this process's channels are in which groups (what a Redis
    restart forgets), and the leaves Redis missed while it was away."""

    def __init__(self) -> None:
        # group -> channels of this process in it.
        self.groups: dict[str, set[str]] = {}
        # Discards that could not reach Redis; applied when it is back.
        self.pending_discards: dict[str, set[str]] = {}

    def __len__(self) -> int:
        return len(self.groups)

    def joined(self, group, channel) -> None:
        self.groups.setdefault(group, set()).add(channel)
        discarded = self.pending_discards.get(group)
        if discarded is not None:
            discarded.discard(channel)

    def left(self, group, channel) -> None:
        channels = self.groups.get(group)
        if channels is not None:
            channels.discard(channel)
            if not channels:
                del self.groups[group]

    def left_unseen(self, groups, channel) -> None:
        """Redis did not hear these leaves: they wait for the next rejoin."""
        for group in groups:
            self.pending_discards.setdefault(group, set()).add(channel)

    async def restore(self, write) -> int:
        """Add every channel of this process to its groups again, and apply the
        discards Redis missed, through ``write(adds, removes)``; the number of
        groups of this process.

        Channels keep joining and leaving while this runs (their calls skip
        Redis until it counts as back), so it repeats with the difference
        until nothing changed during the last write; the caller then declares
        Redis back without yielding to the loop in between."""
        written: dict[str, set[str]] = {}
        taken: list[dict[str, set[str]]] = []
        try:
            while True:
                current = {group: set(channels) for group, channels in self.groups.items() if channels}
                removes: dict[str, set[str]] = {}
                taken.append(self.pending_discards)
                self.pending_discards = {}
                for group, channels in taken[-1].items():
                    removes.setdefault(group, set()).update(channels)
                for group, channels in written.items():
                    removes.setdefault(group, set()).update(channels - current.get(group, set()))
                removes = {group: channels - current.get(group, set()) for group, channels in removes.items()}
                adds = {group: channels - written.get(group, set()) for group, channels in current.items()}
                adds = {group: channels for group, channels in adds.items() if channels}
                removes = {group: channels for group, channels in removes.items() if channels}
                if not adds and not removes:
                    logger.debug("channel layer: %d groups rejoined", len(current))
                    return len(current)
                await write(adds, removes)
                written = current
        except BaseException:
            # Not applied: kept for the next attempt.
            for discards in taken:
                for group, channels in discards.items():
                    self.pending_discards.setdefault(group, set()).update(channels)
            raise


class ResilientRedisChannelLayer(RedisChannelLayer):
    def __init__(
        self,
        *args,
        blocking_read: float = 5,
        retry_max: float = 2.0,
        membership_check_interval: float | None = None,
        **kwargs,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.receive_clean_locks = ReleasingChannelLock()
        # channels-redis reads this class attribute for BZPOPMIN's timeout.
        self.brpop_timeout = blocking_read
        self.outage = RedisOutage(retry_max)
        # How often the receiving loop checks that Redis still holds this
        # process's groups (a restart between two commands leaves no error).
        self.membership_check_interval = (
            membership_check_interval if membership_check_interval is not None else blocking_read
        )
        self.memberships = Memberships()
        self.memberships_checked_at = 0.0
        # Whether this process ever left its marker in Redis: a marker gone
        # missing after that means Redis lost our groups.
        self.marker_set = False
        # Joins and leaves of this process's connections that meet in time go
        # to Redis together (one pipeline per shard).
        self.memberships_gathered = Gathered(self._write_groups_of)

    def create_pool(self, index):
        host = dict(self.hosts[index])
        host.setdefault("retry", Retry(
            ExponentialBackoff(cap=0.5, base=0.05), STALE_CONNECTION_RETRIES,
            supported_errors=(RedisConnectionError,),
        ))
        return create_pool(host)

    async def new_channel(self, prefix: str = "specific") -> str:
        # channels-redis' own, with its random part drawn in blocks (runtime.ids).
        return f"{prefix}.{self.client_prefix}!{ids.uuid4().hex}"

    def __str__(self) -> str:
        # The host entries may carry a password in the address.
        return f"{type(self).__name__}(prefix={self.prefix!r}, hosts={len(self.hosts)})"

    # --- Redis up and down ------------------------------------------------------

    @property
    def reachable(self) -> bool:
        return self.outage.reachable

    def _unreachable(self, error: BaseException) -> None:
        self.outage.failed(error)

    def _answered(self) -> None:
        self.outage.answered(len(self.memberships))

    def _answered_by_notification(self) -> None:
        # While a consumer of this process listens, its receive loop says when
        # Redis is back, after it has rejoined the groups.
        if self.receive_count == 0:
            self._answered()

    # --- receive: never give up ---------------------------------------------------

    async def receive(self, channel):
        delay = 0.0
        while True:
            try:
                return await super().receive(channel)
            except REDIS_DOWN_ERRORS as error:
                _raise_if_cancelled()
                self._unreachable(error)
                delay = self.outage.next_delay(delay)
                await self.outage.pause(delay)

    async def _brpop_with_clean(self, index, channel, timeout):
        # One coroutine of the process at a time gets here (channels-redis'
        # receive lock), and it always does while any consumer listens: the
        # place to notice Redis coming and going, and to restore the groups.
        delay = 0.0
        while True:
            _raise_if_cancelled()
            try:
                await self._keep_memberships()
                if self.outage.rejoin_needed:
                    # Something else failed meanwhile: rejoin again first.
                    continue
                # Back for this process once its groups are back.
                self._answered()
                return await super()._brpop_with_clean(index, channel, timeout)
            except REDIS_DOWN_ERRORS as error:
                _raise_if_cancelled()
                self._unreachable(error)
                delay = self.outage.next_delay(delay)
                await self.outage.pause(delay)

    async def _clean_receive_backup(self, index, channel):
        try:
            await super()._clean_receive_backup(index, channel)
        except REDIS_DOWN_ERRORS as error:
            # The message stays in the backup queue and is put back in front
            # of the channel by the next receive: delivered again, not lost.
            self._unreachable(error)

    # --- memberships: remembered here, restored in Redis -------------------------

    def _marker_key(self) -> str:
        return f"{self.prefix}:layer-alive:{self.client_prefix}"

    async def _keep_memberships(self) -> None:
        """Rejoin every group of this process when Redis was away, or when it
        no longer knows this process (restarted empty, flushed)."""
        now = time.monotonic()
        if not self.outage.rejoin_needed and now - self.memberships_checked_at < self.membership_check_interval:
            return
        failures = self.outage.failures
        marker = self._marker_key()
        marker_ttl = max(60, int(self.membership_check_interval * 10))
        forgotten = False
        for index in range(self.ring_size):
            # SET ... GET: refresh the marker and learn whether it was there.
            if await self.connection(index).set(marker, b"1", ex=marker_ttl, get=True) is None:
                forgotten = True
        if self.outage.rejoin_needed or forgotten:
            count = await self.memberships.restore(self._write_groups)
            if forgotten and self.marker_set and not self.outage.rejoin_needed and count:
                logger.info("channel layer: Redis had forgotten this process's groups; "
                            "%d groups rejoined", count)
        self.memberships_checked_at = now
        self.marker_set = True
        # A failure elsewhere while this ran may have missed the groups again.
        self.outage.rejoin_needed = self.outage.failures != failures

    async def _write_groups(self, adds: dict[str, set[str]], removes: dict[str, set[str]],
                            *, ask: str | None = None) -> int | None:
        """Apply the adds and removes, one pipeline per shard; with ``ask``,
        the number of unexpired members of that group, counted after every
        add (its shard's pipeline runs last)."""
        [counted] = await self._write_groups_of([{"adds": adds, "removes": removes, "ask": ask}])
        return counted

    async def _write_groups_gathered(self, adds: dict[str, set[str]],
                                     removes: dict[str, set[str]], *,
                                     ask: str | None = None) -> int | None:
        """``_write_groups`` in one round trip with those of every other
        connection of this process that asked while one was on its way."""
        return await self.memberships_gathered.ask(adds=adds, removes=removes, ask=ask)

    async def _write_groups_of(self, writes: list[dict]) -> list[int | None]:
        """Several ``_write_groups`` in one pipeline per shard (each group's
        adds before its removes); for each, its count of ``ask``."""
        now = time.time()
        pipes = {}

        def pipe_for(group):
            index = self.consistent_hash(group)
            if index not in pipes:
                pipes[index] = self.connection(index).pipeline(transaction=False)
            return pipes[index]

        adds: dict[str, set[str]] = {}
        removes: dict[str, set[str]] = {}
        for write in writes:
            for group, channels in write["adds"].items():
                adds.setdefault(group, set()).update(channels)
            for group, channels in write["removes"].items():
                removes.setdefault(group, set()).update(channels)
        for group in adds.keys() | removes.keys():
            pipe, key = pipe_for(group), self._group_key(group)
            if adds.get(group):
                pipe.zadd(key, dict.fromkeys(adds[group], now))
                pipe.expire(key, self.group_expiry)
            if removes.get(group):
                pipe.zrem(key, *removes[group])
        asked: dict[int, tuple[object, int]] = {}  # write -> (its pipe, its count's place)
        for number, write in enumerate(writes):
            if write["ask"] is not None:
                pipe = pipe_for(write["ask"])
                pipe.zcount(self._group_key(write["ask"]), int(now) - self.group_expiry, "+inf")
                asked[number] = (pipe, len(pipe.command_stack) - 1)
        counting = {id(pipe) for pipe, _ in asked.values()}
        results = {}
        # The shards counting go last: they count once every add is in.
        for pipe in sorted(pipes.values(), key=lambda pipe: id(pipe) in counting):
            results[id(pipe)] = await pipe.execute()
        return [results[id(asked[number][0])][asked[number][1]] if number in asked else None
                for number in range(len(writes))]

    # --- the rest of the API: log and carry on -----------------------------------

    def _redis_known_away(self) -> bool:
        """Redis failed and a receiving loop of this process is probing it:
        skip the round trip (and its timeout) until that loop sees it back."""
        return not self.outage.reachable and self.receive_count > 0

    async def group_add(self, group, channel):
        await self.groups_add([group], channel)

    async def group_discard(self, group, channel):
        await self.groups_discard([group], channel)

    async def groups_add(self, groups, channel, *, ask=None):
        """Add the channel to each group: one round trip to Redis for them all
        (channels-redis' ``group_add`` takes two per group) on one Redis. With
        ``ask`` (a group), also whether it has members, counted after the adds
        in that round trip (``group_has_members``); None when not known."""
        for group in groups:
            assert self.require_valid_group_name(group), "Group name not valid"
            self.memberships.joined(group, channel)
        assert self.require_valid_channel_name(channel), "Channel name not valid"
        if self._redis_known_away():
            return None  # remembered above: joined for real when Redis is back
        try:
            counted = await self._write_groups_gathered({group: {channel} for group in groups}, {},
                                                        ask=ask)
        except REDIS_DOWN_ERRORS as error:
            self._unreachable(error)
            return None
        self._answered_by_notification()
        return None if counted is None else counted > 0

    async def groups_discard(self, groups, channel):
        """Take the channel out of each group, in one round trip."""
        for group in groups:
            assert self.require_valid_group_name(group), "Group name not valid"
            self.memberships.left(group, channel)
        assert self.require_valid_channel_name(channel), "Channel name not valid"
        if self._redis_known_away():
            self.memberships.left_unseen(groups, channel)
            return
        try:
            await self._write_groups_gathered({}, {group: {channel} for group in groups})
        except REDIS_DOWN_ERRORS as error:
            self.memberships.left_unseen(groups, channel)
            self._unreachable(error)
            return
        self._answered_by_notification()

    async def group_has_members(self, group) -> bool:
        """Whether any channel (of any process) is in the group: one ZCOUNT of
        its unexpired members. True while Redis is away (not known)."""
        if self._redis_known_away():
            return True
        index = self.consistent_hash(group)
        try:
            count = await self.connection(index).zcount(
                self._group_key(group), int(time.time()) - self.group_expiry, "+inf"
            )
        except REDIS_DOWN_ERRORS as error:
            self._unreachable(error)
            return True
        self._answered_by_notification()
        return count > 0

    async def group_send(self, group, message):
        if self._redis_known_away():
            logger.debug("channel layer: %s to group %s dropped", message.get("type"), group)
            return
        try:
            await super().group_send(group, message)
        except REDIS_DOWN_ERRORS as error:
            self._unreachable(error)
            logger.debug("channel layer: %s to group %s dropped", message.get("type"), group)
            return
        self._answered_by_notification()

    async def send(self, channel, message):
        if self._redis_known_away():
            logger.debug("channel layer: %s to %s dropped", message.get("type"), channel)
            return
        try:
            await super().send(channel, message)
        except REDIS_DOWN_ERRORS as error:
            self._unreachable(error)
            logger.debug("channel layer: %s to %s dropped", message.get("type"), channel)
            return
        self._answered_by_notification()
