"""A database that stops answering ends the calls waiting on it, instead of holding them.

``connect_timeout`` bounds only a new connection. A connection opened before
the database stopped answering (its processes stopped or paused) waits on
its socket with no deadline, and PostgreSQL's own timeouts run in the processes that stopped:
a call that reused such a connection hung for as long as the stall lasted,
while calls that needed a new one were answered ``unavailable`` in seconds.

So every wait of a Django connection on its database (a statement, a fetch,
a commit, the health check) is noted while it lasts. A watchdog thread looks
once a second; when a wait has lasted ``DATABASE_STALL_SECONDS``, it opens a
connection of its own (within ``connect_timeout``). If the database answers,
the wait is a slow statement, and it goes on. If not, the database is
unreachable: the watchdog shuts down the socket of every connection that has
waited that long, each of those waits fails as a broken connection would
(``unavailable`` to the caller, the transaction rolled back by the server
once it runs again), and Django replaces the connection on its next use.
A wait for a COMMIT is left alone: the server may already hold the COMMIT
and carry it out once it runs again, and ``unavailable`` promises that
nothing was written.

A long statement on a live database is never ended here, however long it
runs. ``DATABASE_STALL_SECONDS=0`` turns the watch off.

Behind a pooler with ``DATABASE_DIRECT_URL``, the check asks both ways: a
pooler that stopped answering (its process paused) holds the calls as a
stopped database would, while the database behind it answers. What it cannot
see: behind a transaction pooler without ``DATABASE_DIRECT_URL``, the pooler
answers the check for a database that does not. A peer that went away
without a word (a failover, an expired NAT entry) is the sockets' own to
notice: ``DATABASE_SOCKET_OPTIONS`` (``tcp_user_timeout``, keepalives) end
such a wait within about 30 s.
"""

from __future__ import annotations

import itertools
import logging
import socket
import threading
import time
from typing import Any

import psycopg
from django.conf import settings
from django.db.backends.signals import connection_created

from core import outage
from core.logging import describe_exception

logger = logging.getLogger("recall.stalls")

# Each wait in progress: its number -> (when it began, its connection).
_waiting: dict[int, tuple[float, WatchedConnection]] = {}
_numbers = itertools.count()
_lock = threading.Lock()
_watchdog: threading.Thread | None = None
_stopping = threading.Event()
# Held while the watchdog ends waits, and while a connection starts a COMMIT.
_shutting = threading.Lock()
# When the database last answered the watchdog: a statement that runs long
# on a live database is asked about at most once per DATABASE_STALL_SECONDS.
_answered_at = float("-inf")


class WatchedConnection(psycopg.Connection[Any]):
    """A psycopg connection whose waits on the database the watchdog can see and end."""

    # Set while a COMMIT is out: the database may already hold it, and would
    # carry it out when it runs again, so ending that wait would answer
    # "nothing was written" to a call that wrote. It waits for the database.
    committing = False

    def commit(self) -> None:
        # Under the lock the watchdog ends waits with: it never shuts a
        # connection that has started to commit.
        with _shutting:
            self.committing = True
        try:
            super().commit()
        finally:
            self.committing = False

    def wait(self, gen: Any, *args: Any, **kwargs: Any) -> Any:
        number = next(_numbers)
        _waiting[number] = (time.monotonic(), self)
        try:
            return super().wait(gen, *args, **kwargs)
        finally:
            _waiting.pop(number, None)


def install() -> None:
    """Watch every Django connection this process opens from now on; start the watchdog."""
    global _watchdog
    if stall_seconds() <= 0:
        return
    connection_created.connect(_watch, dispatch_uid="recall.stalls")
    with _lock:
        _stopping.clear()
        if _watchdog is None or not _watchdog.is_alive():
            _watchdog = threading.Thread(target=_run, name="db-stall-watchdog", daemon=True)
            _watchdog.start()


def uninstall() -> None:
    """Stop watching new connections and stop the watchdog (tests)."""
    global _watchdog
    connection_created.disconnect(dispatch_uid="recall.stalls")
    with _lock:
        _stopping.set()
        watchdog, _watchdog = _watchdog, None
    if watchdog is not None:
        watchdog.join(5)


def stall_seconds() -> float:
    return float(getattr(settings, "DATABASE_STALL_SECONDS", 0))


def _watch(sender: Any, connection: Any, **kwargs: Any) -> None:
    raw = connection.connection
    # Django opened a plain psycopg connection; it becomes one whose waits
    # are noted. Only ``wait`` differs, and the subclass adds no state.
    if type(raw) is psycopg.Connection:
        raw.__class__ = WatchedConnection


def _run() -> None:
    while not _stopping.wait(1.0):
        try:
            check()
        except Exception as exc:  # the watchdog outlives any one look
            logger.warning("database stall watch failed", extra=describe_exception(exc))


def check() -> int:
    """End the waits stalled on an unreachable database; return how many were ended."""
    global _answered_at
    limit = stall_seconds()
    now = time.monotonic()
    stalled = [
        (number, conn)
        for number, (began, conn) in list(_waiting.items())
        if now - began >= limit and not conn.committing
    ]
    if not stalled and outage.is_open("stall watch") and now - _answered_at >= limit:
        # Its outage ends when the database answers again, stalled waits or none:
        # else the log never said it came back.
        if _database_answers():
            _answered_at = now
        return 0
    if not stalled or now - _answered_at < limit:
        return 0
    if _database_answers():
        _answered_at = now
        return 0
    ended = 0
    with _shutting:
        # The check took up to connect_timeout: only a wait still going on,
        # and still not a commit, is ended.
        for number, conn in stalled:
            if number in _waiting and not conn.committing:
                _shut(conn)
                ended += 1
    if ended:
        logger.warning(
            "database stopped answering: ended the calls waiting on it",
            extra={"connections": ended, "waited_s": limit},
        )
    return ended


def _database_answers() -> bool:
    """Whether a new connection to the database completes within ``connect_timeout``.

    Only a timeout says it does not answer. A refusal the server sent (too
    many clients, starting up) is an answer; so is a refused or unreachable
    address, which a stalled wait meets by itself (``tcp_user_timeout``).
    With ``DATABASE_DIRECT_URL``, both the way the calls go (a pooler, which
    would answer for a database that does not) and the direct one must answer.
    """
    from core import pooling

    paths = [pooling.lock_params()]
    if settings.DATABASE_DIRECT_URL:
        paths.insert(0, pooling.default_params())
    for params in paths:
        try:
            with psycopg.connect(**params):
                pass
        except psycopg.errors.ConnectionTimeout as exc:
            outage.note("stall watch", exc)
            return False
        except psycopg.Error:
            pass
    outage.recovered("stall watch")
    return True


def _shut(conn: psycopg.Connection[Any]) -> None:
    try:
        fd = conn.pgconn.socket
        # A duplicate of the descriptor: shutting down acts on the socket
        # itself, and closing the duplicate leaves psycopg's descriptor alone.
        with socket.socket(fileno=socket.dup(fd)) as sock:
            sock.shutdown(socket.SHUT_RDWR)
    except Exception as exc:  # already closed, or never opened
        logger.debug("could not shut a stalled connection", extra=describe_exception(exc))
