"""Database outages, logged as they start and end rather than once per request.

During an outage every request that needs the database fails the same way;
logging each one would bury the log (one busy key once wrote 18,475 lines).
``note()`` logs a warning when a place first meets the outage and then at
most every ``INTERVAL`` seconds with how many more it met; ``recovered()``
logs the end, with its length.
"""

from __future__ import annotations

import logging
import threading
import time

from core.logging import describe_exception

logger = logging.getLogger("recall.outage")

INTERVAL = 30.0  # seconds between reminders while an outage lasts

_lock = threading.Lock()
# place -> (monotonic start, monotonic last log, failures since the last log)
_open: dict[str, tuple[float, float, int]] = {}


def note(place: str, exc: BaseException) -> None:
    """Record that ``place`` met a database outage; log it if it is new or a reminder is due."""
    now = time.monotonic()
    with _lock:
        started, logged, unlogged = _open.get(place, (now, 0.0, 0))
        new = place not in _open
        due = new or now - logged >= INTERVAL
        _open[place] = (started, now if due else logged, 0 if due else unlogged + 1)
    if due:
        logger.warning(
            "database unavailable" if new else "database still unavailable",
            extra={
                "place": place,
                "down_s": round(now - started, 1),
                "failures_since_last_log": unlogged,
                **describe_exception(exc),
            },
        )


def recovered(place: str) -> None:
    """Record that ``place`` reached the database again; log the end of its outage, if any."""
    if place not in _open:  # the common case, without the lock
        return
    with _lock:
        entry = _open.pop(place, None)
    if entry is not None:
        logger.warning(
            "database available again",
            extra={"place": place, "down_s": round(time.monotonic() - entry[0], 1)},
        )


def is_open(place: str) -> bool:
    return place in _open
