"""The cache of authenticated keys, and how its invalidation reaches every process.

See ``accounts/auth.py`` for how fast a change takes effect where.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import OrderedDict
from typing import Any

from django.conf import settings
from django.db import connection, transaction

from accounts import keys
from accounts.callers import AuthContext
from core import sharedstate
from core.logging import describe_exception

# The warnings are the authentication's; they keep its logger.
logger = logging.getLogger("accounts.auth")

VERSION_KEY = "recall:auth:version"
# Every process's listener (memories/jobs.py) LISTENs here: a NOTIFY, sent
# once the change commits, clears its cache, with or without Redis.
CHANNEL = "recall_auth"


class AuthCache:
    def __init__(self, max_entries: int = 10_000, ttl: float = 300.0) -> None:
        self.max_entries = max_entries
        self.ttl = ttl
        self._entries: OrderedDict[str, tuple[AuthContext, float]] = OrderedDict()
        self._lock = threading.Lock()
        # Counts the clears: a lookup that began before one read what the
        # clear was for, and must not put it back (``put(since=)``).
        self.generation = 0

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

    def put(self, digest: str, context: AuthContext, *, since: int | None = None) -> None:
        """Keep ``context``, unless the cache was cleared after generation ``since``."""
        with self._lock:
            if since is not None and since != self.generation:
                return
            self._entries[digest] = (context, time.monotonic())
            self._entries.move_to_end(digest)
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self.generation += 1

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
        self._watcher = 0  # the process whose thread polls
        self._stop = threading.Event()
        self._lock = threading.Lock()

    def client(self, url: str) -> Any:
        if self._client is None:
            import redis

            self._client = redis.Redis.from_url(
                url, socket_timeout=0.25, socket_connect_timeout=0.25
            )
        return self._client

    def watch(self, cache: AuthCache) -> None:
        """Make sure this process polls Redis on a thread of its own, every
        ``AUTH_CACHE_SYNC_SECONDS``, whether or not requests come.

        Called on the request path, inside the event loop, where a Redis that
        hangs or answers slowly must hold nothing (review136); and a key
        revoked elsewhere is dropped here within the period even after an
        idle spell, before the next request reads the cache. One thread a
        process: a forked worker starts its own.
        """
        if not settings.REDIS_URL or self._watcher == os.getpid():
            return
        with self._lock:
            if self._watcher == os.getpid():
                return
            self._watcher = os.getpid()
        threading.Thread(
            target=self._watch, args=(cache,), name="auth-cache-sync", daemon=True
        ).start()

    def _watch(self, cache: AuthCache) -> None:
        while True:
            self.poll(cache)
            if self._stop.wait(max(settings.AUTH_CACHE_SYNC_SECONDS, 0.05)):
                return

    def stop(self) -> None:
        """End the watching thread (tests)."""
        self._stop.set()

    def poll(self, cache: AuthCache) -> None:
        """Ask Redis for the shared version when a poll is due; clear ``cache`` if it moved."""
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
            self._note_success()
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
            return
        self._note_success()

    def _note_success(self) -> None:
        if self._failing:
            logger.warning("auth cache sync is back: key changes reach other instances again")
        self._failing = False

    def _note_failure(self) -> None:
        if not self._failing:
            from core import pooling

            if pooling.direct_params() is not None:
                # Each server also listens for the database's NOTIFY: a
                # revocation still arrives at once, by that road.
                logger.warning(
                    "auth cache sync through redis unavailable: key changes still reach "
                    "other instances at once through the database's notifications"
                )
            else:
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


def synced() -> AuthCache:
    """Return this process's cache, cleared first if another process invalidated keys."""
    cache = get_cache()
    _workers.poll(cache)
    _sync.watch(cache)
    return cache


def cached(raw: str) -> AuthContext | None:
    """Return the caller for ``raw`` if the cache knows it; never touches the database."""
    if not keys.is_well_formed(raw):
        return None
    return synced().get(keys.digest(raw))


def invalidate(*, announce: bool = True) -> None:
    """Forget every cached key here at once, and in other processes within seconds.

    With ``announce``, also NOTIFY every process listening on the database
    (``CHANNEL``): PostgreSQL delivers it when the open transaction commits,
    at once outside one. A process whose listener is down, or that has none
    (behind a transaction pooler without ``DATABASE_DIRECT_URL``), learns
    through Redis or the TTL.
    """
    get_cache().clear()
    _workers.bump()
    _sync.bump()
    if announce:
        _announce()


def _announce() -> None:
    try:
        # In a savepoint: a failure must not doom the caller's transaction.
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SELECT pg_notify(%s, '')", [CHANNEL])
    except Exception as exc:
        logger.warning(
            "auth cache: could not tell other processes; they see the change within the TTL",
            extra={"ttl_s": settings.AUTH_CACHE_TTL_SECONDS, **describe_exception(exc)},
        )


def reset() -> None:
    """Drop the cache and the Redis client (tests, settings changes)."""
    global _cache, _sync, _workers
    _cache = None
    _sync.stop()  # its thread, if any, polls no more
    _sync = _PeerSync()
    _workers = _WorkerSync()
