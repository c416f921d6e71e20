"""Run the real server for tests: uvicorn, on a loopback port, against the test database.

``LiveServer`` starts ``recall.asgi:application`` under uvicorn in a
subprocess, pointed at the database pytest-django created, with the same
secrets as the test process (so keys issued in a test authenticate), and
waits until ``/ready`` says the database and the embedding model are up.
Tests using it must commit their data: mark them
``@pytest.mark.django_db(transaction=True)``.
"""

from __future__ import annotations

import hashlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
import weakref
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote

from django.conf import settings
from django.db import connection, connections

# Tagged on the server's database connections, so tests can see when it is busy.
SERVER_APPLICATION_NAME = "recall-live-server"


T = TypeVar("T")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def database_url() -> str:
    """Return a URL for the database the tests are using right now."""
    params = connection.get_connection_params()
    host = params.get("host") or ""
    user = quote(params.get("user") or "", safe="")
    password = quote(params.get("password") or "", safe="")
    credentials = f"{user}:{password}@" if password else f"{user}@"
    port = f":{params['port']}" if params.get("port") else ""
    return f"postgres://{credentials}{quote(host, safe='')}{port}/{params['dbname']}"


class LiveServer:
    """The app under uvicorn; with ``workers``, as operators run it: ``recall serve --workers``."""

    def __init__(
        self,
        env: dict[str, str] | None = None,
        *,
        port: int | None = None,
        workers: int | None = None,
    ) -> None:
        self.port = port or free_port()
        self.workers = workers
        self.url = f"http://127.0.0.1:{self.port}"
        self.mcp_url = f"{self.url}/mcp"
        self.extra_env = env or {}
        handle, log_path = tempfile.mkstemp(prefix="recall-server-", suffix=".log")
        os.close(handle)
        self.log_path = Path(log_path)
        # Tests read the log after stop(); it goes when the server object does.
        weakref.finalize(self, self.log_path.unlink, missing_ok=True)
        self.process: subprocess.Popen[bytes] | None = None

    def environment(self) -> dict[str, str]:
        env = {
            **os.environ,
            "DATABASE_URL": database_url(),
            "SECRET_KEY": settings.SECRET_KEY,
            "API_KEY_SECRET": settings.API_KEY_SECRET,
            "DATABASE_CONN_MAX_AGE": "0",
            "LOG_FORMAT": "json",
            "LOG_LEVEL": "info",
            "PYTHONUNBUFFERED": "1",
            "PGAPPNAME": SERVER_APPLICATION_NAME,
            # OAuth issuer and resource identifiers: where this server listens.
            "RECALL_PUBLIC_URL": self.url,
            # Read by `recall serve` (with workers); uvicorn takes them as arguments.
            "HOST": "127.0.0.1",
            "PORT": str(self.port),
        }
        env.update(self.extra_env)
        return env

    def command(self) -> list[str]:
        if self.workers is not None:
            return [sys.executable, "-m", "recall", "serve", "--workers", str(self.workers)]
        return [
            sys.executable,
            "-m",
            "uvicorn",
            "recall.asgi:application",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--lifespan",
            "on",
            "--http",
            "recall.protocol:TimedH11Protocol",
            "--no-access-log",
            "--log-level",
            "warning",
        ]

    def start(self, timeout: float = 90.0) -> LiveServer:
        log = self.log_path.open("ab")
        self.process = subprocess.Popen(
            self.command(),
            cwd=settings.BASE_DIR,
            env=self.environment(),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            self.wait_ready(timeout)
        except BaseException:
            self.stop()  # never leave a half-started server behind
            raise
        return self

    def wait_ready(self, timeout: float = 90.0) -> None:
        deadline = time.monotonic() + timeout
        last = "no answer"
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(f"server exited early:\n{self.logs()[-4000:]}")
            try:
                with urllib.request.urlopen(f"{self.url}/ready", timeout=2) as response:  # noqa: S310
                    if response.status == 200:
                        return
            except urllib.error.HTTPError as error:
                last = error.read().decode(errors="replace")
            except (urllib.error.URLError, ConnectionError, TimeoutError) as error:
                last = repr(error)
            time.sleep(0.2)
        raise RuntimeError(f"server not ready in {timeout}s ({last}):\n{self.logs()[-4000:]}")

    def stop(self, timeout: float = 20.0) -> int | None:
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        code = self.process.returncode
        self.process = None
        return code

    def logs(self) -> str:
        return self.log_path.read_text(errors="replace")

    def __enter__(self) -> LiveServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def load_settings(
    code: str = "import recall.settings", **environment: str
) -> subprocess.CompletedProcess[str]:
    """Import the settings in a fresh interpreter with ``environment`` and return the outcome."""
    env = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "OPENAI_API_KEY"}}
    env.update(environment)
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=settings.BASE_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def store_memory(
    user: Any,
    content: str,
    namespace: str = "default",
    embedding: Sequence[float] = (1.0, 0.0),
    *,
    agent: Any = None,
    **fields: Any,
) -> Any:
    """Store one memory without running the model, through the user's (or agent's) tenant path.

    For pages and admin views that list memories; the vector means nothing.
    ``fields`` are further columns: ``task_id``, ``source_kind``, ``path``...
    """
    from core import tenancy
    from memories.models import Memory

    digest = hashlib.sha256(f"{namespace}\0{content}".encode()).hexdigest()
    agent_id = agent.id if agent is not None else None
    with tenancy.tenant(user.id, agent_id=agent_id, task_id=fields.get("task_id")):
        return Memory.objects.create(
            user=user,
            agent_id=agent_id,
            namespace=namespace,
            content=content,
            content_hash=digest,
            embedding=list(embedding),
            embedding_model="t",
            **fields,
        )


def fill_memories(user_id: uuid.UUID | str, count: int) -> None:
    """Store ``count`` placeholder memories for a user (operator path), e.g. to reach a quota.

    Their vectors are zero: fine for counting and listing, useless for search.
    """
    from core import tenancy
    from memories import embeddings
    from memories.models import Memory

    model_id, dimensions = embeddings.model_spec()
    with tenancy.operator():
        Memory.objects.bulk_create(
            Memory(
                user_id=user_id,
                content=f"placeholder {n}",
                content_hash=f"{user_id}-{n}",
                embedding=[0.0] * dimensions,
                embedding_model=model_id,
            )
            for n in range(count)
        )


def at_once(count: int, call: Callable[[], T]) -> list[T]:
    """Run ``call`` on ``count`` threads released together (a double click, racing
    writers), each on connections of its own; return what each returned."""
    start = threading.Barrier(count)
    results: list[T] = []

    def run() -> None:
        try:
            start.wait(30)
            results.append(call())
        finally:
            connections.close_all()

    threads = [threading.Thread(target=run) for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return results
