"""Usage events, recorded without ever slowing or failing a tool call.

``record()`` puts the event on a bounded in-process queue and returns at once.
A writer thread drains the queue in batches and inserts each user's events
inside that user's tenant transaction (``billing.services.save_usage_events``),
so the ``usage_events`` row-level security policies apply to the writer
exactly as to everyone else. If the
queue is full (the database is down or far behind), the event is dropped and
a warning is logged: a tool call is never held up for its own bookkeeping.
``flush()`` drains what is queued; the server calls it at shutdown.

The same thread also writes API keys' ``last_used_at``, batched: calls note
the time in memory and each flush hands the latest of each key to
``accounts.services.record_key_use``.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime

from django.db import close_old_connections, connection

logger = logging.getLogger(__name__)

QUEUE_SIZE = 10_000
BATCH_SIZE = 500
FLUSH_INTERVAL = 0.5  # seconds between idle checks for last_used_at and shutdown
LAST_USED_INTERVAL = 30.0  # seconds between last_used_at writes
# Seconds a woken writer waits for more events before it writes. A write
# costs the same round trips (health check, BEGIN with the role switch,
# INSERT, COMMIT) for one event as for hundreds. Measured at about 60 tool
# calls a second (bench/http.py --profile): 3.7 events per write without the
# wait, 4.4 with it; the gain grows with the call rate.
LINGER = 0.05


@dataclass(frozen=True)
class Event:
    user_id: uuid.UUID
    api_key_id: uuid.UUID | None
    request_id: str
    tool_name: str
    success: bool
    latency_ms: int
    tokens_consumed: int = 1
    error_code: str | None = None
    occurred_at: datetime = field(default_factory=lambda: datetime.now(UTC))


class UsageRecorder:
    def __init__(self, maxsize: int = QUEUE_SIZE) -> None:
        self._queue: queue.Queue[Event] = queue.Queue(maxsize=maxsize)
        self._last_used: dict[uuid.UUID, datetime] = {}
        self._last_used_lock = threading.Lock()
        self._last_used_written = time.monotonic()
        self._wake = threading.Event()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()
        self.dropped = 0

    # called on the request path ------------------------------------------

    def record(self, event: Event) -> None:
        self._ensure_started()
        try:
            self._queue.put_nowait(event)
            # Write soon; whatever queues while a write is in flight joins the next batch.
            self._wake.set()
        except queue.Full:
            self.dropped += 1
            logger.warning(
                "usage event dropped: queue full",
                extra={"request_id": event.request_id, "tool": event.tool_name},
            )

    def touch_key(self, api_key_id: uuid.UUID) -> None:
        with self._last_used_lock:
            self._last_used[api_key_id] = datetime.now(UTC)

    # lifecycle -----------------------------------------------------------

    def flush(self, timeout: float = 10.0) -> bool:
        """Write everything queued so far; return False if it did not finish in time."""
        deadline = time.monotonic() + timeout
        self._ensure_started()
        self._wake.set()
        while self._queue.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.01)
        self._write_last_used(force=True)
        return not self._queue.unfinished_tasks

    def stop(self, timeout: float = 10.0) -> None:
        self.flush(timeout)
        self._stopping = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        self._stopping = False

    def _ensure_started(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            return
        with self._start_lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="usage-recorder", daemon=True
                )
                self._thread.start()

    # writer thread -------------------------------------------------------

    def _run(self) -> None:
        while not self._stopping:
            self._wake.wait(FLUSH_INTERVAL)
            self._wake.clear()
            if self._queue.qsize() < BATCH_SIZE:
                time.sleep(LINGER)
            while True:
                batch = self._take(BATCH_SIZE)
                if not batch:
                    break
                try:
                    self._write(batch)
                finally:
                    for _ in batch:
                        self._queue.task_done()
            self._write_last_used(force=False)
        close_old_connections()
        connection.close()

    def _take(self, limit: int) -> list[Event]:
        batch: list[Event] = []
        while len(batch) < limit:
            try:
                batch.append(self._queue.get_nowait())
            except queue.Empty:
                break
        return batch

    def _write(self, batch: list[Event]) -> None:
        from billing import services

        by_user: dict[uuid.UUID, list[Event]] = defaultdict(list)
        for event in batch:
            by_user[event.user_id].append(event)
        for user_id, events in by_user.items():
            try:
                close_old_connections()
                services.save_usage_events(user_id=user_id, events=events)
            except Exception:
                self.dropped += len(events)
                logger.warning(
                    "usage events dropped: write failed",
                    exc_info=True,
                    extra={"count": len(events), "request_ids": [e.request_id for e in events]},
                )

    def _write_last_used(self, *, force: bool) -> None:
        if not force and time.monotonic() - self._last_used_written < LAST_USED_INTERVAL:
            return
        with self._last_used_lock:
            pending, self._last_used = self._last_used, {}
        self._last_used_written = time.monotonic()
        if not pending:
            return
        from accounts import services

        try:
            close_old_connections()
            services.record_key_use(pending)
        except Exception:
            logger.warning("last_used_at update failed", exc_info=True)


_recorder: UsageRecorder | None = None
_recorder_lock = threading.Lock()


def get_recorder() -> UsageRecorder:
    global _recorder
    if _recorder is None:
        with _recorder_lock:
            if _recorder is None:
                _recorder = UsageRecorder()
    return _recorder


def record(event: Event) -> None:
    get_recorder().record(event)
