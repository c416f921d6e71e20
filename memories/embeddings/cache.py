"""Query embeddings, remembered: an in-process LRU, shared through Redis when configured.

Agents repeat themselves: the same "what does the user prefer?" opens session
after session. A query's vector depends only on the model and the exact text
the model sees, so it can be kept. Entries are keyed by
``sha256(model id, NUL, normalised query)``; the text itself is never stored,
here or in Redis, so the cache holds no one's words, only vectors.

Two levels:

* in process, an LRU of at most ``QUERY_CACHE_SIZE`` entries, each living
  ``QUERY_CACHE_TTL_SECONDS``;
* with ``REDIS_URL``, Redis under ``recall:qcache:<key>`` with the same TTL, so
  every app server (and ``recall worker``) shares what any of them computed.
  Redis is an accelerator, never a dependency: when it cannot answer, the
  cache logs one warning, works in process alone, and tries Redis again after
  ``RETRY_AFTER`` seconds.

The counters (hits, misses, evictions, ...) are this process's, since it
started or since ``reset_stats()``.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from memories.embeddings.base import Embedder

logger = logging.getLogger(__name__)

KEY_PREFIX = "recall:qcache:"
REDIS_TIMEOUT = 0.25
RETRY_AFTER = 5.0

# Where a vector came from, as search_memory reports it.
CACHE = "cache"
SHARED = "shared-cache"
MODEL = "model"


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
    """What ``optimize()`` did."""

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
        self.reset_stats()

    @property
    def enabled(self) -> bool:
        return self.max_entries > 0

    # the one call search makes ---------------------------------------------

    def embed(self, embedder: Embedder, text: str, *, use_cache: bool = True) -> tuple[Any, str]:
        """Return the vector of ``text`` by ``embedder`` and where it came from.

        ``use_cache=False`` runs the model whatever is cached, and stores the
        fresh vector. The caller has already normalised ``text``.
        """
        started = time.perf_counter()
        key = cache_key(embedder.model_id, text)
        if use_cache and self.enabled:
            vector = self._get_local(key)
            source = CACHE
            if vector is None:
                vector = self._get_shared(key, embedder.dimensions)
                source = SHARED
                if vector is not None:
                    self._put_local(key, embedder.model_id, vector)
            if vector is not None:
                self._count_hit(source, time.perf_counter() - started)
                return vector, source
        vector = embedder.embed_one(text)
        if self.enabled:
            self._put_local(key, embedder.model_id, vector)
            self._put_shared(key, vector)
            self._count_miss(time.perf_counter() - started)
        return vector, MODEL

    # in process --------------------------------------------------------------

    def _get_local(self, key: str) -> np.ndarray | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            if self._clock() - entry.stored > self.ttl:
                del self._entries[key]
                self._expirations += 1
                return None
            self._entries.move_to_end(key)
            return entry.vector

    def _put_local(self, key: str, model_id: str, vector: np.ndarray) -> None:
        # Callers get the same array on every hit: make sure none can change it.
        frozen = np.array(vector, dtype=np.float32, copy=True)
        frozen.setflags(write=False)
        with self._lock:
            self._entries[key] = _Entry(frozen, model_id, self._clock())
            self._entries.move_to_end(key)
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)
                self._evictions += 1

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

    def _get_shared(self, key: str, dimensions: int) -> np.ndarray | None:
        client = self._redis()
        if client is None:
            return None
        try:
            raw = client.get(KEY_PREFIX + key)
        except Exception:
            self._redis_failed()
            return None
        self._redis_ok()
        if not isinstance(raw, bytes) or len(raw) != dimensions * 4:
            return None
        return np.frombuffer(raw, dtype=np.float32)

    def _put_shared(self, key: str, vector: np.ndarray) -> bool:
        client = self._redis()
        if client is None:
            return False
        try:
            client.set(
                KEY_PREFIX + key,
                np.asarray(vector, dtype=np.float32).tobytes(),
                ex=max(1, int(self.ttl)),
            )
        except Exception:
            self._redis_failed()
            return False
        self._redis_ok()
        return True

    def _clear_shared(self) -> int:
        client = self._redis()
        if client is None:
            return 0
        removed = 0
        try:
            batch: list[bytes] = []
            for name in client.scan_iter(match=KEY_PREFIX + "*", count=1000):
                batch.append(name)
                if len(batch) >= 1000:
                    removed += client.unlink(*batch)
                    batch = []
            if batch:
                removed += client.unlink(*batch)
        except Exception:
            self._redis_failed()
        return removed

    # housekeeping ------------------------------------------------------------

    def optimize(
        self,
        *,
        model_id: str,
        max_entries: int | None = None,
        force_refresh: bool = False,
    ) -> Optimization:
        """Drop what is stale, keep the most recently used, and share what is kept.

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
            before = self._bytes_locked()
            if force_refresh:
                refreshed = len(self._entries)
                self._entries.clear()
                expired = demoted = 0
            else:
                refreshed = 0
                stale = [
                    key
                    for key, entry in self._entries.items()
                    if now - entry.stored > self.ttl or entry.model_id != model_id
                ]
                for key in stale:
                    del self._entries[key]
                expired = len(stale)
                self._expirations += expired
                demoted = max(0, len(self._entries) - limit)
                for _ in range(demoted):
                    self._entries.popitem(last=False)
                self._evictions += demoted
            kept = list(self._entries.items())
            freed = before - self._bytes_locked()
        promoted = 0
        if force_refresh:
            refreshed += self._clear_shared()
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
                pipe.set(KEY_PREFIX + key, entry.vector.tobytes(), ex=remaining, nx=True)
            written = pipe.execute()
        except Exception:
            self._redis_failed()
            return 0
        return sum(1 for ok in written if ok)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)

    # counters ----------------------------------------------------------------

    def reset_stats(self) -> None:
        self._hits = self._shared_hits = self._misses = 0
        self._evictions = self._expirations = 0
        self._hit_seconds = self._miss_seconds = 0.0

    def _count_hit(self, source: str, seconds: float) -> None:
        with self._lock:
            self._hits += 1
            self._shared_hits += source == SHARED
            self._hit_seconds += seconds

    def _count_miss(self, seconds: float) -> None:
        with self._lock:
            self._misses += 1
            self._miss_seconds += seconds

    def _bytes_locked(self) -> int:
        # The vectors, plus what Python spends on each entry and its 64-char key.
        return sum(entry.vector.nbytes + 250 for entry in self._entries.values())

    def stats(self) -> Stats:
        with self._lock:
            return Stats(
                hits=self._hits,
                shared_hits=self._shared_hits,
                misses=self._misses,
                size=len(self._entries),
                max_size=self.max_entries,
                ttl_seconds=self.ttl,
                bytes=self._bytes_locked(),
                evictions=self._evictions,
                expirations=self._expirations,
                avg_hit_ms=self._hit_seconds * 1000 / self._hits if self._hits else None,
                avg_miss_ms=self._miss_seconds * 1000 / self._misses if self._misses else None,
                shared=bool(self.redis_url),
                shared_available=bool(self.redis_url) and self._clock() >= self._redis_down_until,
            )

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


def cache_key(model_id: str, text: str) -> str:
    data = f"{model_id}\0{text}".encode("utf-8", "surrogatepass")
    return hashlib.sha256(data).hexdigest()
