"""Database work asked for from async code: in a worker thread, on connections of its own.

Django's connections belong to threads, and a thread anyio lends keeps what
it opened: each call here closes stale connections before the work and its
own after, as a request's signals would.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import TypeVar

import anyio
from django.db import close_old_connections

A = TypeVar("A")
T = TypeVar("T")


async def run(work: Callable[[A], T], argument: A) -> T:
    """``work(argument)``, off the event loop."""
    return await anyio.to_thread.run_sync(partial(_with_fresh_connections, work, argument))


def _with_fresh_connections(work: Callable[[A], T], argument: A) -> T:
    close_old_connections()
    try:
        return work(argument)
    finally:
        close_old_connections()
