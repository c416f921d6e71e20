"""Where `recall serve` records that it serves, so that `recall doctor` can find and check it.

While it runs, the serving process keeps ``servers/<pid>.json`` in the data
directory: its pid and the process's start time, the address it listens on
and how many workers it runs. It removes the file when it stops. A server
killed outright (kill -9, a power cut) leaves its file behind; a reader tells
such a record apart by its pid: gone, or taken since by a process that
started at another time.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil

DIRECTORY = "servers"
# A process's start time, as psutil reads it, is exact to the clock tick.
_SAME_PROCESS_SECONDS = 1.0
_EVERY_ADDRESS = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}  # noqa: S104


@dataclass(frozen=True)
class Instance:
    pid: int
    started_at: float
    host: str
    port: int
    workers: int

    @property
    def url(self) -> str:
        """Where this machine reaches the server (its loopback when it listens everywhere)."""
        host = _EVERY_ADDRESS.get(self.host, self.host)
        return f"http://[{host}]:{self.port}" if ":" in host else f"http://{host}:{self.port}"

    def is_running(self) -> bool:
        try:
            started = psutil.Process(self.pid).create_time()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            return False
        return abs(started - self.started_at) < _SAME_PROCESS_SECONDS


@contextlib.contextmanager
def recorded(data_dir: Path, *, host: str, port: int, workers: int) -> Iterator[Instance]:
    """Record this process as serving ``host:port`` in ``data_dir`` until the block ends."""
    me = Instance(
        pid=os.getpid(),
        started_at=psutil.Process().create_time(),
        host=host,
        port=port,
        workers=workers,
    )
    folder = Path(data_dir) / DIRECTORY
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = folder / f"{me.pid}.json"
    # Written whole, then renamed: a reader never sees half a record.
    fd, partial = tempfile.mkstemp(dir=folder, prefix=".", suffix=".json")
    with os.fdopen(fd, "w") as file:
        json.dump(
            {
                "pid": me.pid,
                "started_at": me.started_at,
                "host": host,
                "port": port,
                "workers": workers,
            },
            file,
        )
    os.replace(partial, path)
    try:
        yield me
    finally:
        path.unlink(missing_ok=True)


def found(data_dir: Path) -> list[Instance]:
    """Return every server recorded in ``data_dir``, running or not, by pid."""
    folder = Path(data_dir) / DIRECTORY
    if not folder.is_dir():
        return []
    instances = []
    for path in sorted(folder.glob("[0-9]*.json")):
        try:
            record = json.loads(path.read_text())
            instances.append(
                Instance(
                    pid=int(record["pid"]),
                    started_at=float(record["started_at"]),
                    host=str(record["host"]),
                    port=int(record["port"]),
                    workers=int(record["workers"]),
                )
            )
        except (OSError, ValueError, KeyError, TypeError):
            continue  # not ours, or being removed as we read: nothing to check
    return sorted(instances, key=lambda instance: instance.pid)
