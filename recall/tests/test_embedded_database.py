"""The embedded PostgreSQL: started on demand, shared, reused and stopped cleanly."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from django.conf import settings

SCRIPT = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    import psycopg
    from recall.db import embedded
    server = embedded.start(Path(sys.argv[1]))
    with psycopg.connect(host=server.host, port=server.port, user="recall", dbname="recall") as c:
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


def run(data_dir: Path, mark: int, linger: float = 0.0) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", SCRIPT, str(data_dir), str(mark), str(linger)],
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
    first, second = run(tmp_path, 1, 2.0), run(tmp_path, 2, 2.0)
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
    assert postmaster_pid(tmp_path) is None


@pytest.mark.slow
def test_data_survives_a_restart(tmp_path):
    assert run(tmp_path, 1).wait(timeout=120) == 0
    assert run(tmp_path, 2).wait(timeout=120) == 0

    third = run(tmp_path, 3)
    out, err = third.communicate(timeout=120)

    assert third.returncode == 0, err
    assert out.split()[3] == "1,2,3"
