"""`recall serve` on its embedded PostgreSQL, under write load, while the postmaster is
killed (kill -9) or stalled (SIGSTOP, then SIGCONT), or the whole database is frozen.

Afterwards every acknowledged ``remember`` is stored, no refused one is,
clients saw only success, ``unavailable`` or 503, and ``/ready`` went 503 and
came back to 200 by itself.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx2
import psycopg
import pytest
from django.conf import settings

from tests.load import WriteLoad
from tests.support import free_port

pytestmark = pytest.mark.slow

ALLOWED = {"ok", "unavailable", "http 503"}
# The server's stall watch (core/stalls.py), shorter than its default for the test.
STALL_SECONDS = 2


class Served:
    """`recall serve` with a data directory of its own."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = data_dir / "serve.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.key = ""

    def start(self) -> Served:
        env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
        env.update(
            RECALL_DATA_DIR=str(self.data_dir),
            PORT=str(self.port),
            PYTHONUNBUFFERED="1",
            RATE_LIMIT_FREE="100000/min",
            FREE_TIER_MAX_MEMORIES="1000000",
            DATABASE_STALL_SECONDS=str(STALL_SECONDS),
        )
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "recall", "serve"],
                cwd=settings.BASE_DIR,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + 240
        while not self.ready():
            assert self.process.poll() is None, self.logs()[-4000:]
            assert time.monotonic() < deadline, "recall serve did not become ready"
            time.sleep(0.3)
        # The first-run banner follows readiness (recall/startup.py's Banner).
        while not (found := re.search(r"API key:\s+(recall_live_[A-Za-z0-9_-]{32})", self.logs())):
            assert time.monotonic() < deadline, self.logs()[-4000:]
            time.sleep(0.2)
        self.key = found.group(1)
        return self

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def ready(self) -> bool:
        try:
            return httpx2.get(f"{self.url}/ready", timeout=10).status_code == 200
        except httpx2.TransportError:
            return False

    def logs(self) -> str:
        return self.log.read_text(errors="replace")

    def postmaster(self) -> tuple[int, str]:
        """The running postmaster's pid and socket directory, from its postmaster.pid."""
        lines = (self.data_dir / "pgdata" / "postmaster.pid").read_text().splitlines()
        return int(lines[0]), lines[4]

    def database_processes(self) -> list[int]:
        """The postmaster and every process it started."""
        postmaster, _ = self.postmaster()
        children = []
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue  # gone meanwhile
            if int(fields[1]) == postmaster:
                children.append(int(stat.parent.name))
        return [postmaster, *children]

    def stored(self) -> set[str]:
        """Every memory's content, read as the superuser (no row-level security)."""
        _, socket_dir = self.postmaster()
        with psycopg.connect(host=socket_dir, user="postgres", dbname="recall") as conn:
            return {row[0] for row in conn.execute("SELECT content FROM memories")}


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> Iterator[Served]:
    server = Served(tmp_path_factory.mktemp("serve")).start()
    yield server
    server.stop()


def watch_ready(served: Served, until_ok_after: float, timeout: float = 120) -> list[int]:
    """Poll /ready; return the statuses seen, ending with 200 once ``until_ok_after`` has passed."""
    statuses: list[int] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            status = httpx2.get(f"{served.url}/ready", timeout=10).status_code
        except httpx2.TransportError:
            status = 0
        statuses.append(status)
        if status == 200 and time.monotonic() > until_ok_after:
            return statuses
        time.sleep(0.2)
    raise AssertionError(f"/ready did not come back: {statuses[-20:]}")


def check_writes(served: Served, load: WriteLoad) -> None:
    kinds = load.kinds()
    assert set(kinds) <= ALLOWED, kinds
    stored = served.stored()
    acknowledged = load.acknowledged()
    assert set(acknowledged) <= stored, "an acknowledged write was lost"
    assert not load.refused() & stored, "a refused write was stored"


def test_after_kill_9_of_the_postmaster_it_restarts_it_and_loses_no_acknowledged_write(served):
    dead, _ = served.postmaster()
    with WriteLoad(f"{served.url}/mcp", served.key, tag="kill") as load:
        load.wait_for(20)
        os.kill(dead, signal.SIGKILL)
        statuses = watch_ready(served, until_ok_after=time.monotonic() + 1)
        load.wait_for(20)

    assert 503 in statuses, statuses
    assert statuses[-1] == 200
    assert served.postmaster()[0] != dead
    assert load.kinds()["ok"] >= 40
    assert load.kinds().total() > load.kinds()["ok"], "the outage was never seen"
    check_writes(served, load)
    logs = served.logs()
    assert "embedded postgres died; restarting it" in logs
    assert "embedded postgres restarted" in logs


def test_after_a_stall_of_the_postmaster_it_carries_on(served):
    stalled, _ = served.postmaster()
    with WriteLoad(f"{served.url}/mcp", served.key, tag="stall") as load:
        load.wait_for(20)
        os.kill(stalled, signal.SIGSTOP)
        try:
            time.sleep(3)
        finally:
            os.kill(stalled, signal.SIGCONT)
        statuses = watch_ready(served, until_ok_after=time.monotonic())
        load.wait_for(20)

    assert statuses[-1] == 200
    assert served.postmaster()[0] == stalled  # alive all along: not restarted
    check_writes(served, load)


def test_while_the_whole_database_is_frozen_calls_end_unavailable_before_it_thaws(served):
    # Calls that reused a connection opened before the freeze waited on it
    # for as long as the freeze lasted; those needing a new one were answered
    # unavailable within connect_timeout (5 s).
    # Before, all four threads' calls waited for the thaw and none was
    # answered while the database was frozen.
    with WriteLoad(f"{served.url}/mcp", served.key, tag="freeze") as load:
        load.wait_for(20)
        frozen = served.database_processes()
        for pid in frozen:
            os.kill(pid, signal.SIGSTOP)
        froze = time.monotonic()
        try:
            time.sleep(25)
        finally:
            for pid in frozen:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)
        thawed = time.monotonic()
        statuses = watch_ready(served, until_ok_after=time.monotonic())
        load.wait_for(20)

    assert statuses[-1] == 200
    # The watch ends a stalled wait after STALL_SECONDS and a failed check of
    # at most connect_timeout; a new call then fails to connect within
    # connect_timeout. (A call whose COMMIT was out waits for the thaw.)
    # (A call that finished its last statement just before the freeze may be
    # answered just after it: a second's grace.)
    while_frozen = [o for o in load.outcomes if froze + 1 < o.answered < thawed]
    assert len(while_frozen) >= 3, load.kinds()
    assert {o.kind for o in while_frozen} <= {"unavailable", "http 503"}
    check_writes(served, load)
    assert "database stopped answering" in served.logs()


def test_a_command_run_while_the_database_is_frozen_says_so_in_one_line(served):
    # Its start-up connected without a timeout: `recall doctor` and every other
    # command hung, silent, for as long as the freeze lasted.
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    env.update(RECALL_DATA_DIR=str(served.data_dir))
    frozen = served.database_processes()
    for pid in frozen:
        os.kill(pid, signal.SIGSTOP)
    try:
        result = subprocess.run(
            [sys.executable, "-m", "recall", "list-keys"],
            cwd=settings.BASE_DIR,
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=90,
        )
    finally:
        for pid in frozen:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)

    assert result.returncode == 1, result.stderr[-2000:]
    [line] = result.stderr.splitlines()
    assert line.startswith("recall list-keys: cannot reach the embedded PostgreSQL"), line
    watch_ready(served, until_ok_after=time.monotonic())
