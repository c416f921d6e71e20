"""Bearer API-key authentication with a bounded, invalidated cache.

``authenticate(raw)`` returns the caller's ``AuthContext`` or None. Found keys
are cached in an LRU keyed by the key's HMAC (the raw key is never kept), for
at most ``AUTH_CACHE_TTL_SECONDS`` (default 300, capped at one hour).

How fast a revocation or tier change takes effect:

* in the process that made it: at once (``invalidate()`` clears the cache);
* in the other workers of the same ``recall serve --workers N``: at once, on
  their next request (``invalidate()`` bumps a counter in their shared memory,
  ``core/sharedstate.py``, which every cached lookup compares);
* in other processes on the same database (another ``recall serve``, or the
  server when ``recall revoke-key`` ran beside it): at once, when the change
  commits. ``invalidate()`` sends a NOTIFY on ``keycache.CHANNEL``, and every
  process's listener (``memories/jobs.py``, one per process running
  background workers) clears its cache;
* in other processes, with Redis configured: within ``AUTH_CACHE_SYNC_SECONDS``
  (default 2) as well. ``invalidate()`` bumps a counter in Redis; every
  process reads the counter at most that often and clears its cache when it
  moved;
* in a process whose listener is down or absent (no background workers, or
  behind a transaction pooler without ``DATABASE_DIRECT_URL``) and that has
  no Redis: within the TTL.

``current`` carries the authenticated caller from the HTTP middleware (or the
stdio runner) to the tools.
"""

from __future__ import annotations

from accounts import keycache, keys, services
from accounts.callers import AuthContext, current
from accounts.keycache import AuthCache, cached, get_cache, invalidate, reset
from core import offloop

__all__ = [
    "AuthCache",
    "AuthContext",
    "authenticate",
    "cached",
    "current",
    "get_cache",
    "invalidate",
    "reset",
]


def authenticate(raw: str) -> AuthContext | None:
    """Return who ``raw`` authenticates, or None for a missing, unknown or revoked key."""
    if not keys.is_well_formed(raw):
        return None
    cache = keycache.synced()
    digest = keys.digest(raw)
    context = cache.get(digest)
    if context is not None:
        return context
    # A revocation that commits while the row is read clears the cache after
    # this read: what was read then is not put back for the TTL.
    since = cache.generation
    key = services.find_live_key(raw=raw)
    if key is None:
        return None
    context = AuthContext(
        user_id=key.user_id, api_key_id=key.id, tier=key.tier, agent_id=key.agent_id
    )
    cache.put(digest, context, since=since)
    return context


async def aauthenticate(raw: str) -> AuthContext | None:
    """``authenticate`` for async callers: from the cache, else from the database off the
    event loop (a thread of its own, whose connection is closed after)."""
    known = cached(raw)
    if known is not None:
        return known
    return await offloop.run(authenticate, raw)
