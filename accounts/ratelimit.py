"""Per-key request rate limits: token buckets kept in process or shared through Redis.

Each key has a bucket of ``capacity`` tokens that refills continuously at
``refill_per_s``. A request takes one token. With no whole token left it is
denied and takes nothing, so a client that keeps retrying does not push its
own recovery further away. A full bucket lets a client spend its whole
allowance at once; after that it gets the steady rate.

Backends
    ``InMemoryRateLimiter`` keeps buckets in this process. It is the default,
    and exact while one process serves all traffic.

    ``SharedMemoryRateLimiter`` keeps them in memory shared by the worker
    processes of one ``recall serve --workers N`` (``core/sharedstate.py``),
    so N workers on one machine admit one allowance per key, without Redis.

    ``RedisRateLimiter`` keeps them in Redis (``REDIS_URL``), so every process
    on every machine draws from the same bucket. One Lua script refills and
    takes a token atomically, timed by the Redis server's clock because app
    servers' clocks disagree. Keys are ``recall:rl:<key>`` and expire once the
    bucket would be full again, which is the same as having no bucket.

Failure policy (``FailoverRateLimiter``, used whenever ``REDIS_URL`` is set)
    Rate limiting must not take the service down with it. When Redis cannot
    answer, the request is decided by a local limiter instead (the workers'
    shared memory, or the process's own buckets): limits fail open to
    per-machine limits, so during an outage a client may get up to one
    allowance per server, but never unlimited requests.

    The first failure of an outage logs one warning; later failures in the
    same outage log nothing. While Redis is down, one request every
    ``FAILOVER_BACKOFF`` seconds tries it again and the rest go straight to
    the local limiter. When that probe succeeds, an info line is logged and
    Redis decides again; its buckets were not persisted, so a restarted Redis
    starts every key full.

    The Redis client has ``REDIS_TIMEOUT``-second connect and read timeouts
    and no retries: a refused connection fails at once, and a hung or
    unreachable Redis delays a request by at most about twice that, and only
    for the request that found the outage or probes it.

Decisions
    ``check()`` returns a ``RateDecision``: whether the request may go ahead,
    the limit and what remains of it, the time until a retry can succeed and
    until the bucket is full again, and the backend that decided. Transports
    do not call ``check()`` themselves: ``accounts/admission.py`` turns the
    decision into the answer every one of them gives.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol

import redis
from django.conf import settings
from redis.backoff import NoBackoff
from redis.retry import Retry

from core import sharedstate
from core.sharedstate import SharedState

log = logging.getLogger(__name__)

Clock = Callable[[], float]

REDIS_TIMEOUT = 0.25
FAILOVER_BACKOFF = 5.0
KEY_PREFIX = "recall:rl:"

# Refill arithmetic in floating point can land a hair under a whole token after
# exactly the right wait. Count that as a token rather than deny the request
# and ask the client to come back in 1e-16 seconds.
EPSILON = 1e-9


@dataclass(frozen=True, slots=True)
class RateDecision:
    allowed: bool
    remaining: int
    # Seconds until one whole token is available: above zero whenever the
    # request was denied, so math.ceil() of it is a usable Retry-After.
    retry_after: float
    limit: int  # the bucket's capacity
    reset_after: float  # seconds until the bucket is full again
    # Which limiter decided: "memory" also means a Redis outage when REDIS_URL is set.
    backend: str

    def headers(self) -> dict[str, str]:
        """Return RateLimit-* headers (IETF draft names), and Retry-After when denied."""
        headers = {
            "RateLimit-Limit": str(self.limit),
            "RateLimit-Remaining": str(self.remaining),
            "RateLimit-Reset": str(math.ceil(self.reset_after)),
        }
        if not self.allowed:
            headers["Retry-After"] = str(math.ceil(self.retry_after))
        return headers


def _decide(
    allowed: bool, tokens: float, capacity: int, refill_per_s: float, backend: str
) -> RateDecision:
    remaining = math.floor(tokens + EPSILON)
    retry_after = 0.0 if allowed else (1.0 - tokens) / refill_per_s
    reset_after = max(0.0, capacity - tokens) / refill_per_s
    return RateDecision(allowed, remaining, retry_after, capacity, reset_after, backend)


def _validate(capacity: int, refill_per_s: float) -> None:
    if capacity < 1 or not refill_per_s > 0:
        raise ValueError(f"Need capacity >= 1 and refill_per_s > 0; got {capacity}, {refill_per_s}")


class RateLimiter(Protocol):
    def check(self, key: str, capacity: int, refill_per_s: float) -> RateDecision: ...

    def close(self) -> None: ...


class LimiterUnavailable(Exception):
    """The shared limiter could not decide; the caller should decide locally."""


@dataclass(slots=True)
class _Bucket:
    tokens: float
    updated: float
    full_at: float


class InMemoryRateLimiter:
    """Token buckets in this process, safe to share between threads.

    Buckets are kept in least-recently-used order. A bucket that has refilled
    to capacity behaves exactly like a missing one, so each check drops such
    buckets from the old end. Past ``max_keys`` the oldest bucket goes even if
    it is not full, which can only let that key through early, never deny it.
    """

    backend = "memory"

    def __init__(self, *, max_keys: int = 100_000, clock: Clock = time.monotonic) -> None:
        self._buckets: OrderedDict[str, _Bucket] = OrderedDict()
        self._lock = threading.Lock()
        self._max_keys = max_keys
        self._clock = clock

    def __len__(self) -> int:
        return len(self._buckets)

    def check(self, key: str, capacity: int, refill_per_s: float) -> RateDecision:
        _validate(capacity, refill_per_s)
        with self._lock:
            now = self._clock()
            bucket = self._buckets.get(key)
            if bucket is None:
                tokens = float(capacity)
            else:
                elapsed = max(0.0, now - bucket.updated)
                tokens = min(float(capacity), bucket.tokens + elapsed * refill_per_s)
            allowed = tokens >= 1.0 - EPSILON
            if allowed:
                tokens = max(0.0, tokens - 1.0)
            full_at = now + (capacity - tokens) / refill_per_s
            if bucket is None:
                self._buckets[key] = _Bucket(tokens, now, full_at)
            else:
                bucket.tokens, bucket.updated, bucket.full_at = tokens, now, full_at
                self._buckets.move_to_end(key)
            self._evict(now)
        return _decide(allowed, tokens, capacity, refill_per_s, self.backend)

    def _evict(self, now: float) -> None:
        # A bucket is dropped at most once per insertion, so this is O(1)
        # amortised. A not-yet-full bucket at the old end shields younger full
        # ones until it fills; max_keys bounds what can pile up behind it.
        buckets = self._buckets
        while buckets:
            oldest = next(iter(buckets.values()))
            if oldest.full_at > now and len(buckets) <= self._max_keys:
                return
            buckets.popitem(last=False)

    def close(self) -> None:
        pass


class SharedMemoryRateLimiter:
    """Token buckets shared by the worker processes of one server, through shared memory."""

    backend = "shared"

    def __init__(self, state: SharedState, *, clock: Clock = time.monotonic) -> None:
        self._state = state
        self._clock = clock

    def check(self, key: str, capacity: int, refill_per_s: float) -> RateDecision:
        _validate(capacity, refill_per_s)
        allowed, tokens = self._state.take(key, capacity, refill_per_s, EPSILON, self._clock)
        return _decide(allowed, tokens, capacity, refill_per_s, self.backend)

    def close(self) -> None:
        pass  # the mapping belongs to the process, not to one limiter


# Refill, then take one token if there is one. Returns {allowed, tokens left}.
# Numbers go back as strings: Redis would truncate a Lua number to an integer.
# A denied request changes nothing, so it writes nothing.
_SCRIPT = """
local capacity = tonumber(ARGV[1])
local rate = tonumber(ARGV[2])
local epsilon = tonumber(ARGV[3])
local clock = redis.call('TIME')
local now = tonumber(clock[1]) + tonumber(clock[2]) / 1000000
local state = redis.call('HMGET', KEYS[1], 'tokens', 'ts')
local tokens = tonumber(state[1])
local ts = tonumber(state[2])
if tokens == nil or ts == nil then
  tokens = capacity
  ts = now
