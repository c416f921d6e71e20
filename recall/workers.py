"""Several server processes on one port: ``recall serve --workers N``.

One process runs Python on one core at a time (the GIL), so a machine with
more cores serves more with more processes. uvicorn's supervisor starts N
workers that accept on the same socket and restarts any that dies. What they
must agree on, they share:

* the start-up, done once by the parent before the workers start
  (``recall.startup.prepare``: migrations, the HNSW index, the first user);
* rate limits and auth-cache invalidation, through memory shared by the
  workers (``recall/sharedstate.py``), or through Redis when ``REDIS_URL``
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

import contextlib
import logging
import os
from collections.abc import Iterator
from pathlib import Path

from recall import sharedstate

logger = logging.getLogger("recall.startup")

# How many workers this server runs, as the parent tells its workers.
COUNT_ENV = "RECALL_WORKER_COUNT"


def cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def is_worker() -> bool:
    """Return whether this process is one of several workers (not a lone server)."""
    return bool(os.environ.get(sharedstate.ENV))


def count() -> int:
    """Return how many workers serve alongside this process (1 for a lone server)."""
    try:
        return max(1, int(os.environ.get(COUNT_ENV, "1")))
    except ValueError:
        return 1


@contextlib.contextmanager
def shared(workers: int) -> Iterator[None]:
    """Set up what ``workers`` processes share, for as long as they run; nothing for one."""
    if workers <= 1:
        yield
        return
    from django.conf import settings
    from django.db import connections

    from recall.db import embedded

    state = sharedstate.SharedState.create()
    os.environ[sharedstate.ENV] = str(state.path)
    os.environ[COUNT_ENV] = str(workers)
    supervisor = None
    if settings.EMBEDDED_DATABASE:
        supervisor = embedded.Supervisor(Path(settings.RECALL_DATA_DIR)).start()
    # The parent only supervises from here on: no connection of its own.
    connections.close_all()
    try:
        yield
    finally:
        if supervisor is not None:
            supervisor.stop()
        if settings.EMBEDDED_DATABASE:
            # The workers have stopped; the embedded server stops with the
            # parent, its last user (see embedded.forget_exited).
            embedded.forget_exited(Path(settings.RECALL_DATA_DIR))
        os.environ.pop(sharedstate.ENV, None)
        os.environ.pop(COUNT_ENV, None)
        state.remove()
