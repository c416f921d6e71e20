"""Database outages, logged as they start and end rather than once per request.

During an outage every request that needs the database fails the same way;
logging each one would bury the log (one busy key once wrote 18,475 lines).
``note()`` logs a warning when a place first meets the outage and then at
most every ``INTERVAL`` seconds with how many more it met; ``recovered()``
logs the end, with its length.

A database whose connections keep dropping (a backend killed every few
hundred milliseconds) makes a run of short outages, each over by the next
request: logged one by one, that was two lines a request again. An outage
that starts within ``INTERVAL`` of the end of a place's last logged one is
counted, not logged, unless it lasts until a reminder is due; the place's
next logged line says how many there were (``outages_since_last_log``).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

from core.logging import describe_exception

logger = logging.getLogger("recall.outage")

INTERVAL = 30.0  # seconds between reminders while an outage lasts


@dataclass
class _Outage:
    started: float  # monotonic
    logged: float  # when its last line was logged (or when it began, unlogged)
    unlogged: int = 0  # failures since that line
    told: bool = False  # whether any line of it was logged


_lock = threading.Lock()
_open: dict[str, _Outage] = {}
# place -> (when its last logged outage ended, outages counted since, unlogged)
_quiet: dict[str, tuple[float, int]] = {}


def note(place: str, exc: BaseException) -> None:
    """Record that ``place`` met a database outage; log it if it is new or a reminder is due."""
    now = time.monotonic()
    with _lock:
        outage = _open.get(place)
        if outage is None:
            ended, flaps = _quiet.get(place, (-INTERVAL, 0))
            outage = _open[place] = _Outage(now, now)
            if now - ended < INTERVAL:  # soon after the last: counted, not logged
                _quiet[place] = (ended, flaps + 1)
                return
            due, new = True, True
        else:
            due, new = now - outage.logged >= INTERVAL, not outage.told
        if not due:
            outage.unlogged += 1
            return
        unlogged, outage.unlogged, outage.logged, outage.told = outage.unlogged, 0, now, True
        _, flaps = _quiet.pop(place, (0.0, 0))
    logger.warning(
        "database unavailable" if new else "database still unavailable",
        extra={
            "place": place,
            "down_s": round(now - outage.started, 1),
            "failures_since_last_log": unlogged,
            "outages_since_last_log": flaps,
            **describe_exception(exc),
        },
    )


def recovered(place: str) -> None:
    """Record that ``place`` reached the database again; log the end of its outage, if any
    line of it was logged."""
    if place not in _open:  # the common case, without the lock
        return
    now = time.monotonic()
    with _lock:
        outage = _open.pop(place, None)
        if outage is None:
            return
        if outage.told:
            _quiet[place] = (now, 0)
    if outage.told:
        logger.warning(
            "database available again",
            extra={"place": place, "down_s": round(now - outage.started, 1)},
        )


def is_open(place: str) -> bool:
    return place in _open
