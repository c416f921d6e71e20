"""Usage events, recorded without ever slowing or failing a tool call.

``record()`` puts the event on a bounded in-process queue and returns at once.
A writer thread drains the queue in batches and inserts each user's events
inside that user's tenant transaction (``billing.services.save_usage_events``),
so the ``usage_events`` row-level security policies apply to the writer
exactly as to everyone else.
``flush()`` drains what is queued; the server calls it at shutdown.

A database outage loses nothing up to a bound. Events whose write failed
because the database was unreachable are held, in order, in a buffer of
``USAGE_BUFFER_EVENTS`` (default 100,000) and written again, with backoff
from 1 to 30 seconds, until the database answers. Each event carries an id
chosen here, unique in the table, so an event whose first write did commit
(the connection died before the answer) is not stored twice. Only when the
buffer is full, or the queue in front of it is (the writer is stuck), is an
event dropped: counted in ``stats()`` (shown by ``/ready``) and logged.

The same thread also writes API keys' ``last_used_at``: calls note the time
in memory, and the writer hands the latest of each key to
``accounts.services.record_key_use``. A key this process has not written in
the last ``LAST_USED_INTERVAL`` seconds is written at the next tick (within
about half a second), so a key's first call shows on the dashboard at once;
after that its time is written at most once per interval, so a busy key costs
one UPDATE every 30 seconds, not one per call.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import uuid
from collections import defaultdict, deque
from collections.abc import Callable
from datetime import UTC, datetime

from django.conf import settings
from django.db import close_old_connections, connection

from core import errors, outage
from core.usage import Event

logger = logging.getLogger(__name__)

QUEUE_SIZE = 10_000
BATCH_SIZE = 500
FLUSH_INTERVAL = 0.5  # seconds between idle checks for last_used_at and shutdown
LAST_USED_INTERVAL = 30.0  # seconds between two last_used_at writes of one key
# Seconds a woken writer waits for more events before it writes. A write
# costs the same round trips (health check, BEGIN with the role switch,
# INSERT, COMMIT) and the same commit for one event as for hundreds.
# Measured at about 60 tool calls a second (bench/http.py --profile): 3.7
# events per write without the wait, 4.4 with 0.05 s. A quarter of a second
# wrote a sequential client's calls about twenty at a time, but saved no CPU
# that could be measured (BENCHMARKS.md, "Efficiency: the cached recall's
# path") and kept each event out of the table, and at risk in memory, five
# times longer; so the wait stays short.
LINGER = 0.05
# Seconds between attempts to write held events while the database is down.
RETRY_MIN = 1.0
RETRY_MAX = 30.0
# A refused batch written again one event at a time stops after this many
# refusals in a row: the cause is then the batch's, not one event's.
REFUSED_IN_A_ROW = 3


class UsageRecorder:
    def __init__(
        self,
        maxsize: int = QUEUE_SIZE,
        held_max: int | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._clock = clock  # times last_used_at writes
        self._queue: queue.Queue[Event] = queue.Queue(maxsize=maxsize)
        # Events whose write met an outage, oldest first; only the writer thread touches it.
        self._held: deque[Event] = deque()
        self._held_max = settings.USAGE_BUFFER_EVENTS if held_max is None else held_max
        self._retry_at = 0.0
        self._retry_delay = RETRY_MIN
        # Times of calls not yet written, and when this process last wrote each key.
        self._last_used: dict[uuid.UUID, datetime] = {}
        self._last_used_written: dict[uuid.UUID, float] = {}
        self._last_used_lock = threading.Lock()
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

    def stats(self) -> dict[str, int]:
        """Events waiting to be written, held through an outage, and dropped since start."""
        return {
            "queued": self._queue.qsize(),
            "held": len(self._held),
            "dropped": self.dropped,
        }

    def touch_key(self, api_key_id: uuid.UUID) -> None:
        with self._last_used_lock:
            self._last_used[api_key_id] = datetime.now(UTC)

    # lifecycle -----------------------------------------------------------

    def flush(self, timeout: float = 10.0) -> bool:
        """Write everything queued so far; return False if it did not finish in time.

        Events held through an outage count as not finished.
        """
        deadline = time.monotonic() + timeout
        self._ensure_started()
        self._retry_at = 0.0
        self._wake.set()
        while (self._queue.unfinished_tasks or self._held) and time.monotonic() < deadline:
            time.sleep(0.01)
            if self._held and self._retry_at:
                break  # a retry failed: the database is still down
        self._write_last_used(force=True)
        return not self._queue.unfinished_tasks and not self._held

    def stop(self, timeout: float = 10.0) -> None:
        self.flush(timeout)
        self._stopping = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        self._stopping = False
        if self._held:
            self.dropped += len(self._held)
            logger.error(
                "usage events lost at shutdown: the database was unavailable",
                extra={"count": len(self._held)},
            )
            self._held.clear()

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
            if self._held and time.monotonic() >= self._retry_at:
                self._retry_held()
            while True:
                batch = self._take(BATCH_SIZE)
                if not batch:
                    break
                try:
                    if self._held:
                        # Still down: keep the order, and wait for the next retry.
                        self._hold(batch)
                    else:
                        self._hold(self._write(batch))
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

    def _retry_held(self) -> None:
        while self._held and not self._stopping:
            batch = [self._held.popleft() for _ in range(min(BATCH_SIZE, len(self._held)))]
            failed = self._write(batch)
            if failed:
                self._held.extendleft(reversed(failed))
                self._retry_at = time.monotonic() + self._retry_delay
                self._retry_delay = min(self._retry_delay * 2, RETRY_MAX)
                return
        self._retry_at = 0.0
        self._retry_delay = RETRY_MIN

    def _hold(self, events: list[Event]) -> None:
        room = self._held_max - len(self._held)
        if len(events) > room:
            lost = len(events) - max(room, 0)
            self.dropped += lost
            logger.error(
                "usage events dropped: the outage buffer is full",
                extra={"count": lost, "held": len(self._held)},
            )
            events = events[: max(room, 0)]
        if events and not self._held:
            self._retry_at = time.monotonic() + self._retry_delay
        self._held.extend(events)

    def _write(self, batch: list[Event]) -> list[Event]:
        """Insert the batch; return the events to try again later (their write met an outage)."""
        by_user: dict[uuid.UUID, list[Event]] = defaultdict(list)
        for event in batch:
            by_user[event.user_id].append(event)
        retry: list[Event] = []
        for user_id, events in by_user.items():
            retry.extend(self._write_user(user_id, events))
        return retry

    def _write_user(self, user_id: uuid.UUID, events: list[Event]) -> list[Event]:
        """Insert one user's events; return those to try again later (an outage).

        A batch the database refuses for another reason is written again one
        event at a time (``_write_each``), so that only the events at fault
        are lost.
        """
        from billing import services

        try:
            close_old_connections()
            services.save_usage_events(user_id=user_id, events=events)
        except Exception as exc:
            if errors.is_outage(exc):
                outage.note("usage events", exc)
                return events
            if len(events) > 1:
                return self._write_each(user_id, events)
            self._lose(events, exc)
            return []
        outage.recovered("usage events")
        return []

    def _write_each(self, user_id: uuid.UUID, events: list[Event]) -> list[Event]:
        """Write a refused batch one event at a time; return those to try again later.

        After ``REFUSED_IN_A_ROW`` refusals in a row the cause is the batch's
        (its user deleted, say), not one event's, and the rest are lost with
        them rather than tried one by one.
        """
        from billing import services

        lost: list[Event] = []
        refusal: Exception | None = None
        in_a_row = 0
        for at, event in enumerate(events):
            if in_a_row >= REFUSED_IN_A_ROW:
                lost.extend(events[at:])
                break
            try:
                services.save_usage_events(user_id=user_id, events=[event])
            except Exception as exc:
                if errors.is_outage(exc):
                    outage.note("usage events", exc)
                    self._lose(lost, refusal)
                    return events[at:]
                lost.append(event)
                refusal = exc
                in_a_row += 1
            else:
                in_a_row = 0
        self._lose(lost, refusal)
        return []

    def _lose(self, events: list[Event], error: Exception | None) -> None:
        """Count and log, once, events the database refused."""
        if not events:
            return
        self.dropped += len(events)
        logger.error(
            "usage events dropped: write failed",
            exc_info=error,
            extra={"count": len(events), "request_ids": [e.request_id for e in events[:20]]},
        )

    def _write_last_used(self, *, force: bool) -> None:
        """Write the keys that are due (all of them with ``force``)."""
        now = self._clock()
        with self._last_used_lock:
            # A key missing here was not written within the interval: it is due.
            written = {
                key_id: at
                for key_id, at in self._last_used_written.items()
                if now - at < LAST_USED_INTERVAL
            }
            pending = {
                key_id: when
                for key_id, when in self._last_used.items()
                if force or key_id not in written
            }
            for key_id in pending:
                del self._last_used[key_id]
                written[key_id] = now
            self._last_used_written = written
        if not pending:
            return
        from accounts import services

        try:
            close_old_connections()
            services.record_key_use(pending)
        except Exception as exc:
            if not errors.is_outage(exc):
                logger.warning("last_used_at update failed", exc_info=True)
                return
            # Keep the times for the next write; newer calls win.
            with self._last_used_lock:
                for key_id, when in pending.items():
                    self._last_used[key_id] = max(when, self._last_used.get(key_id, when))


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
