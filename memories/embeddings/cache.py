"""Query embeddings, remembered: an in-process LRU, shared through Redis when configured.

Agents repeat themselves: the same "what does the user prefer?" opens session
after session. A query's vector depends only on the model and the exact text
the model sees, so it can be kept.

Every entry belongs to one **scope**, the caller that computed it: a user, or
one of a user's agents when the call acts as that agent (``scope()``). A
lookup finds only its own scope's entries, so one tenant can never learn,
from a field or from how fast an answer came, that another tenant asked the
same question: their lookups never touch each other's entries. The counters
(hits, misses, evictions, ...) and every figure a tool reports are kept per
scope too. What tenants still share is the capacity, ``QUERY_CACHE_SIZE``
entries in all; an eviction can tell that the server is busy, never with
what.

Entries are keyed by ``sha256(scope, NUL, model id, NUL, normalised query)``;
the text itself is never stored, here or in Redis, so the cache holds no one's
words, only vectors.

Two levels:

* in process, an LRU of at most ``QUERY_CACHE_SIZE`` entries, each living
  ``QUERY_CACHE_TTL_SECONDS``;
* with ``REDIS_URL``, Redis under ``recall:qcache:<scope>:<key>`` with the
  same TTL, so every app server (and ``recall worker``) shares what any of
  them computed for the same caller. Redis is an accelerator, never a
  dependency: when it cannot answer, the cache logs one warning, works in
  process alone, and tries Redis again after ``RETRY_AFTER`` seconds.

The counters are this process's, since it started.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from core.counters import Book
from memories.embeddings.base import Embedder

logger = logging.getLogger(__name__)

KEY_PREFIX = "recall:qcache:"
REDIS_TIMEOUT = 0.25
RETRY_AFTER = 5.0
# An entry's bytes and Python's overhead for its key, per entry.
ENTRY_OVERHEAD = 250

# Where a vector came from, as search_memory reports it.
CACHE = "cache"
SHARED = "shared-cache"
MODEL = "model"


def scope(user_id: uuid.UUID | str, agent_id: uuid.UUID | str | None = None) -> str:
    """Return the cache scope of a caller: its user, and its agent when it acts as one."""
    return f"u{user_id}" if agent_id is None else f"u{user_id}.a{agent_id}"


def cache_key(owner: str, model_id: str, text: str) -> str:
    data = f"{owner}\0{model_id}\0{text}".encode("utf-8", "surrogatepass")
    return hashlib.sha256(data).hexdigest()


def _within(owner: str, prefix: str | None) -> bool:
    """Whether ``owner`` is ``prefix``'s scope or one of its agents' (every scope for None)."""
    return prefix is None or owner == prefix or owner.startswith(prefix + ".")


@dataclass(frozen=True)
class Stats:
    hits: int
    shared_hits: int  # found in Redis after a local miss (counted in hits too)
    misses: int
    size: int
    max_size: int
    ttl_seconds: float
    bytes: int
    evictions: int
    expirations: int
    avg_hit_ms: float | None
    avg_miss_ms: float | None
    shared: bool  # REDIS_URL is set
    shared_available: bool  # ... and Redis answered last time it was asked

    @property
    def lookups(self) -> int:
        return self.hits + self.misses

    @property
    def hit_rate(self) -> float | None:
        return self.hits / self.lookups if self.lookups else None

    @property
    def avg_ms(self) -> float | None:
        timed = [
            (avg, n)
            for avg, n in ((self.avg_hit_ms, self.hits), (self.avg_miss_ms, self.misses))
            if avg is not None and n
        ]
        total = sum(n for _, n in timed)
        return sum(avg * n for avg, n in timed) / total if total else None


@dataclass(frozen=True)
class Optimization:
    """What ``optimize()`` did, to one scope's entries."""

    expired: int  # past their TTL, or of a model no longer configured: removed
    demoted: int  # least recently used beyond ``max_entries``: dropped from this process
    promoted: int  # kept, and copied to Redis where it lacked them
    refreshed: int  # dropped by force_refresh, here and in Redis, to be computed afresh
    kept: int
    bytes_freed: int
    seconds: float


