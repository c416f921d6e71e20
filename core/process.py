"""Facts about this server process: its version, how long it has run, its memory."""

from __future__ import annotations

import os
import resource
import time
from functools import cache
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as package_version
from typing import Any

_STARTED = time.monotonic()


@cache
def version() -> str:
    try:
        return package_version("recall")
    except PackageNotFoundError:
        return "0.0.0"


def uptime_seconds() -> float:
    return time.monotonic() - _STARTED


def rss_bytes() -> int:
    """Return the resident set size now (Linux), or the peak where /proc is missing."""
    try:
        with open("/proc/self/statm", encoding="ascii") as statm:
            pages = int(statm.read().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


# The thread limiter tool calls run under (anyio's default), noted by the MCP
# middleware on each call: reading its counters needs no event loop.
_limiter: Any = None


def observe_limiter(limiter: Any) -> None:
    global _limiter
    _limiter = limiter


def worker_pool() -> dict[str, int]:
    """Return the tool-call threads in use, free, and calls waiting for one."""
    if _limiter is None:
        return {"active": 0, "idle": 0, "waiting": 0}
    active = int(_limiter.borrowed_tokens)
    return {
        "active": active,
        "idle": max(0, int(_limiter.total_tokens) - active),
        "waiting": int(_limiter.statistics().tasks_waiting),
    }
