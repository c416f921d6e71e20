"""A throwaway redis-server for tests, which a test may stop and start again.

    server = RedisServer.start_new()   # raises RedisServerMissing without the binary
    server.url                         # redis://127.0.0.1:<port>/0
    server.stop()                      # SIGKILL by default: a crash, not a shutdown
    server.start()                     # same port, empty data
    server.close()                     # stop and remove the temp dir

It keeps nothing on disk (``--save '' --appendonly no``), so a restart comes
back empty, like a cache node that lost its memory.
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import redis

START_TIMEOUT = 10.0


class RedisServerMissing(RuntimeError):
    pass


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class RedisServer:
    def __init__(self, binary: str, port: int, workdir: Path) -> None:
        self.binary = binary
        self.port = port
        self.workdir = workdir
        self.process: subprocess.Popen[bytes] | None = None

    @classmethod
    def start_new(cls) -> RedisServer:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RedisServerMissing("redis-server is not installed (apt-get install redis-server)")
        workdir = Path(tempfile.mkdtemp(prefix="recall-redis-"))
        # The free port can be taken between probing and binding; try another.
        for _ in range(5):
            server = cls(binary, _free_port(), workdir)
            try:
                server.start()
            except RuntimeError:
                continue
            return server
        shutil.rmtree(workdir, ignore_errors=True)
        raise RuntimeError(f"redis-server did not start; see {workdir}/redis.log")

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def client(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=2.0)

    def start(self) -> None:
        if self.running:
            return
        log = self.workdir / "redis.log"
        self.process = subprocess.Popen(
            [
                self.binary,
                "--port", str(self.port),
                "--bind", "127.0.0.1",
                "--save", "",
                "--appendonly", "no",
                "--dir", str(self.workdir),
                "--logfile", str(log),
                "--daemonize", "no",
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                self.process = None
                raise RuntimeError(f"redis-server exited at start; see {log}")
            try:
                with self.client() as client:
                    if client.ping():
                        return
            except redis.ConnectionError:
                time.sleep(0.02)
        self.stop()
        raise RuntimeError(f"redis-server did not answer PING within {START_TIMEOUT}s; see {log}")

    def stop(self, *, kill: bool = True) -> None:
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
            self.process.wait(timeout=10)
        self.process = None

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.workdir, ignore_errors=True)
