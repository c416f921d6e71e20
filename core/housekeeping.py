"""Periodic clean-ups that apps register, run by the maintenance thread.

The maintenance thread (``memories/jobs.py``) runs every ``MAINTENANCE_SECONDS``
in each process that runs workers. An app whose tables hold rows that outlive
their use registers a clean-up here from its ``ready()``, so the thread runs it
without importing the app. Each clean-up returns how many rows of each kind it
deleted, and must be safe to run in several processes at once.
"""

from __future__ import annotations

from collections.abc import Callable

from core import pooling

CleanUp = Callable[[], dict[str, int]]

_registered: dict[str, CleanUp] = {}


def register(name: str, clean_up: CleanUp) -> None:
    """Run ``clean_up`` with every maintenance pass, named ``name`` in logs."""
    _registered[name] = clean_up


def registered() -> list[tuple[str, CleanUp]]:
    return list(_registered.items())


# One process at a time across the fleet: two deleting the same rows would only
# wait on each other.
_LOCK = 0x7265_6361_686B


def run() -> dict[str, dict[str, int]] | None:
    """Run every registered clean-up, in turn; what each deleted, or None, doing
    nothing, while another process runs them."""
    with pooling.advisory_lock(_LOCK, wait=False) as locked:
        if not locked:
            return None
        return {name: clean_up() for name, clean_up in registered()}
