"""What a caller holds and how the server serves it: stats, the query cache, health."""

from __future__ import annotations

import logging
import time
import uuid

from django.conf import settings
from django.db import connection
from django.db.models import Count, Max, Min, Q

from core import process, tenancy
from core.logging import describe_exception
from core.timestamps import iso
from memories import embeddings, results, validation
from memories.embeddings import cache as query_cache
from memories.embeddings.failures import outcomes
from memories.models import (
    Job,
    JobStatus,
    Memory,
    MemoryHistory,
)
from memories.services.queue import queue_depth
from memories.services.shapes import (
    CacheStats,
    DatabaseHealth,
    EmbedderHealth,
    Health,
    Optimized,
    QueueDepth,
)

logger = logging.getLogger("memories.services")


def memory_stats(
    *,
    user_id: uuid.UUID | str,
    agent_id: uuid.UUID | str | None = None,
    api_key_id: uuid.UUID | str | None = None,
) -> dict[str, object]:
    """Return what the caller holds and how the server serves them.

    Memories per namespace with the oldest and newest, history rows, the
    caller's background adds by status, the query cache's counters (this
    process's), and the caller's own p50/p95 over its latest 1,000 calls
    (from usage events, which land a moment after each call).
    """
    from billing.services import figures

    with tenancy.tenant(user_id, agent_id=agent_id):
        namespaces = list(
            Memory.objects.live()
            .filter(user_id=user_id)
            .values("namespace")
            .annotate(
                count=Count("id"),
                replaced=Count("id", filter=Q(superseded_by__isnull=False)),
                oldest=Min("created_at"),
                newest=Max("created_at"),
            )
            .order_by("namespace")
        )
        history_rows = MemoryHistory.objects.filter(user_id=user_id).count()
        by_status = dict(
            Job.objects.filter(user_id=user_id)
            .values_list("status")
            .annotate(n=Count("id"))
            .values_list("status", "n")
        )
    latency = figures.recent_latency(user_id=user_id, agent_id=agent_id, api_key_id=api_key_id)
    return {
        "memories": sum(row["count"] for row in namespaces),
        # Replaced by a later memory (issue 22): kept, counted in memories too.
        "superseded": sum(row["replaced"] for row in namespaces),
        "namespaces": [
            {
                "namespace": row["namespace"],
                "count": row["count"],
                "superseded": row["replaced"],
                "oldest": iso(row["oldest"]),
                "newest": iso(row["newest"]),
            }
            for row in namespaces
        ],
        "history_rows": history_rows,
        "jobs": {status.value: by_status.get(status.value, 0) for status in JobStatus},
        "cache": cache_stats(user_id=user_id, agent_id=agent_id),
        "latency": {
            "calls": latency.calls,
            "p50_ms": latency.p50_ms,
            "p95_ms": latency.p95_ms,
        },
    }


def cache_stats(*, user_id: uuid.UUID | str, agent_id: uuid.UUID | str | None = None) -> CacheStats:
    """Return the caller's share of the query cache in this process: its entries, its lookups."""
    stats = embeddings.get_query_cache().stats(query_cache.scope(user_id, agent_id))
    return {
        "hits": stats.hits,
        "shared_hits": stats.shared_hits,
        "misses": stats.misses,
        "hit_rate": round(stats.hit_rate, 4) if stats.hit_rate is not None else None,
        "size": stats.size,
        "max_size": stats.max_size,
        "ttl_seconds": stats.ttl_seconds,
        "bytes": stats.bytes,
        "evictions": stats.evictions,
        "expirations": stats.expirations,
        "avg_hit_ms": _ms(stats.avg_hit_ms),
        "avg_miss_ms": _ms(stats.avg_miss_ms),
        "avg_ms": _ms(stats.avg_ms),
        "shared": stats.shared,
        "shared_available": stats.shared_available,
    }


def optimize_cache(
    *,
    user_id: uuid.UUID | str,
    agent_id: uuid.UUID | str | None = None,
    force_refresh: object = False,
    max_entries: object = None,
) -> Optimized:
    """Expire, demote and share the caller's query cache entries, and report what was done.

    Only the caller's own entries are touched. ``force_refresh`` drops them
    here, in Redis, and in every other server process listening on the
    database (``broadcast_cache_clear``), with the caller's cached search
    answers (``memories/results.py``; their bytes count in ``bytes_freed``).
    """
    refresh = validation.flag(force_refresh, field="force_refresh")
    size = settings.QUERY_CACHE_SIZE
    keep = validation.integer(
        max_entries, field="max_memories", low=0, high=max(size, 0), default=size
    )
    scope = query_cache.scope(user_id, agent_id)
    done = embeddings.get_query_cache().optimize(
        scope=scope,
        model_id=embeddings.get_embedder().model_id,
        max_entries=keep,
        force_refresh=refresh,
    )
    freed = 0
    if refresh:
        # The caller's cached search answers go too (their bytes counted in bytes_freed;
        # refreshed stays the query vectors'): nothing it asks is answered from a cache.
        _, freed = results.clear(scope, exact=True)
        broadcast_cache_clear(scope, exact=True)
    return {
        "expired": done.expired,
        "demoted": done.demoted,
        "promoted": done.promoted,
        "refreshed": done.refreshed,
        "kept": done.kept,
        "bytes_freed": done.bytes_freed + freed,
        "seconds": round(done.seconds, 4),
    }


