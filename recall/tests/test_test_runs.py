"""A test run stopped with SIGTERM stops its embedded PostgreSQL (recall/pytest_plugin.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.conf import settings

WAITS = """
import os, time
import pytest

@pytest.mark.django_db
def test_waits():
    from django.db import connection
    connection.ensure_connection()
    print("READY", os.environ["RECALL_DATA_DIR"], flush=True)
    time.sleep(300)
"""


def postgres_serving(data_dir: str) -> list[int]:
    """The pids of processes whose command line names ``data_dir``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if data_dir in command and "postgres" in command:
            found.append(int(entry.name))
    return found


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")
def test_a_run_stopped_with_sigterm_stops_its_database_and_removes_its_directory(tmp_path):
    # A CI job's timeout sends SIGTERM: the run ended at once, past its exit hooks,
    # and its embedded PostgreSQL ran on with no parent.
    test = tmp_path / "test_waits.py"
    test.write_text(WAITS)
    env = {k: v for k, v in os.environ.items() if k != "RECALL_DATA_DIR"}
    run = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pytest",
            "-c",
            "pyproject.toml",
            "--rootdir",
            ".",
            "-p",
            "no:cacheprovider",
            "-q",
            "-s",
            str(test),
        ],
        cwd=settings.BASE_DIR,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert run.stdout is not None
        data_dir = ""
        for line in run.stdout:
            if line.startswith("READY"):
                data_dir = line.split()[1]
                break
        assert data_dir, "the run never reached its test"
        assert postgres_serving(data_dir)

        run.send_signal(signal.SIGTERM)
        run.wait(timeout=60)
    finally:
        if run.poll() is None:
            run.kill()
    for _ in range(100):
        if not postgres_serving(data_dir) and not Path(data_dir).exists():
            break
        time.sleep(0.1)
    assert postgres_serving(data_dir) == []
    assert not Path(data_dir).exists()