end
tokens = math.min(capacity, tokens + math.max(0, now - ts) * rate)
if tokens < 1 - epsilon then
  return {0, string.format('%.17g', tokens)}
end
tokens = math.max(0, tokens - 1)
redis.call('HSET', KEYS[1], 'tokens', string.format('%.17g', tokens),
  'ts', string.format('%.17g', now))
-- Expire a second after the bucket would be full again: by then it is no different from none.
local ttl_ms = math.ceil((capacity - tokens) / rate * 1000) + 1000
redis.call('PEXPIRE', KEYS[1], string.format('%d', ttl_ms))
return {1, string.format('%.17g', tokens)}
"""


class RedisRateLimiter:
    """Token buckets in Redis, shared by every process that uses the same URL.

    Raises ``LimiterUnavailable`` when Redis cannot answer; wrap it in
    ``FailoverRateLimiter`` to keep serving through an outage.
    """

    backend = "redis"

    def __init__(
        self, url: str, *, prefix: str = KEY_PREFIX, timeout: float = REDIS_TIMEOUT
    ) -> None:
        # redis-py's default retries back off for seconds, which would hold a
        # request hostage to a dead Redis; the failover wrapper retries instead.
        self.client = redis.Redis.from_url(
            url,
            socket_connect_timeout=timeout,
            socket_timeout=timeout,
            retry=Retry(NoBackoff(), 0),
        )
        # EVALSHA, loading the script on the first NOSCRIPT (also after a restart).
        self._script = self.client.register_script(_SCRIPT)
        self._prefix = prefix

    def check(self, key: str, capacity: int, refill_per_s: float) -> RateDecision:
        _validate(capacity, refill_per_s)
        try:
            allowed, tokens = self._script(
                keys=[self._prefix + key], args=[capacity, repr(refill_per_s), repr(EPSILON)]
            )
        except (redis.RedisError, OSError) as exc:
            # The type only: Redis's message names its address (and may quote a password).
            raise LimiterUnavailable(type(exc).__name__) from exc
        return _decide(bool(allowed), float(tokens), capacity, refill_per_s, self.backend)

    def close(self) -> None:
        self.client.close()


Route = Literal["primary", "probe", "fallback"]


class FailoverRateLimiter:
    """Ask ``primary``; while it is unavailable, ask ``fallback``.

    See the module docstring for the policy.
    """

    def __init__(
        self,
        primary: RateLimiter,
        fallback: RateLimiter,
        *,
        backoff: float = FAILOVER_BACKOFF,
        clock: Clock = time.monotonic,
    ) -> None:
        self.primary = primary
        self.fallback = fallback
        self._backoff = backoff
        self._clock = clock
        self._lock = threading.Lock()
        self._down_since: float | None = None
        self._next_probe = 0.0

    @property
    def degraded(self) -> bool:
        return self._down_since is not None

    def check(self, key: str, capacity: int, refill_per_s: float) -> RateDecision:
        route = self._route()
        if route == "fallback":
            return self.fallback.check(key, capacity, refill_per_s)
        try:
            decision = self.primary.check(key, capacity, refill_per_s)
        except LimiterUnavailable as exc:
            self._failed(exc)
            return self.fallback.check(key, capacity, refill_per_s)
        # Only a probe ends an outage: a call that started before the outage
        # was noticed and happened to succeed proves nothing about now.
        if route == "probe":
            self._recovered()
        return decision

    def _route(self) -> Route:
        with self._lock:
            if self._down_since is None:
                return "primary"
            now = self._clock()
            if now < self._next_probe:
                return "fallback"
            # This request probes; the others stay local until it reports back.
            self._next_probe = now + self._backoff
            return "probe"

    def _failed(self, exc: LimiterUnavailable) -> None:
        with self._lock:
            now = self._clock()
            self._next_probe = now + self._backoff
            if self._down_since is not None:
                return
            self._down_since = now
        log.warning(
            "Shared rate limiter unavailable; limiting in each process until it returns",
            extra={"error": str(exc), "retry_in_s": self._backoff},
        )

    def _recovered(self) -> None:
        with self._lock:
            if self._down_since is None:
                return
            outage = self._clock() - self._down_since
            self._down_since = None
        log.info("Shared rate limiter is back", extra={"outage_s": round(outage, 1)})

    def close(self) -> None:
        self.primary.close()
        self.fallback.close()


def limit_for_tier(tier: str) -> tuple[int, float] | None:
    """Return ``(capacity, refill_per_s)`` for a tier, or None for a tier without a limit.

    The capacity is the whole allowance for one period (``RATE_LIMITS``), so
    an idle client may spend it at once; after that it refills at the steady
    rate of allowance per period.
    """
    try:
        limit = settings.RATE_LIMITS[tier]
    except KeyError:
        raise ValueError(f"No rate limit configured for tier {tier!r}") from None
    if limit is None:
        return None
    count, period = limit
    return count, count / period


_limiter: RateLimiter | None = None
_limiter_lock = threading.Lock()


def get_rate_limiter() -> RateLimiter:
    """Return this process's limiter, built from settings on first use."""
    global _limiter
    limiter = _limiter
    if limiter is not None:
        return limiter
    with _limiter_lock:
        if _limiter is None:
            # The workers of one server share their buckets; with Redis, the
            # servers of a fleet do, and a Redis outage falls back to what one
            # machine can share.
            shared = sharedstate.get()
            local: RateLimiter = (
                SharedMemoryRateLimiter(shared) if shared is not None else InMemoryRateLimiter()
            )
            if settings.REDIS_URL:
                _limiter = FailoverRateLimiter(
                    primary=RedisRateLimiter(settings.REDIS_URL), fallback=local
                )
            else:
                _limiter = local
        return _limiter


def reset_rate_limiter() -> None:
    """Close and forget the process's limiter, so the next use reads settings again."""
    global _limiter
    with _limiter_lock:
        limiter, _limiter = _limiter, None
    if limiter is not None:
        limiter.close()
