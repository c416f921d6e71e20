"""What Recall does differently behind a connection pooler in transaction mode.

``DATABASE_POOL_MODE=transaction`` says that ``DATABASE_URL`` reaches
PostgreSQL through a pooler (PgBouncer, or a managed service's) that lends
each transaction whichever server connection is free, and takes it back at
COMMIT. Whatever a session holds past its transaction would then stay on a
server connection that the next transaction, or another client, gets:

* startup options (``-c hnsw.…``): PgBouncer refuses them, so the search
  settings are set in each search transaction instead (``search_settings``);
* prepared statements and WITH HOLD cursors: off (settings.py);
* session advisory locks: ``advisory_lock`` holds the lock in a transaction
  of a connection of its own, for as long as the block runs;
* LISTEN: only on a session of its own, ``DATABASE_DIRECT_URL``
  (``listen_params``); without one, the job workers poll and other
  processes' cache clears are not heard (the README says what that costs).

In the default ``session`` mode each of these behaves as it always has.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django.conf import settings
from django.db import connection

logger = logging.getLogger(__name__)

# Connection parameters Django adds that a plain psycopg connection should not
# take: its cursor class and adapters are for Django's own cursors.
_DJANGO_ONLY = ("cursor_factory", "context")


def transaction_mode() -> bool:
    return bool(settings.DATABASE_POOL_MODE == "transaction")


def search_settings() -> dict[str, str]:
    """Settings a search transaction sets itself: behind a transaction pooler, the HNSW ones."""
    return dict(settings.HNSW_SESSION_SETTINGS) if transaction_mode() else {}


def _from_url(config: dict[str, Any]) -> dict[str, Any]:
    """psycopg's connection parameters for a database setting parsed from a URL."""
    params: dict[str, Any] = {"dbname": config.get("NAME") or None}
    for key, name in (("USER", "user"), ("PASSWORD", "password"), ("HOST", "host")):
        if config.get(key):
            params[name] = config[key]
    if config.get("PORT"):
        params["port"] = str(config["PORT"])
    params.update(config.get("OPTIONS") or {})
    params.setdefault("connect_timeout", 5)
    for name, value in settings.DATABASE_SOCKET_OPTIONS.items():
        params.setdefault(name, value)
    return {k: v for k, v in params.items() if v is not None}


def _through_default() -> dict[str, Any]:
    params = connection.get_connection_params()
    for name in _DJANGO_ONLY:
        params.pop(name, None)
    params.pop("prepare_threshold", None)
    return params


def direct_params() -> dict[str, Any] | None:
    """Parameters for a session of its own, or None where there is none to have.

    ``DATABASE_DIRECT_URL`` when set; else the default database's own, unless
    they lead to a transaction pooler.
    """
    if settings.DATABASE_DIRECT_URL:
        return _from_url(settings.DATABASE_DIRECT_URL)
    if transaction_mode():
        return None
    return _through_default()


def lock_params() -> dict[str, Any]:
    """Parameters for the connection that holds an advisory lock in transaction mode."""
    if settings.DATABASE_DIRECT_URL:
        return _from_url(settings.DATABASE_DIRECT_URL)
    return _through_default()


@contextmanager
def advisory_lock(key: int, *, wait: bool = True) -> Iterator[bool]:
    """Hold PostgreSQL advisory lock ``key`` for the block; yield whether it is held.

    With ``wait`` it waits for the lock, else it yields False at once when
    another process holds it. In session mode the lock belongs to Django's
    connection and is released at the end. Behind a transaction pooler a
    session lock would stay on whichever server connection took it, so the
    lock is taken by a transaction of a connection of its own, open for as
    long as the block runs, and ends with it: a crash releases it too.
    """
    if not transaction_mode():
        take = "pg_advisory_lock" if wait else "pg_try_advisory_lock"
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT {take}(%s)", [key])
            row = cursor.fetchone()
        held = wait or bool(row and row[0])
        try:
            yield held
        finally:
            if held:
                with connection.cursor() as cursor:
                    cursor.execute("SELECT pg_advisory_unlock(%s)", [key])
        return

    import psycopg

    take = "pg_advisory_xact_lock" if wait else "pg_try_advisory_xact_lock"
    with psycopg.connect(**lock_params(), autocommit=False, prepare_threshold=None) as holder:
        row = holder.execute(f"SELECT {take}(%s)", [key]).fetchone()
        held = wait or bool(row and row[0])
        try:
            yield held
        finally:
            holder.rollback()  # ends the transaction, and with it the lock
