"""How many server processes share this machine: ``recall serve --workers N``.

One process runs Python on one core at a time (the GIL), so a machine with
more cores serves more with more processes. uvicorn's supervisor starts N
workers that accept on the same socket and restarts any that dies. What they
must agree on, they share:

* the start-up, done once by the parent before the workers start
  (``recall.startup.prepare``: migrations, the HNSW index, the first user),
  and what they share, set up by the parent (``recall.cli.shared_by_workers``);
* rate limits and auth-cache invalidation, through memory shared by the
  workers (``core/sharedstate.py``), or through Redis when ``REDIS_URL``
  is set, exactly as one process would have them;
* the embedded PostgreSQL, which the parent watches and restarts if it dies
  (a worker does not: N watchers would race to restart it);
* the cores: each worker's embedding model gets its share of them
  (``embedding_threads``), so N model runs at once never oversubscribe the
  machine.

Usage events are each worker's own: every worker writes its events and
flushes them when it stops, as a single process does.
"""

from __future__ import annotations

import os

from core import sharedstate

# How many workers this server runs, as the parent tells its workers.
COUNT_ENV = "RECALL_WORKER_COUNT"


def cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def default_count(available: int | None = None) -> int:
    """Return ``recall serve``'s worker count when none is given: one per core.

    Since the result cache, a repeated search costs PostgreSQL under 1 ms of
    CPU and the worker's Python 2 to 4 ms: one process's interpreter is the
    limit. On two cores two workers served 1.9 times the cached recalls of
    one, and 1.2 times the new ones, at no more CPU per call (BENCHMARKS.md,
    "Two workers with the result cache"). Before the cache, each search kept
    a PostgreSQL backend about as busy as its worker, and one worker per two
    cores did best.
    """
    return max(1, cores() if available is None else available)


def is_worker() -> bool:
    """Return whether this process is one of several workers (not a lone server)."""
    return bool(os.environ.get(sharedstate.ENV))


def count() -> int:
    """Return how many workers serve alongside this process (1 for a lone server)."""
    try:
        return max(1, int(os.environ.get(COUNT_ENV, "1")))
    except ValueError:
        return 1
