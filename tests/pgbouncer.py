"""A throwaway PgBouncer in transaction mode, in front of a PostgreSQL the test names.

    bouncer = PgBouncer.start_new(host, port, users=["recall"])  # PgBouncerMissing without it
    bouncer.url("test_recall", "recall")   # postgres://recall@127.0.0.1:<port>/test_recall
    bouncer.close()                        # stop it and remove its directory

It pools in transaction mode, as managed PostgreSQL services deploy it, with
few server connections (``pool_size``), so that clients take turns on the
same server connections and whatever a session left behind would show up in
the next client's transactions. Debian's ``pgbouncer`` package (1.18 on
bookworm) has no protocol-level prepared statements in this mode. PgBouncer
will not run as root: as root it runs as the owner of PostgreSQL's socket
directory, which can reach the socket.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import psycopg

from tests.support import free_port

START_TIMEOUT = 15.0


class PgBouncerMissing(RuntimeError):
    pass


class PgBouncer:
    def __init__(self, binary: str, workdir: Path, port: int, run_as: str | None) -> None:
        self.binary = binary
        self.workdir = workdir
        self.port = port
        self.run_as = run_as
        self.process: subprocess.Popen[bytes] | None = None

    @classmethod
    def start_new(
        cls, host: str, port: int | str | None, users: list[str], *, pool_size: int = 2
    ) -> PgBouncer:
        """Start one in front of PostgreSQL at ``host`` (a socket directory or an address)."""
        binary = shutil.which("pgbouncer") or (
            "/usr/sbin/pgbouncer" if Path("/usr/sbin/pgbouncer").exists() else None
        )
        if binary is None:
            raise PgBouncerMissing("pgbouncer is not installed (apt-get install pgbouncer)")
        run_as = None
        if os.geteuid() == 0:
            owner = Path(host).stat().st_uid if host.startswith("/") else None
            run_as = pwd.getpwuid(owner).pw_name if owner else "nobody"
        workdir = Path(tempfile.mkdtemp(prefix="recall-pgbouncer-"))
        for _ in range(5):  # the free port can be taken between probing and binding
            bouncer = cls(binary, workdir, free_port(), run_as)
            bouncer._configure(host, port, users, pool_size)
            try:
                bouncer.start()
            except RuntimeError:
                continue
            return bouncer
        shutil.rmtree(workdir, ignore_errors=True)
        raise RuntimeError(f"pgbouncer did not start; see {workdir}/pgbouncer.log")

    def _configure(
        self, host: str, port: int | str | None, users: list[str], pool_size: int
    ) -> None:
        target = f"host={host}" + (f" port={port}" if port else "")
        (self.workdir / "users.txt").write_text("".join(f'"{u}" ""\n' for u in users))
        (self.workdir / "pgbouncer.ini").write_text(
            "[databases]\n"
            f"* = {target}\n"
            "[pgbouncer]\n"
            "listen_addr = 127.0.0.1\n"
            f"listen_port = {self.port}\n"
            "unix_socket_dir =\n"
            "auth_type = trust\n"
            f"auth_file = {self.workdir / 'users.txt'}\n"
            "pool_mode = transaction\n"
            f"default_pool_size = {pool_size}\n"
            "min_pool_size = 0\n"
            "reserve_pool_size = 0\n"
            "max_client_conn = 500\n"
            # A client left waiting for a server connection fails in seconds, not minutes.
            "query_wait_timeout = 30\n"
            f"logfile = {self.workdir / 'pgbouncer.log'}\n"
            f"pidfile = {self.workdir / 'pgbouncer.pid'}\n"
            "admin_users = pgbouncer\n"
        )
        if self.run_as:
            entry = pwd.getpwnam(self.run_as)
            for path in [self.workdir, *self.workdir.iterdir()]:
                os.chown(path, entry.pw_uid, entry.pw_gid)

    def url(self, dbname: str, user: str) -> str:
        return f"postgres://{user}@127.0.0.1:{self.port}/{dbname}"

    def connect(self, dbname: str, user: str, **kwargs: object) -> psycopg.Connection:
        """A client connection through the pooler (no prepared statements: it has none)."""
        return psycopg.connect(
            host="127.0.0.1",
            port=self.port,
            dbname=dbname,
            user=user,
            prepare_threshold=None,
            **kwargs,  # type: ignore[arg-type]
        )

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self) -> None:
        if self.running:
            return
        self.process = subprocess.Popen(
            [self.binary, str(self.workdir / "pgbouncer.ini")],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            user=self.run_as,
        )
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                self.process = None
                raise RuntimeError(f"pgbouncer exited at start; see {self.log_path}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"pgbouncer did not listen within {START_TIMEOUT}s; see {self.log_path}")

    @property
    def log_path(self) -> Path:
        return self.workdir / "pgbouncer.log"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self) -> None:
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)  # immediate shutdown: clients are cut off
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        self.process = None

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.workdir, ignore_errors=True)