# Every process's listener (memories/jobs.py) LISTENs here too: the payload
# is a scope ("=u<user>[.a<agent>]" for that scope alone, "u<user>" for a
# user and its agents) or "*" for all.
CACHE_CHANNEL = "recall_qcache"


def broadcast_cache_clear(scope: str | None, *, exact: bool) -> None:
    """Ask every process listening on the database to drop cached query vectors.

    ``scope`` alone with ``exact``, a user's scope and its agents' without,
    every scope for None. A process whose listener is down keeps its entries
    until their TTL: the cache is an accelerator, and never shows one scope
    another's entries, so a missed broadcast costs freshness, not privacy.
    """
    payload = "*" if scope is None else ("=" if exact else "") + scope
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_notify(%s, %s)", [CACHE_CHANNEL, payload])
    except Exception as exc:
        logger.warning("query cache: could not tell other processes", extra=describe_exception(exc))


def clear_broadcast(payload: str) -> None:
    """Drop what a ``broadcast_cache_clear`` names, in this process (the listener calls it)."""
    if payload == "*":
        embeddings.get_query_cache().clear()
        results.clear()
    elif payload.startswith("="):
        embeddings.get_query_cache().clear(payload[1:], exact=True)
        results.clear(payload[1:], exact=True)
    elif payload:
        embeddings.get_query_cache().clear(payload)
        results.clear(payload)


def clear_query_cache(*, user_id: uuid.UUID | str | None = None) -> int:
    """Drop cached query vectors of one user and its agents, or of everyone (operators only).

    Clears this process and Redis, and tells every server process listening
    on the database to clear its own; returns what this process and Redis
    held.
    """
    scope = None if user_id is None else query_cache.scope(user_id)
    removed = embeddings.get_query_cache().clear(scope, shared=True)
    results.clear(scope)
    broadcast_cache_clear(scope, exact=False)
    return removed


def worker_pool() -> dict[str, int]:
    """Return how busy the threads that run tool calls (each with its connection) are."""
    return process.worker_pool()


def _ms(value: float | None) -> float | None:
    return round(value, 3) if value is not None else None


def health(*, user_id: uuid.UUID | str, agent_id: uuid.UUID | str | None = None) -> Health:
    """Check the database, the embedder, the queue and Redis; report no secrets.

    The query cache's figures are the caller's own entries and lookups.
    """
    started = time.perf_counter()
    database: DatabaseHealth = {"ok": True}
    queue: QueueDepth | None = None
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        database["latency_ms"] = round((time.perf_counter() - started) * 1000, 2)
        queue = queue_depth(user_id, agent_id)
    except Exception as exc:
        logger.warning("health: database unavailable", extra=describe_exception(exc))
        database = {"ok": False, "error": "the database did not answer"}
    embedder = embeddings.get_embedder()
    cached = embeddings.get_query_cache()
    scope = query_cache.scope(user_id, agent_id)
    stats = cached.stats(scope)
    redis = _redis_health()
    model: EmbedderHealth = {"ok": embedder.is_loaded, "model": embedder.model_id}
    failing = outcomes.failing_for()
    if failing is not None:
        model = {
            **model,
            "ok": False,
            "error": f"the latest embedding call failed {failing:.0f} s ago",
        }
    elif not embedder.is_loaded:
        model = {**model, "error": "the model is not loaded"}
    ok = database["ok"] and model["ok"] and redis is not False
    return {
        "status": "ok" if ok else "degraded",
        "database": database,
        "embedder": model,
        "queue": queue,
        "redis": redis,
        "cache": {
            "size": stats.size,
            "shared_size": cached.shared_size(scope) if redis else None,
            "hit_rate": round(stats.hit_rate, 4) if stats.hit_rate is not None else None,
            "bytes": stats.bytes,
        },
        "version": process.version(),
        "uptime_seconds": round(process.uptime_seconds(), 1),
        "rss_bytes": process.rss_bytes(),
    }


def _redis_health() -> bool | None:
    """True or False when Redis is configured (whether it answers), None when it is not."""
    if not settings.REDIS_URL:
        return None
    import redis

    try:
        with redis.Redis.from_url(
            settings.REDIS_URL, socket_timeout=0.25, socket_connect_timeout=0.25
        ) as client:
            return bool(client.ping())
    except Exception:
        return False
