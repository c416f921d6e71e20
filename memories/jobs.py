"""Background work: the workers that run queued adds, and the periodic clean-up.

The queue is the ``memory_jobs`` table (``memories.models.Job``);
``services.enqueue_remember`` puts jobs there and ``services.run_next_job``
takes one with ``FOR UPDATE SKIP LOCKED``, so any number of workers, in any
number of processes, each take a different job and never wait for one
another. Nothing else is needed: no broker, no new service.

``Workers`` runs in ``recall serve`` (in process, started by the ASGI
lifespan) and alone in ``recall worker``. Each worker thread:

* takes the next due job and runs it, until none is due: adds before
  imports, one import of a user at a time, and with two or more workers the
  first takes no import, so a user's uploads never hold every worker;
* then sleeps until woken: by an enqueue in this process at once, by any
  other process through PostgreSQL's ``NOTIFY recall_jobs`` (one listening
  connection per process), or after ``JOB_POLL_SECONDS`` whatever happens,
  which also picks up jobs whose worker died (their lease ran out).

The same listening connection hears two more channels: clears of the query
cache (``health.CACHE_CHANNEL``) and of the key cache (``keycache.CHANNEL``:
a revocation or a tier change made by any process, the CLI's included).

A heartbeat thread extends the leases of the jobs this process's workers are
running, three times a lease (``queue.extend_leases``), so a slow job, one
embedding request after another, stays with the worker that is still
running it; only a dead worker's job runs out of lease, or one whose run has
hung past ``JOB_MAX_RUN_SECONDS``. Should one run out while its run goes on,
the queue keeps the job's writes to one run (``services/queue.py``).

One thread also runs ``maintenance.clean_up()`` every ``MAINTENANCE_SECONDS``:
expired memories, history past its retention, finished jobs and stale
forget confirmations; then the clean-ups other apps register
(``core/housekeeping.py``: OAuth's expired codes and tokens). A PostgreSQL
advisory lock keeps each to one process at a time across the fleet. Between
those runs it asks every ``EXPIRY_SECONDS`` whether a memory that replaced
another has expired, and purges at once if one has, so that the older value
is current again within seconds, not a minute.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from typing import Any

from django.conf import settings
from django.db import close_old_connections, connection

from accounts import keycache
from core import errors, housekeeping, outage
from core.logging import describe_exception
from memories.services import maintenance, queue
from memories.services.health import CACHE_CHANNEL, clear_broadcast
from memories.services.queue import CHANNEL

logger = logging.getLogger(__name__)

MAINTENANCE_SECONDS = 60.0
EXPIRY_SECONDS = 2.0


class Workers:
    def __init__(self, threads: int | None = None, *, maintenance: bool = True) -> None:
        self.threads = settings.JOB_WORKERS if threads is None else threads
        self.maintenance = maintenance
        self._stopping = threading.Event()
        self._running: list[threading.Thread] = []
        self._listener: _Listener | None = None
        # Set once the workers have stopped: the heartbeat outlives them, so
        # that a job finished during stop() keeps its lease to the end.
        self._quiet = threading.Event()
        self._heartbeat: threading.Thread | None = None
        self._quick_failure_said = float("-inf")

    def start(self) -> Workers:
        if self.threads < 1 and not self.maintenance:
            return self
        self._stopping.clear()
        self._quiet.clear()
        # Every serving process listens, with job workers or none: the
        # channel also carries the caches' clears.
        self._listener = _Listener(self._stopping)
        self._spawn(self._listener.run, "job-listener")
        if self.threads:
            self._heartbeat = threading.Thread(target=self._beat, name="job-heartbeat", daemon=True)
            self._heartbeat.start()
        for n in range(self.threads):
            # With two or more, the first never takes an import: uploads
            # (minutes each) cannot hold every worker while adds wait.
            imports = n > 0 or self.threads == 1
            self._spawn(functools.partial(self._work, imports), f"job-worker-{n + 1}")
        if self.maintenance:
            self._spawn(self._maintain, "maintenance")
        logger.info("workers started", extra={"threads": self.threads})
        return self

    def _spawn(self, target: Any, name: str) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        self._running.append(thread)

    def stop(self, timeout: float = 30.0) -> None:
        """Finish the jobs in hand, then stop. A job still running is left to its lease."""
        self._stopping.set()  # an import running hands itself back after its batch
        queue.waiting.set()
        deadline = time.monotonic() + timeout
        for thread in self._running:
            thread.join(max(0.0, deadline - time.monotonic()))
        self._running = []
        self._quiet.set()
        if self._heartbeat is not None:
            self._heartbeat.join(max(0.0, deadline - time.monotonic()))
            self._heartbeat = None

    def wait(self) -> None:
        """Block until ``stop()`` is called (from a signal handler, say)."""
        while not self._stopping.wait(1.0):
            pass

    # threads -------------------------------------------------------------------

    def _work(self, imports: bool = True) -> None:
        while not self._stopping.is_set():
            ran = False
            try:
                close_old_connections()
                ran = queue.run_next_job(imports=imports, stop=self._stopping)
            except Exception as exc:
                # The job itself is settled by run_next_job; this is the queue
                # (the database) failing. Back off and try again.
                _trouble("job workers", exc)
                self._stopping.wait(settings.JOB_POLL_SECONDS)
            else:
                outage.recovered("job workers")
            if ran:
                continue
            queue.waiting.wait(settings.JOB_POLL_SECONDS)
            queue.waiting.clear()
        _close_connection()

    def _beat(self) -> None:
        # A third of a lease: a beat missed (a slow statement, a short outage)
        # leaves two more before the lease runs out.
        while not self._quiet.wait(settings.JOB_LEASE_SECONDS / 3):
            try:
                close_old_connections()
                queue.extend_leases()
            except Exception as exc:
                _trouble("job heartbeat", exc)
            else:
                outage.recovered("job heartbeat")
        _close_connection()

    def _maintain(self) -> None:
        due = time.monotonic() + MAINTENANCE_SECONDS
        while not self._stopping.wait(min(EXPIRY_SECONDS, MAINTENANCE_SECONDS)):
            if time.monotonic() < due:
                self._clean_memories(quick=True)
                continue
            due = time.monotonic() + MAINTENANCE_SECONDS
            self._clean_memories()
            # Apart: a failure of one clean-up must not stop the other's.
            self._housekeep()
        _close_connection()

    def _clean_memories(self, *, quick: bool = False) -> None:
        """The minute's clean-up; ``quick``, only the purge of an expired replacement."""
        try:
            close_old_connections()
            if quick:
                freed = maintenance.free_expired_replacements()
                done = maintenance.CleanUp(expired_memories=freed) if freed else None
            else:
                done = maintenance.clean_up()
        except Exception as exc:
            if quick and not errors.database_away(exc):
                # Asked every 2 s: a failure that lasts is said once a minute.
                now = time.monotonic()
                if now >= self._quick_failure_said + MAINTENANCE_SECONDS:
                    self._quick_failure_said = now
                    logger.warning("maintenance: quick purge failed", extra=describe_exception(exc))
                return
            _trouble("maintenance", exc)
            return
        outage.recovered("maintenance")
        if done is not None and any(done.as_dict().values()):
            logger.info("maintenance", extra=done.as_dict())

    def _housekeep(self) -> None:
        try:
            kept = housekeeping.run()
        except Exception as exc:
            _trouble("housekeeping", exc)
            return
        outage.recovered("housekeeping")
        for name, deleted in (kept or {}).items():
            if any(deleted.values()):
                logger.info("maintenance: %s", name, extra=deleted)


