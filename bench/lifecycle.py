"""Measure the memory lifecycle: background adds, the queue, and the query cache.

    python bench/lifecycle.py --json bench/results/lifecycle.json
    python bench/lifecycle.py --smoke        # seconds: checks that it runs

Three measurements, on a throwaway embedded PostgreSQL with the bundled model:

1. ``remember`` latency, synchronous (the model runs in the call) against
   ``async`` (validated, checked against the quota and queued; a worker stores
   it later), through ``memories.services`` as the tools call it, for a pro
   user and for free users (whose quota is counted, queued adds included;
   each holds at most 50), beside the floor of any durable write here: one
   INSERT and its COMMIT into a scratch table.
   The calls of the variants take turns, call by call. With ``--http``
   (default on) the same comparison over a real ``/mcp`` endpoint: stateless
   ``tools/call`` POSTs on one keep-alive connection to a uvicorn server.
2. Queue throughput: ``--jobs`` adds queued, then drained by 1, 2 and 4
   worker threads (``memories.jobs.Workers``, in this process), with the
   model and with the model stubbed (the queue's own cost: taking a job with
   SKIP LOCKED, storing, settling), in jobs per second.
3. The query-embedding cache: producing a query's vector on a hit in
   process, a hit in Redis (another process's entry; when ``redis-server`` is
   installed) and a miss (a model run), per query.

Medians of ``--passes`` passes; each pass's percentiles over ``--calls`` calls.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

_ROOT = str(Path(__file__).resolve().parent.parent)
if sys.path[0] == str(Path(__file__).resolve().parent):
    sys.path[0] = _ROOT
elif _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from bench import harness  # noqa: E402

WORDS = [
    *("alpha", "bravo", "coffee", "deploy", "engine", "forest", "garden", "harbour"),
    *("island", "jasmine", "kettle", "lantern", "meadow", "number", "orange", "pepper"),
    *("quartz", "river", "saddle", "timber", "umbrella", "violet", "window", "yellow"),
]


def sentence(rng: random.Random) -> str:
    return "The user noted " + " ".join(rng.choice(WORDS) for _ in range(12)) + "."


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=300, help="Calls per variant and pass.")
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=600, help="Adds queued per throughput run.")
    parser.add_argument("--threads", default="1,2,4", help="Worker threads to try.")
    parser.add_argument("--no-http", action="store_true", help="Skip the HTTP comparison.")
    parser.add_argument("--workdir", type=Path, help="Where the throwaway database lives.")
    parser.add_argument("--database-url", help="Use this (scratch!) database instead.")
    parser.add_argument("--json", type=Path, help="Write the results here.")
    parser.add_argument("--smoke", action="store_true", help="Tiny sizes, one pass.")
    args = parser.parse_args(argv)
    if args.smoke:
        args.calls, args.passes, args.jobs, args.threads = 20, 1, 20, "1,2"

    where = harness.configure(args.database_url, args.workdir)
    from memories import embeddings

    embedder = embeddings.get_embedder()
    embedder.load()
    report: dict[str, Any] = {
        "command": "python bench/lifecycle.py "
        + " ".join(argv if argv is not None else sys.argv[1:]),
        "machine": harness.machine(),
        "database": {"where": where, **harness.database_versions()},
        "model": embedder.model_id,
        "config": {"calls": args.calls, "passes": args.passes, "jobs": args.jobs},
    }
    users = Users()
    try:
        report["remember"] = remember_latency(users, args.calls, args.passes)
        if not args.no_http:
            report["remember_http"] = remember_over_http(users, args.calls, args.passes)
        threads = [int(n) for n in args.threads.split(",") if n.strip()]
        report["queue"] = queue_throughput(users, args.jobs, threads)
        report["cache"] = cache_latency(args.calls, args.passes)
    finally:
        users.cleanup()
    print_report(report)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0


class Users:
    def __init__(self) -> None:
        self.ids: list[Any] = []

    def make(self, tier: str) -> Any:
        from accounts import services as accounts_services

        user = accounts_services.create_user(
            email=f"bench-lifecycle-{uuid.uuid4().hex[:10]}@example.com", tier=tier
        )
        self.ids.append(user.id)
        return user

    def cleanup(self) -> None:
        from accounts.models import User
        from core import tenancy

        with tenancy.operator():
            User.objects.filter(id__in=self.ids).delete()


# 1. remember latency ----------------------------------------------------------------


def remember_latency(users: Users, calls: int, passes: int) -> dict[str, Any]:
    from django.db import connection, transaction

    from core import context
    from memories import services

    rng = random.Random(7)
    pro = users.make("pro")
    # Free users hold at most 100 memories, so the quota's counts stay small:
    # a new free user every 50 calls keeps them realistic.
    free: list[Any] = []

    def free_user() -> Any:
        if not free or free[-1][1] >= 50:
            free.append([users.make("free"), 0])
        free[-1][1] += 1
        return free[-1][0]

    with connection.cursor() as cursor:
        cursor.execute("CREATE TABLE IF NOT EXISTS bench_commit_floor (note text)")

    def commit_floor(text: str) -> None:
        # The least a durable write costs here: one INSERT and its COMMIT's WAL flush.
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("INSERT INTO bench_commit_floor VALUES (%s)", [text])

    variants: dict[str, Callable[[str], Any]] = {
        "sync": lambda text: services.remember(user_id=pro.id, tier="pro", content=text),
        "async": lambda text: services.remember(
            user_id=pro.id, tier="pro", content=text, background=True
        ),
        "async_free_tier": lambda text: services.remember(
            user_id=free_user().id, tier="free", content=text, background=True
        ),
        "commit_floor": commit_floor,
    }
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in variants}
    with context.acting_as("bench"):
        for _ in range(3):  # warm-up: connections, the model, the plans
            for fn in variants.values():
                fn(sentence(rng))
        for _ in range(passes):
            samples: dict[str, list[float]] = {name: [] for name in variants}
            order = list(variants)
            for _ in range(calls):
                # Take turns at going first, so that noise falls on every variant alike.
                rng.shuffle(order)
                for name in order:
                    ms, _ = harness.timed(partial(variants[name], sentence(rng)))
                    samples[name].append(ms)
            for name, values in samples.items():
                runs[name].append(harness.percentiles(values))
    _drain()
    return {name: harness.median_of_runs(results) for name, results in runs.items()}


def _drain() -> None:
    from memories import services

    while services.run_next_job():
        pass


def remember_over_http(users: Users, calls: int, passes: int) -> dict[str, Any]:
    import httpx2

    from accounts import services as accounts_services
    from tests.support import LiveServer

    user = users.make("pro")
    _, raw = accounts_services.issue_key(user=user, name="bench")
    rng = random.Random(11)
    runs: dict[str, list[dict[str, Any]]] = {"sync": [], "async": []}
    unlimited = {f"RATE_LIMIT_{tier}": "1000000/min" for tier in ("FREE", "STARTER", "PRO", "TEAM")}
    with LiveServer(env={"JOB_WORKERS": "0", "LOG_LEVEL": "warning", **unlimited}) as server:
        headers = {
            "Authorization": f"Bearer {raw}",
            "Content-Type": "application/json",
            "Accept": "application/json, text/event-stream",
            "MCP-Protocol-Version": "2025-11-25",
        }
        with httpx2.Client(headers=headers, timeout=60) as client:

            def call(background: bool) -> None:
                arguments = {"content": sentence(rng), "async": background}
                body = {
                    "jsonrpc": "2.0",
                    "id": 1,
                    "method": "tools/call",
                    "params": {"name": "remember", "arguments": arguments},
                }
                response = client.post(server.mcp_url, content=json.dumps(body))
                result = response.json().get("result")
                if response.status_code != 200 or result is None or result.get("isError"):
                    raise RuntimeError(f"remember failed: {response.status_code} {response.text}")

            for _ in range(5):
                call(False)
                call(True)
            for _ in range(passes):
                samples: dict[str, list[float]] = {"sync": [], "async": []}
                for n in range(calls):
                    for name in ("sync", "async") if n % 2 else ("async", "sync"):
                        ms, _ = harness.timed(partial(call, name == "async"))
                        samples[name].append(ms)
                for name, values in samples.items():
                    runs[name].append(harness.percentiles(values))
    _drain()
    return {name: harness.median_of_runs(results) for name, results in runs.items()}


# 2. queue throughput ------------------------------------------------------------------


def queue_throughput(users: Users, jobs_count: int, threads: list[int]) -> dict[str, Any]:
    from django.test import override_settings

    from memories import embeddings, jobs

    real = embeddings.get_embedder()
    rng = random.Random(13)
    pool = real.embed([sentence(rng) for _ in range(64)])
    out: dict[str, Any] = {}
    for label, embedder in (("model", real), ("stubbed", harness.stub_embedder(real, {}, pool))):
        results = {}
        for count in threads:
            user = users.make("pro")
            texts = [sentence(rng) for _ in range(jobs_count)]
            queued_ms, _ = harness.timed(partial(_enqueue_all, user.id, texts))
            with harness.using_embedder(embedder), override_settings(JOB_POLL_SECONDS=0.05):
                started = time.perf_counter()
                workers = jobs.Workers(threads=count, maintenance=False).start()
                try:
                    while _pending() and time.perf_counter() - started < 600:
                        time.sleep(0.02)
                    seconds = time.perf_counter() - started
                finally:
                    workers.stop()
            results[str(count)] = {
                "jobs": jobs_count,
                "seconds": round(seconds, 2),
                "jobs_per_s": round(jobs_count / seconds, 1),
                "enqueued_per_s": round(jobs_count / (queued_ms / 1000), 1),
            }
            print(f"  queue {label}, {count} threads: {results[str(count)]}", flush=True)
        out[label] = results
    return out


def _enqueue_all(user_id: Any, texts: list[str]) -> None:
    from memories import services

    for text in texts:
        services.remember(user_id=user_id, tier="pro", content=text, background=True)


def _pending() -> int:
    from memories import services

    return int(services.queue_depth()["depth"])


# 3. the query cache -------------------------------------------------------------------


def cache_latency(calls: int, passes: int) -> dict[str, Any]:
    from memories import embeddings
    from memories.embeddings.cache import QueryCache

    model = embeddings.get_embedder()
    rng = random.Random(17)
    redis = RedisProcess.start()
    runs: dict[str, list[dict[str, Any]]] = {"hit": [], "miss": [], "shared_hit": []}
    try:
        for _ in range(passes):
            queries = [f"what did the user say about {sentence(rng)}" for _ in range(calls)]
            url = redis.url if redis else None
            here = QueryCache(max_entries=10 * calls, ttl=3600, redis_url=url)
            runs["miss"].append(_time_each(here, model, queries))
            runs["hit"].append(_time_each(here, model, queries))
            if redis:
                # Another process's cache: empty here, filled in Redis by the first.
                there = QueryCache(max_entries=10 * calls, ttl=3600, redis_url=url)
                runs["shared_hit"].append(_time_each(there, model, queries))
                there.close()
            here.close()
    finally:
        if redis:
            redis.stop()
    result = {name: harness.median_of_runs(r) for name, r in runs.items() if r}
    if "hit" in result and "miss" in result:
        result["miss_over_hit_p50"] = round(result["miss"]["p50"] / result["hit"]["p50"], 1)
    return result


def _time_each(cache: Any, model: Any, queries: list[str]) -> dict[str, Any]:
    samples = []
    for query in queries:
        ms, _ = harness.timed(partial(cache.embed, model, query, scope="ubench"))
        samples.append(ms)
    return harness.percentiles(samples)


class RedisProcess:
    """A throwaway redis-server, when one is installed."""

    def __init__(self, process: subprocess.Popen[bytes], port: int, workdir: str) -> None:
        self.process, self.port, self.workdir = process, port, workdir

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @classmethod
    def start(cls) -> RedisProcess | None:
        binary = shutil.which("redis-server")
        if binary is None:
            print("  redis-server not installed: no shared-cache figure", flush=True)
            return None
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        workdir = tempfile.mkdtemp(prefix="recall-bench-redis-")
        process = subprocess.Popen(
            [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--dir", workdir],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        import redis

        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with redis.Redis(port=port, socket_timeout=1) as client:
                    if client.ping():
                        return cls(process, port, workdir)
            except redis.ConnectionError:
                time.sleep(0.05)
        process.kill()
        raise RuntimeError("redis-server did not start")

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(10)
        shutil.rmtree(self.workdir, ignore_errors=True)


# Report -------------------------------------------------------------------------------


def print_report(report: dict[str, Any]) -> None:
    rows = [
        [f"remember {name}", r["p50"], r["p95"], r["p99"]] for name, r in report["remember"].items()
    ]
    rows += [
        [f"remember over HTTP, {name}", r["p50"], r["p95"], r["p99"]]
        for name, r in report.get("remember_http", {}).items()
    ]
    rows += [
        [f"query vector, cache {name}", r["p50"], r["p95"], r["p99"]]
        for name, r in report["cache"].items()
        if isinstance(r, dict)
    ]
    harness.print_table(rows, ["", "p50 ms", "p95 ms", "p99 ms"])
    queue_rows = [
        [label, threads, r["jobs_per_s"], r["enqueued_per_s"]]
        for label, by_threads in report["queue"].items()
        for threads, r in by_threads.items()
    ]
    harness.print_table(queue_rows, ["queue", "threads", "jobs/s drained", "jobs/s queued"])


if __name__ == "__main__":
    raise SystemExit(main())
