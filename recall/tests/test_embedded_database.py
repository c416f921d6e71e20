"""The embedded PostgreSQL: started on demand, shared, reused and stopped cleanly."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from django.conf import settings

# Each process starts the server (or joins it), then leaves its mark. With a
# fourth argument it first says "ready" and waits until that file exists, so a
# test can release two processes into start() at the same moment.
SCRIPT = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    import psycopg
    from recall.db import embedded
    if len(sys.argv) > 4:
        print("ready", flush=True)
        while not Path(sys.argv[4]).exists():
            time.sleep(0.01)
    server = embedded.start(Path(sys.argv[1]))
    with psycopg.connect(host=server.host, port=server.port, user="recall", dbname="recall") as c:
        # CREATE TABLE IF NOT EXISTS is no guard against a concurrent creator:
        # both sessions see no table, and the second fails on pg_type's unique
        # index. Lock, so the test's own table cannot race.
        c.execute("SELECT pg_advisory_xact_lock(42)")
        c.execute("CREATE TABLE IF NOT EXISTS marks (pid int)")
        c.execute("INSERT INTO marks VALUES (%s)", [int(sys.argv[2])])
        c.commit()
        super_ = c.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user").fetchone()
        ext = c.execute("SELECT extversion FROM pg_extension WHERE extname = 'vector'").fetchone()
        marks = ",".join(str(r[0]) for r in c.execute("SELECT pid FROM marks ORDER BY pid"))
    print(server.pid, super_[0], ext[0], marks)
    time.sleep(float(sys.argv[3]))
    """
)


def run(
    data_dir: Path, mark: int, linger: float = 0.0, go: Path | None = None
) -> subprocess.Popen[str]:
    barrier = [str(go)] if go is not None else []
    return subprocess.Popen(
        [sys.executable, "-c", SCRIPT, str(data_dir), str(mark), str(linger), *barrier],
        cwd=settings.BASE_DIR,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ},
    )


def postmaster_pid(data_dir: Path) -> int | None:
    pidfile = data_dir / "pgdata" / "postmaster.pid"
    return int(pidfile.read_text().split()[0]) if pidfile.exists() else None


@pytest.mark.slow
def test_two_processes_starting_at_once_share_one_server(tmp_path):
    go = tmp_path / "go"
    data_dir = tmp_path / "data"
    first, second = run(data_dir, 1, 2.0, go), run(data_dir, 2, 2.0, go)
    # Both have imported everything and wait: release them into start() together.
    assert first.stdout is not None and second.stdout is not None
    assert first.stdout.readline() == "ready\n"
    assert second.stdout.readline() == "ready\n"
    go.touch()
    out1, err1 = first.communicate(timeout=120)
    out2, err2 = second.communicate(timeout=120)

    assert first.returncode == 0, err1
    assert second.returncode == 0, err2
    pid1, superuser, version, _ = out1.split()
    pid2 = out2.split()[0]
    assert pid1 == pid2  # one postmaster for both
    assert superuser == "False"  # the app role is not a superuser
    assert version.startswith("0.8")
    # The last process to leave stopped the server.
    assert postmaster_pid(data_dir) is None


@pytest.mark.slow
def test_data_survives_a_restart(tmp_path):
    assert run(tmp_path, 1).wait(timeout=120) == 0
    assert run(tmp_path, 2).wait(timeout=120) == 0

    third = run(tmp_path, 3)
    out, err = third.communicate(timeout=120)

    assert third.returncode == 0, err
    assert out.split()[3] == "1,2,3"
