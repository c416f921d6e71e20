"""Bearer API-key authentication with a bounded, invalidated cache.

``authenticate(raw)`` returns the caller's ``AuthContext`` or None. Found keys
are cached in an LRU keyed by the key's HMAC (the raw key is never kept), for
at most ``AUTH_CACHE_TTL_SECONDS`` (default 300, capped at one hour).

How fast a revocation or tier change takes effect:

* in the process that made it: at once (``invalidate()`` clears the cache);
* in the other workers of the same ``recall serve --workers N``: at once, on
  their next request (``invalidate()`` bumps a counter in their shared memory,
  ``recall/sharedstate.py``, which every cached lookup compares);
* in other processes, with Redis configured: within ``AUTH_CACHE_SYNC_SECONDS``
  (default 2). ``invalidate()`` bumps a counter in Redis; every process reads
  the counter at most that often and clears its cache when it moved;
* in other processes without Redis, or with Redis down: within the TTL.

``current`` carries the authenticated caller from the HTTP middleware (or the
stdio runner) to the tools.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import OrderedDict
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from django.conf import settings

from accounts import keys
from recall import sharedstate

logger = logging.getLogger(__name__)

VERSION_KEY = "recall:auth:version"


@dataclass(frozen=True)
class AuthContext:
    """Who a request acts for: a user, through an API key or an OAuth connection.

    ``agent_id`` is set when the caller acts as one of the user's agents (an
    agent-scoped key, or any OAuth connection); every service call then runs
    with that agent's row-level security.
    """

    user_id: uuid.UUID
    api_key_id: uuid.UUID | None
    tier: str
    agent_id: uuid.UUID | None = None
    # The OAuth connection (token family) the caller came through, if any.
    connection_id: uuid.UUID | None = None

    @property
    def rate_key(self) -> str:
        """The token bucket this caller draws from: its key's, or its connection's.

        A token outside any connection (one issued without a refresh token)
        draws from its agent's bucket, never from one shared with strangers.
        """
        if self.api_key_id is not None:
            return f"key:{self.api_key_id}"
        if self.connection_id is not None:
            return f"connection:{self.connection_id}"
        return f"agent:{self.agent_id}" if self.agent_id else f"user:{self.user_id}"


current: ContextVar[AuthContext | None] = ContextVar("recall_auth", default=None)


class AuthCache:
    def __init__(self, max_entries: int = 10_000, ttl: float = 300.0) -> None:
        self.max_entries = max_entries
        self.ttl = ttl
        self._entries: OrderedDict[str, tuple[AuthContext, float]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, digest: str) -> AuthContext | None:
        with self._lock:
            entry = self._entries.get(digest)
            if entry is None:
                return None
            context, stored = entry
            if time.monotonic() - stored > self.ttl:
                del self._entries[digest]
                return None
            self._entries.move_to_end(digest)
            return context

    def put(self, digest: str, context: AuthContext) -> None:
        with self._lock:
            self._entries[digest] = (context, time.monotonic())
            self._entries.move_to_end(digest)
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)


class _WorkerSync:
    """Clears the local cache when another worker of this server bumps the shared version."""

    def __init__(self) -> None:
        self._seen: int | None = None

    def poll(self, cache: AuthCache) -> None:
        state = sharedstate.get()
        if state is None:
            return
        version = state.auth_version()
        if version != self._seen:
            if self._seen is not None:
                cache.clear()
            self._seen = version

    def bump(self) -> None:
        state = sharedstate.get()
        if state is not None:
            state.bump_auth_version()


class _PeerSync:
    """Clears the local cache when another process bumps the shared version."""

    def __init__(self) -> None:
        self._client: Any = None
        self._seen: bytes | None = None
        self._checked = 0.0
        self._failing = False
        self._lock = threading.Lock()

    def client(self, url: str) -> Any:
        if self._client is None:
            import redis

            self._client = redis.Redis.from_url(
                url, socket_timeout=0.25, socket_connect_timeout=0.25
            )
        return self._client

    def poll(self, cache: AuthCache) -> None:
        url = settings.REDIS_URL
        if not url:
            return
        now = time.monotonic()
        if now - self._checked < settings.AUTH_CACHE_SYNC_SECONDS:
            return
        with self._lock:
            if now - self._checked < settings.AUTH_CACHE_SYNC_SECONDS:
                return
            self._checked = now
            try:
                version = self.client(url).get(VERSION_KEY)
            except Exception:
                self._note_failure()
                return
            self._failing = False
            if version != self._seen:
                if self._seen is not None or len(cache):
                    cache.clear()
                self._seen = version

    def bump(self) -> None:
        url = settings.REDIS_URL
        if not url:
            return
        try:
            self.client(url).incr(VERSION_KEY)
        except Exception:
            self._note_failure()

    def _note_failure(self) -> None:
        if not self._failing:
            logger.warning(
                "auth cache sync unavailable: other instances will see key changes "
                "within the cache TTL",
                extra={"ttl_s": settings.AUTH_CACHE_TTL_SECONDS},
            )
        self._failing = True


_cache: AuthCache | None = None
_sync = _PeerSync()
_workers = _WorkerSync()


def get_cache() -> AuthCache:
    global _cache
    if _cache is None:
        _cache = AuthCache(ttl=settings.AUTH_CACHE_TTL_SECONDS)
    return _cache


def cached(raw: str) -> AuthContext | None:
    """Return the caller for ``raw`` if the cache knows it; never touches the database."""
    if not keys.is_well_formed(raw):
        return None
    cache = get_cache()
    _workers.poll(cache)
    _sync.poll(cache)
    return cache.get(keys.digest(raw))


def authenticate(raw: str) -> AuthContext | None:
    """Return who ``raw`` authenticates, or None for a missing, unknown or revoked key."""
    from accounts import services

    if not keys.is_well_formed(raw):
        return None
    cache = get_cache()
    _workers.poll(cache)
    _sync.poll(cache)
    digest = keys.digest(raw)
    context = cache.get(digest)
    if context is not None:
        return context
    key = services.find_live_key(raw=raw)
    if key is None:
        return None
    context = AuthContext(
        user_id=key.user_id, api_key_id=key.id, tier=key.tier, agent_id=key.agent_id
    )
    cache.put(digest, context)
    return context


def invalidate() -> None:
    """Forget every cached key here at once, and in other processes within seconds."""
    get_cache().clear()
    _workers.bump()
    _sync.bump()


def reset() -> None:
    """Drop the cache and the Redis client (tests, settings changes)."""
    global _cache, _sync, _workers
    _cache = None
    _sync = _PeerSync()
    _workers = _WorkerSync()