@dataclass
class _Entry:
    vector: np.ndarray
    model_id: str
    stored: float
    owner: str

    @property
    def bytes(self) -> int:
        return self.vector.nbytes + ENTRY_OVERHEAD


@dataclass
class _Counters:
    """One scope's share of the cache: what it holds and how its lookups went."""

    size: int = 0
    bytes: int = 0
    hits: int = 0
    shared_hits: int = 0
    misses: int = 0
    evictions: int = 0
    expirations: int = 0
    hit_seconds: float = 0.0
    miss_seconds: float = 0.0


class QueryCache:
    def __init__(
        self,
        *,
        max_entries: int,
        ttl: float,
        redis_url: str | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_entries = max_entries
        self.ttl = ttl
        self.redis_url = redis_url
        self._clock = clock
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self._lock = threading.Lock()
        self._client: Any = None
        self._redis_down_until = 0.0
        self._warned = False
        self._book = Book(_Counters)

    @property
    def enabled(self) -> bool:
        return self.max_entries > 0

    def embed(
        self, embedder: Embedder, text: str, *, scope: str, use_cache: bool = True
    ) -> tuple[Any, str]:
        """Return the vector of ``text`` by ``embedder`` and where it came from.

        Only entries ``scope`` computed are looked at, and the vector computed
        here is kept for ``scope`` alone. ``use_cache=False`` runs the model
        whatever is cached, and stores the fresh vector. The caller has
        already normalised ``text``.
        """
        started = time.perf_counter()
        key = cache_key(scope, embedder.model_id, text)
        if use_cache and self.enabled:
            vector = self._get_local(key)
            source = CACHE
            if vector is None:
                vector = self._get_shared(scope, key, embedder.dimensions)
                source = SHARED
                if vector is not None:
                    self._put_local(key, scope, embedder.model_id, vector)
            if vector is not None:
                self._count_hit(scope, source, time.perf_counter() - started)
                return vector, source
        vector = embedder.embed_one(text)
        if self.enabled:
            self._put_local(key, scope, embedder.model_id, vector)
            self._put_shared(scope, key, vector)
            self._count_miss(scope, time.perf_counter() - started)
        return vector, MODEL

    # in process --------------------------------------------------------------

    def _get_local(self, key: str) -> np.ndarray | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            if self._clock() - entry.stored > self.ttl:
                self._drop_locked(key)
                self._book.of(entry.owner).expirations += 1
                return None
            self._entries.move_to_end(key)
            return entry.vector

    def _put_local(self, key: str, owner: str, model_id: str, vector: np.ndarray) -> None:
        # Callers get the same array on every hit: make sure none can change it.
        frozen = np.array(vector, dtype=np.float32, copy=True)
        frozen.setflags(write=False)
        with self._lock:
            if key in self._entries:
                self._drop_locked(key)
            entry = _Entry(frozen, model_id, self._clock(), owner)
            self._entries[key] = entry
            counters = self._book.of(owner)
            counters.size += 1
            counters.bytes += entry.bytes
            while len(self._entries) > self.max_entries:
                oldest = next(iter(self._entries))
                evicted = self._drop_locked(oldest)
                self._book.of(evicted.owner).evictions += 1

    def _drop_locked(self, key: str) -> _Entry:
        entry = self._entries.pop(key)
        counters = self._book.peek(entry.owner)
        counters.size -= 1
        counters.bytes -= entry.bytes
        return entry

    # Redis -------------------------------------------------------------------

    def _redis(self) -> Any:
        if not self.redis_url or self._clock() < self._redis_down_until:
            return None
        if self._client is None:
            import redis

            self._client = redis.Redis.from_url(
                self.redis_url,
                socket_timeout=REDIS_TIMEOUT,
                socket_connect_timeout=REDIS_TIMEOUT,
            )
        return self._client

    def _redis_failed(self) -> None:
        self._redis_down_until = self._clock() + RETRY_AFTER
        if not self._warned:
            self._warned = True
            logger.warning(
                "query cache: Redis unavailable, caching in this process only",
                extra={"retry_s": RETRY_AFTER},
            )

    def _redis_ok(self) -> None:
        if self._warned:
            self._warned = False
            logger.info("query cache: Redis is back, sharing cached queries again")

    def _get_shared(self, owner: str, key: str, dimensions: int) -> np.ndarray | None:
        client = self._redis()
        if client is None:
            return None
        try:
            raw = client.get(redis_name(owner, key))
        except Exception:
            self._redis_failed()
            return None
        self._redis_ok()
        if not isinstance(raw, bytes) or len(raw) != dimensions * 4:
            return None
        return np.frombuffer(raw, dtype=np.float32)

    def _put_shared(self, owner: str, key: str, vector: np.ndarray) -> bool:
        client = self._redis()
        if client is None:
            return False
        try:
            client.set(
                redis_name(owner, key),
                np.asarray(vector, dtype=np.float32).tobytes(),
                ex=max(1, int(self.ttl)),
            )
        except Exception:
            self._redis_failed()
            return False
        self._redis_ok()
        return True

    def _shared_names(self, client: Any, prefix: str | None, *, exact: bool) -> Iterable[bytes]:
        """Redis names of one scope (``exact``), of a user and its agents, or of everyone."""
        if prefix is None:
            return client.scan_iter(match=KEY_PREFIX + "*", count=1000)
        pattern = f"{KEY_PREFIX}{prefix}:*" if exact else f"{KEY_PREFIX}{prefix}[:.]*"
        return client.scan_iter(match=pattern, count=1000)

    def _clear_shared(self, prefix: str | None, *, exact: bool) -> int:
        client = self._redis()
        if client is None:
            return 0
        removed = 0
        try:
            batch: list[bytes] = []
            for name in self._shared_names(client, prefix, exact=exact):
                batch.append(name)
                if len(batch) >= 1000:
                    removed += client.unlink(*batch)
                    batch = []
            if batch:
                removed += client.unlink(*batch)
        except Exception:
            self._redis_failed()
        return removed

    def shared_size(self, scope: str | None = None) -> int | None:
        """Count Redis's entries of ``scope`` (every scope's for None); None when it cannot say."""
        client = self._redis()
        if client is None:
            return None
        try:
            return sum(1 for _ in self._shared_names(client, scope, exact=True))
        except Exception:
            self._redis_failed()
            return None

    # housekeeping ------------------------------------------------------------

    def optimize(
        self,
        *,
        scope: str,
        model_id: str,
        max_entries: int | None = None,
        force_refresh: bool = False,
    ) -> Optimization:
        """Drop what is stale, keep the most recently used, and share what is kept.

        Only ``scope``'s entries are touched, here and in Redis.

        * Entries past their TTL, or computed by a model other than
          ``model_id``, are removed (``expired``).
        * Beyond ``max_entries`` (default: the configured size), the least
          recently used are dropped from this process (``demoted``); with
          Redis they stay there, for any process to pick up again.
        * What is kept is written to Redis where Redis lacks it
          (``promoted``), so the other servers share this one's hot set.
        * ``force_refresh`` empties both levels instead, so every query is
          embedded afresh on its next use (``refreshed``).
        """
        started = time.perf_counter()
        limit = (
            self.max_entries if max_entries is None else max(0, min(max_entries, self.max_entries))
        )
        now = self._clock()
        with self._lock:
            counters = self._book.of(scope)
            before = counters.bytes
            mine = [key for key, entry in self._entries.items() if entry.owner == scope]
            if force_refresh:
                for key in mine:
                    self._drop_locked(key)
                refreshed, expired, demoted = len(mine), 0, 0
                kept: list[tuple[str, _Entry]] = []
            else:
                refreshed = 0
                stale = [
                    key
                    for key in mine
                    if now - self._entries[key].stored > self.ttl
                    or self._entries[key].model_id != model_id
                ]
                for key in stale:
                    self._drop_locked(key)
                expired = len(stale)
                counters.expirations += expired
                live = [key for key in mine if key in self._entries]  # oldest first
                demoted = max(0, len(live) - limit)
                for key in live[:demoted]:
                    self._drop_locked(key)
                counters.evictions += demoted
                kept = [(key, self._entries[key]) for key in live[demoted:]]
            freed = before - counters.bytes
        promoted = 0
        if force_refresh:
            refreshed += self._clear_shared(scope, exact=True)
        else:
            promoted = self._promote(kept)
        return Optimization(
            expired=expired,
            demoted=demoted,
            promoted=promoted,
            refreshed=refreshed,
            kept=len(kept),
            bytes_freed=freed,
            seconds=time.perf_counter() - started,
        )

    def _promote(self, kept: list[tuple[str, _Entry]]) -> int:
        client = self._redis()
        if client is None or not kept:
            return 0
        try:
            pipe = client.pipeline(transaction=False)
            for key, entry in kept:
                remaining = max(1, int(self.ttl - (self._clock() - entry.stored)))
                pipe.set(
                    redis_name(entry.owner, key), entry.vector.tobytes(), ex=remaining, nx=True
                )
            written = pipe.execute()
        except Exception:
            self._redis_failed()
            return 0
        return sum(1 for ok in written if ok)

    def clear(self, user: str | None = None, *, exact: bool = False, shared: bool = False) -> int:
        """Drop entries in this process, and in Redis with ``shared``; return how many.

        ``user`` is a scope: with ``exact``, that scope alone; without, that
        user's scope and all of its agents'. None clears every scope (the
        operator's ``clear_query_cache``).
        """
        with self._lock:
            doomed = [
                key
                for key, entry in self._entries.items()
                if (entry.owner == user if exact else _within(entry.owner, user))
            ]
            for key in doomed:
                self._drop_locked(key)
        removed = len(doomed)
        if shared:
            removed += self._clear_shared(user, exact=exact)
        return removed

    def __len__(self) -> int:
        return len(self._entries)

    # counters ----------------------------------------------------------------

    def _count_hit(self, owner: str, source: str, seconds: float) -> None:
        with self._lock:
            counters = self._book.of(owner)
            counters.hits += 1
            counters.shared_hits += source == SHARED
            counters.hit_seconds += seconds

    def _count_miss(self, owner: str, seconds: float) -> None:
        with self._lock:
            counters = self._book.of(owner)
            counters.misses += 1
            counters.miss_seconds += seconds

    def stats(self, scope: str | None = None) -> Stats:
        """Return ``scope``'s share of the cache; every scope's together for None (operators)."""
        with self._lock:
            c = self._book.total() if scope is None else self._book.peek(scope)
            return Stats(
                hits=c.hits,
                shared_hits=c.shared_hits,
                misses=c.misses,
                size=c.size,
                max_size=self.max_entries,
                ttl_seconds=self.ttl,
                bytes=c.bytes,
                evictions=c.evictions,
                expirations=c.expirations,
                avg_hit_ms=c.hit_seconds * 1000 / c.hits if c.hits else None,
                avg_miss_ms=c.miss_seconds * 1000 / c.misses if c.misses else None,
                shared=bool(self.redis_url),
                shared_available=bool(self.redis_url) and self._clock() >= self._redis_down_until,
            )

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


def redis_name(owner: str, key: str) -> str:
    return f"{KEY_PREFIX}{owner}:{key}"
