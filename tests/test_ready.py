"""/ready answers 503 with the reason while the database is down, and recovers."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from urllib.parse import quote

import httpx2
import pytest
from django.conf import settings

from recall.testing import LiveServer

pytestmark = pytest.mark.slow

HOLDER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from recall.db import embedded
    server = embedded.start(Path(sys.argv[1]))
    print(server.host, flush=True)
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

    def start(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-c", HOLDER, str(self.data_dir)],
            cwd=settings.BASE_DIR,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.process.stdout is not None
        self.host = self.process.stdout.readline().strip()
        assert self.host, "the embedded server did not start"

    def stop(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGINT)
        self.process.wait(60)
        self.process = None

    @property
    def url(self) -> str:
        return f"postgres://recall@{quote(self.host, safe='')}/recall"


def test_ready_is_503_while_the_database_is_down(tmp_path):
    database = Database(tmp_path)
    database.start()
    env = {
        **os.environ,
        "DATABASE_URL": database.url,
        "SECRET_KEY": "s",
        "API_KEY_SECRET": "a",
    }
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "--verbosity", "0"],
        cwd=settings.BASE_DIR,
        env=env,
        check=True,
        timeout=300,
    )
    server = LiveServer(env={"DATABASE_URL": database.url}).start()
    try:
        assert httpx2.get(f"{server.url}/ready").status_code == 200

        database.stop()
        down = httpx2.get(f"{server.url}/ready", timeout=30)
        health = httpx2.get(f"{server.url}/health")

        assert down.status_code == 503
        assert down.json() == {
            "status": "unavailable",
            "checks": {"database": "unavailable: the database did not answer", "embedder": "ok"},
        }
        assert health.status_code == 200  # liveness never touches the database

        database.start()
        deadline = time.monotonic() + 30
        while httpx2.get(f"{server.url}/ready").status_code != 200:
            assert time.monotonic() < deadline, "the server did not recover"
            time.sleep(0.2)
    finally:
        server.stop()
        if database.process is not None:
            database.stop()
