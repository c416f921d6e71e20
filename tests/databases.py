"""A PostgreSQL of a test's own, to stop, kill and start while a server uses it.

The server under test reaches it through ``DATABASE_URL``, as it would an
external database: it does not own it, so it never restarts it either.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from urllib.parse import quote

import psycopg
from django.conf import settings

HOLDER = textwrap.dedent(
    """
    import signal, sys, time
    from pathlib import Path
    from recall.db import embedded
    # stop() interrupts this process. A shell that starts the test run in the
    # background (`pytest &`, no job control) ignores SIGINT, and children
    # inherit that: restore Python's own handler, or stop() would wait forever.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    server = embedded.start(Path(sys.argv[1]))
    print(server.host, server.pid, flush=True)
    try:
        while True:
            time.sleep(1)
    except KeyboardInterrupt:
        pass  # atexit then stops the server: this process is its only user
    """
)


class Database:
    """An embedded PostgreSQL of the test's own, held up by a child process."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.process: subprocess.Popen[str] | None = None
        self.host = ""
        self.pid = 0

    def start(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-c", HOLDER, str(self.data_dir)],
            cwd=settings.BASE_DIR,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.process.stdout is not None
        line = self.process.stdout.readline().split()
        assert line, "the embedded server did not start"
        self.host, self.pid = line[0], int(line[1])

    def stop(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGINT)
        self.process.wait(60)
        self.process = None

    def kill_postmaster(self) -> None:
        """kill -9 the postmaster, as the OOM killer would; the holder process lives on."""
        os.kill(self.pid, signal.SIGKILL)

    def migrate(self) -> None:
        subprocess.run(
            [sys.executable, "manage.py", "migrate", "--verbosity", "0"],
            cwd=settings.BASE_DIR,
            env=self.environment(),
            check=True,
            timeout=300,
        )

    def issue_key(self, email: str, tier: str = "pro") -> str:
        """Create a user and return a new key of theirs, valid for a LiveServer of this test run."""
        for args in (["create_user", email, "--tier", tier], ["create_key", email]):
            done = subprocess.run(
                [sys.executable, "manage.py", *args],
                cwd=settings.BASE_DIR,
                env=self.environment(),
                capture_output=True,
                text=True,
                check=True,
                timeout=120,
            )
        return done.stdout.strip()

    def connect(self) -> psycopg.Connection:
        """A superuser connection: sees every row, whatever row-level security says."""
        return psycopg.connect(host=self.host, user="postgres", dbname="recall", autocommit=True)

    def environment(self) -> dict[str, str]:
        # The test run's own secrets, so keys made here authenticate on its servers.
        return {
            **os.environ,
            "DATABASE_URL": self.url,
            "SECRET_KEY": settings.SECRET_KEY,
            "API_KEY_SECRET": settings.API_KEY_SECRET,
        }

    @property
    def url(self) -> str:
        return f"postgres://recall@{quote(self.host, safe='')}/recall"
