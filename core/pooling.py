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
import time
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


def default_params() -> dict[str, Any]:
    """Parameters for a connection as Django's own are made: through a pooler if there is one."""
    return _through_default()


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


# How often a process waiting for an advisory lock asks again.
LOCK_POLL_SECONDS = 0.25


@contextmanager
def advisory_lock(key: int, *, wait: bool = True) -> Iterator[bool]:
    """Hold PostgreSQL advisory lock ``key`` for the block; yield whether it is held.

    With ``wait`` it waits for the lock, else it yields False at once when
    another process holds it. In session mode the lock belongs to Django's
    connection and is released at the end. Behind a transaction pooler a
    session lock would stay on whichever server connection took it, so the
    lock is taken by a transaction of a connection of its own, open for as
    long as the block runs, and ends with it: a crash releases it too.

    Waiting is asking again every ``LOCK_POLL_SECONDS``, never a statement
    that blocks: a waiting statement holds a snapshot, and the holder's
    ``CREATE INDEX CONCURRENTLY`` (a migration) waits for every snapshot
    older than its own. PostgreSQL then failed the waiter as a deadlock:
    servers started together on an empty database crashed but one.
    """
    if not transaction_mode():
        held = _try_session_lock(key)
        if wait and not held:
            _log_wait(key)
        while wait and not held:
            time.sleep(LOCK_POLL_SECONDS)
            held = _try_session_lock(key)
        try:
            yield held
        finally:
            if held:
                with connection.cursor() as cursor:
                    cursor.execute("SELECT pg_advisory_unlock(%s)", [key])
        return

    import psycopg

    with psycopg.connect(**lock_params(), autocommit=False, prepare_threshold=None) as holder:
        held = _try_transaction_lock(holder, key)
        if wait and not held:
            _log_wait(key)
        while wait and not held:
            time.sleep(LOCK_POLL_SECONDS)
            held = _try_transaction_lock(holder, key)
        try:
            yield held
        finally:
            holder.rollback()  # ends the transaction, and with it the lock


def _try_session_lock(key: int) -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_lock(%s)", [key])
        row = cursor.fetchone()
    return bool(row and row[0])


def _try_transaction_lock(holder: Any, key: int) -> bool:
    """Take the lock in ``holder``'s open transaction, or end that transaction and say no.

    The key is sent as a literal: a bound parameter leaves the statement's
    unnamed portal, and with it a snapshot (``backend_xmin``), in place
    while the transaction stays open, and the holder's own migrations'
    ``CREATE INDEX CONCURRENTLY`` then waited for it forever.
    """
    from psycopg import sql

    statement = sql.SQL("SELECT pg_try_advisory_xact_lock({})").format(sql.Literal(int(key)))
    row = holder.execute(statement).fetchone()
    if row and row[0]:
        return True
    holder.rollback()
    return False


def _log_wait(key: int) -> None:
    logger.info("waiting for another process's advisory lock", extra={"lock": key})