class _Listener:
    """One connection per process that LISTENs for enqueues and cache clears by others."""

    def __init__(self, stopping: threading.Event) -> None:
        self._stopping = stopping

    def run(self) -> None:
        from core import pooling

        if pooling.direct_params() is None:
            # Behind a transaction pooler LISTEN needs DATABASE_DIRECT_URL;
            # without it the workers find others' jobs by polling.
            logger.info(
                "job listener: off behind a transaction pooler without DATABASE_DIRECT_URL",
                extra={"poll_seconds": settings.JOB_POLL_SECONDS},
            )
            return
        while not self._stopping.is_set():
            try:
                self._listen()
            except Exception as exc:
                logger.debug("job listener: reconnecting", extra=describe_exception(exc))
                self._stopping.wait(settings.JOB_POLL_SECONDS)

    def _listen(self) -> None:
        import psycopg

        from core import pooling

        close_old_connections()
        params = pooling.direct_params() or {}
        _close_connection()
        with psycopg.connect(**params, autocommit=True) as conn:
            conn.execute(f"LISTEN {CHANNEL}")
            conn.execute(f"LISTEN {CACHE_CHANNEL}")
            conn.execute(f"LISTEN {keycache.CHANNEL}")
            # A change missed while this listener was away.
            keycache.get_cache().clear()
            while not self._stopping.is_set():
                for note in conn.notifies(timeout=1.0, stop_after=1):
                    if note.channel == keycache.CHANNEL:
                        keycache.get_cache().clear()
                    elif note.channel == CACHE_CHANNEL:
                        clear_broadcast(note.payload)
                    else:
                        queue.waiting.set()


def _trouble(place: str, exc: Exception) -> None:
    """Log a failure: once per outage when the database is down, else each time."""
    if errors.database_away(exc):
        outage.note(place, exc)
    else:
        logger.error(
            "background work failed; will retry", extra={"place": place, **describe_exception(exc)}
        )


def _close_connection() -> None:
    try:
        connection.close()
    except Exception as exc:
        logger.debug("closing a worker's connection failed", extra=describe_exception(exc))
