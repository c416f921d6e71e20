"""Soak: 128 concurrent MCP clients, a mixed workload, for 10 minutes against `recall serve`.

    python bench/soak.py --json soak.json                 # 128 clients, 10 minutes
    python bench/soak.py --clients 64 --minutes 30
    python bench/soak.py --smoke --json smoke.json        # 8 clients, 20 seconds (CI)

The script starts ``python -m recall serve`` itself, on a free port with a
throwaway data directory (``bench/http.py``'s ``Server``), creates a pro-tier
key for most clients and a free-tier key, at the real free limit of 10 calls
a minute, for one client in sixteen, so the run exercises 429s as well.
Every client is a stateless 2025-11-25 MCP client on a keep-alive
connection: it stores memories, searches them, lists them, updates and
forgets the ones it stored, in the ``--mix`` proportions, with no pause
between calls (a 429 waits its Retry-After, up to a second).

It reports: calls by tool and outcome; every error other than a 429 (the run
exits non-zero if there is one), and the server's error log lines by what
failed and where (exception type, SQLSTATE, frames: no content);
p50/p95/p99 latency per tool and overall, after the warm-up; and the
server's resident memory (the Python process, and PostgreSQL's proportional
share) sampled every 10 seconds, with the growth from the end of warm-up to
the end of the run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing
import random
import sys
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.http import (  # noqa: E402
    HttpConnection,
    Server,
    machine,
    outcome,
    synthetic_queries,
    synthetic_sentences,
    tools_call,
)

DEFAULT_MIX = "remember=30,recall=40,list_memories=15,update_memory=10,forget=5"
NAMESPACES = ["soak", "soak:work", "soak:home"]
SAMPLE_EVERY = 10.0  # seconds between memory samples


@dataclass
class Plan:
    url: str
    keys: list[str]  # one per client of this process
    mix: dict[str, float]
    start: float  # time.time() when the run starts (warm-up included)
    warmup: float
    duration: float
    seed: int


@dataclass
class Tally:
    latencies: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    outcomes: Counter[str] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)


def run_process(plan: Plan, results: Any) -> None:
    try:
        tally = asyncio.run(_run(plan))
        results.put(
            {"latencies": dict(tally.latencies), "outcomes": tally.outcomes, "errors": tally.errors}
        )
    except BaseException as exc:  # report rather than hang the parent
        results.put({"crashed": f"{type(exc).__name__}: {exc}"})


def arguments(
    tool: str, rng: random.Random, mine: list[str], text: str, query: str, n: int
) -> dict[str, Any]:
    """Arguments for one call of ``tool``; ``forget`` takes its id out of ``mine``."""
    namespace = rng.choice(NAMESPACES)
    if tool == "remember":
        return {"content": text, "namespace": namespace, "metadata": {"n": n}}
    if tool == "recall":
        return {"query": query, "namespace": namespace, "limit": 10}
    if tool == "list_memories":
        return {"namespace": namespace, "limit": 20, "offset": rng.choice([0, 0, 20])}
    if tool == "update_memory":
        return {"id": rng.choice(mine), "metadata": {"updated": n}}
    return {"mode": "by_id", "id": mine.pop(rng.randrange(len(mine)))}


def stored_id(payload: bytes) -> str | None:
    """The id a successful ``remember`` stored, or None if it was a duplicate."""
    stored = json.loads(payload)["result"]["structuredContent"]
    return None if stored["deduped"] else str(stored["id"])


async def _run(plan: Plan) -> Tally:
    tally = Tally()
    sentences = synthetic_sentences(4000, seed=plan.seed)
    queries = synthetic_queries(500, seed=plan.seed + 1)
    start = time.monotonic() + (plan.start - time.time())
    measure_from = start + plan.warmup
    stop_at = measure_from + plan.duration
    tools = list(plan.mix)
    weights = [plan.mix[t] for t in tools]

    def count(tool: str, result: str, started: float, finished: float) -> None:
        if started >= measure_from and finished <= stop_at:
            tally.outcomes[f"{tool} {result}"] += 1
            if result == "ok":
                tally.latencies[tool].append((finished - started) * 1000)
            elif result != "rate_limited":
                tally.errors[f"{tool} {result}"] += 1
        elif result not in ("ok", "rate_limited"):
            tally.errors[f"warm-up {tool} {result}"] += 1

    async def client(index: int, key: str) -> None:
        rng = random.Random(plan.seed * 1000 + index)
        connection = HttpConnection(plan.url, key)
        mine: list[str] = []  # ids this client stored and has not forgotten
        n = 0
        await asyncio.sleep(max(0.0, start - time.monotonic()) + rng.random())
        try:
            while time.monotonic() < stop_at:
                tool = rng.choices(tools, weights)[0]
                if tool in ("update_memory", "forget") and not mine:
                    tool = "remember"
                n += 1
                text = f"{rng.choice(sentences)} ({index}-{n})"
                args = arguments(tool, rng, mine, text, rng.choice(queries), n)
                started = time.monotonic()
                try:
                    status, payload = await connection.post(tools_call(n, tool, args))
                    result = outcome(status, payload)
                except Exception as exc:
                    result, payload = f"exception_{type(exc).__name__}", b""
                count(tool, result, started, time.monotonic())
                if result == "ok" and tool == "remember" and (new := stored_id(payload)):
                    mine.append(new)
                if result == "rate_limited":
                    await asyncio.sleep(1.0)
        finally:
            await connection.close()

    await asyncio.gather(*(client(i, key) for i, key in enumerate(plan.keys)))
    return tally


class MemoryWatch(threading.Thread):
    """Sample the server's RSS and PostgreSQL's PSS every ``SAMPLE_EVERY`` seconds."""

    def __init__(self, server_pid: int, postmaster_pid: int | None) -> None:
        super().__init__(daemon=True)
        self.server = psutil.Process(server_pid)
        self.postmaster_pid = postmaster_pid
        self.samples: list[dict[str, float]] = []
        self.started = time.monotonic()
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            self.samples.append(self.sample())
            self._halt.wait(SAMPLE_EVERY)

    def stop(self) -> None:
        self._halt.set()
        self.join(5)
        self.samples.append(self.sample())

    def sample(self) -> dict[str, float]:
        mib = 1024 * 1024
        entry = {
            "t_s": round(time.monotonic() - self.started, 1),
            "server_rss_mib": round(self.server.memory_info().rss / mib, 1),
        }
        if self.postmaster_pid:
            total = 0
            with contextlib.suppress(psutil.Error):
                postmaster = psutil.Process(self.postmaster_pid)
                for proc in [postmaster, *postmaster.children()]:
                    with contextlib.suppress(psutil.Error):
                        info = proc.memory_full_info()
                        total += getattr(info, "pss", info.rss)
            entry["postgres_pss_mib"] = round(total / mib, 1)
        return entry


def percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    ordered = sorted(values)

    def at(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 1)

    return {"p50": at(0.50), "p95": at(0.95), "p99": at(0.99), "count": len(ordered)}


def growth(samples: list[dict[str, float]], warmup: float, key: str) -> dict[str, float]:
    after = [s for s in samples if s["t_s"] >= warmup and key in s]
    if len(after) < 2:
        return {}
    first, last = after[0][key], after[-1][key]
    return {
        "after_warmup_mib": first,
        "end_mib": last,
        "peak_mib": max(s[key] for s in after),
        "growth_pct": round(100 * (last - first) / first, 1) if first else 0.0,
    }


def parse_mix(text: str) -> dict[str, float]:
    mix = {}
    for part in text.split(","):
        tool, _, weight = part.partition("=")
        mix[tool.strip()] = float(weight)
    return mix


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=128)
    parser.add_argument("--minutes", type=float, default=10.0, help="measured, after warm-up")
    parser.add_argument("--warmup", type=float, default=60.0, help="seconds")
    parser.add_argument("--processes", type=int, default=2, help="client processes")
    parser.add_argument("--mix", default=DEFAULT_MIX)
    parser.add_argument("--json", type=Path, help="write the report here")
    parser.add_argument("--smoke", action="store_true", help="8 clients, 20 s: for CI")
    args = parser.parse_args(argv)
    if args.smoke:
        args.clients, args.minutes, args.warmup, args.processes = 8, 0.25, 5.0, 1

    # The real free-tier rate (bench/http.py's Server raises every tier's);
    # the free quota lifted, so free clients meet the rate limit, not the quota.
    server = Server(
        {"RATE_LIMIT_FREE": "10/min", "FREE_TIER_MAX_MEMORIES": "1000000"}, pg_stats=False
    ).start()
    try:
        pro = server.pro_key()
        server.manage("create-user", "free@example.com", "--tier", "free")
        free = server.manage("create-key", "free@example.com", "--name", "soak").strip()
        keys = [free if n % 16 == 15 or n == args.clients - 1 else pro for n in range(args.clients)]
        postmaster = _postmaster_pid(server.data_dir)
        assert server.process is not None
        watch = MemoryWatch(server.process.pid, postmaster)
        watch.start()
        start = time.time() + 2
        duration = args.minutes * 60
        context = multiprocessing.get_context("spawn")
        results = context.Queue()
        workers = [
            context.Process(
                target=run_process,
                args=(
                    Plan(
                        url=server.mcp_url,
                        keys=keys[n :: args.processes],
                        mix=parse_mix(args.mix),
                        start=start,
                        warmup=args.warmup,
                        duration=duration,
                        seed=n + 1,
                    ),
                    results,
                ),
            )
            for n in range(args.processes)
        ]
        for worker in workers:
            worker.start()
        tallies = [results.get(timeout=args.warmup + duration + 300) for _ in workers]
        for worker in workers:
            worker.join(30)
        watch.stop()
        ready = json.loads(_get(f"{server.url}/ready"))
    finally:
        server.stop()
        server_logs = server.logs()
        server.cleanup()

    merged = Tally()
    for tally in tallies:
        if "crashed" in tally:
            raise SystemExit(f"a client process crashed: {tally['crashed']}")
        for tool, values in tally["latencies"].items():
            merged.latencies[tool].extend(values)
        merged.outcomes.update(tally["outcomes"])
        merged.errors.update(tally["errors"])
    calls = sum(merged.outcomes.values())
    limited = sum(n for key, n in merged.outcomes.items() if key.endswith("rate_limited"))
    report = {
        "machine": machine(),
        "config": {
            "clients": args.clients,
            "free_tier_clients": keys.count(free),
            "minutes": args.minutes,
            "warmup_s": args.warmup,
            "mix": parse_mix(args.mix),
            "processes": args.processes,
        },
        "calls": calls,
        "calls_per_s": round(calls / duration, 1),
        "rate_limited": limited,
        "errors": dict(merged.errors),
        "outcomes": dict(sorted(merged.outcomes.items())),
        "latency_ms": {
            "all": percentiles([v for values in merged.latencies.values() for v in values]),
            **{tool: percentiles(values) for tool, values in sorted(merged.latencies.items())},
        },
        "memory": {
            "server_rss": growth(watch.samples, args.warmup, "server_rss_mib"),
            "postgres_pss": growth(watch.samples, args.warmup, "postgres_pss_mib"),
            "samples": watch.samples,
        },
        "usage_events_at_end": ready.get("usage_events"),
        "error_log_lines": sum('"level": "error"' in line for line in server_logs.splitlines()),
        "error_log": server_errors(server_logs),
    }
    _print(report)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return 1 if merged.errors or report["error_log_lines"] else 0


# What a server error line may show: what failed and where, never what it was
# given (the server logs no content or keys, and this keeps to named fields).
_ERROR_FIELDS = ("event", "tool", "error_code", "exc_type", "sqlstate", "constraint")


def server_errors(logs: str) -> list[dict[str, Any]]:
    """The server's error-level log lines, alike ones counted once: what failed, and where.

    Each is the line's named fields (``_ERROR_FIELDS``), the innermost frame
    of this repository (``origin``) and the last three of its frames here,
    so a failed run says which error it met (a deadlock is ``sqlstate``
    40P01) and where, without a rerun.
    """
    seen: Counter[str] = Counter()
    for line in logs.splitlines():
        if '"level": "error"' not in line:
            continue
        try:
            entry = json.loads(line)
        except ValueError:
            entry = {"event": "an error line that is not JSON"}
        summary: dict[str, Any] = {k: entry[k] for k in _ERROR_FIELDS if entry.get(k)}
        if _ours(str(entry.get("origin") or "")):
            summary["origin"] = _ours(entry["origin"])
        frames = [_ours(f) for f in entry.get("frames") or [] if _ours(f)]
        if frames:
            summary["frames"] = frames[-3:]
        seen[json.dumps(summary, sort_keys=True)] += 1
    return [{**json.loads(key), "count": n} for key, n in seen.items()]


def _ours(frame: str) -> str:
    """A frame in this repository, relative to it; '' for a library's."""
    root = f"{REPO}/"
    if not frame.startswith(root) or "/.venv/" in frame or "site-packages" in frame:
        return ""
    return frame[len(root) :]


def _postmaster_pid(data_dir: Path) -> int | None:
    pid_file = data_dir / "pgdata" / "postmaster.pid"
    return int(pid_file.read_text().split()[0]) if pid_file.exists() else None


def _get(url: str) -> str:
    import urllib.request

    with urllib.request.urlopen(url, timeout=30) as response:  # noqa: S310 - loopback
        return response.read().decode()


def _print(report: dict[str, Any]) -> None:
    config = report["config"]
    print(
        f"soak: {config['clients']} clients ({config['free_tier_clients']} free tier), "
        f"{config['minutes']} min after {config['warmup_s']:.0f} s warm-up"
    )
    print(
        f"calls: {report['calls']} ({report['calls_per_s']}/s), 429: {report['rate_limited']}, "
        f"errors other than 429: {sum(report['errors'].values())} {report['errors'] or ''}"
    )
    for tool, stats in report["latency_ms"].items():
        if stats:
            print(
                f"  {tool:<14} p50 {stats['p50']:>7.1f} ms  p95 {stats['p95']:>7.1f} ms  "
                f"p99 {stats['p99']:>7.1f} ms  n={stats['count']}"
            )
    for name, stats in (
        ("server RSS", report["memory"]["server_rss"]),
        ("PostgreSQL PSS", report["memory"]["postgres_pss"]),
    ):
        if stats:
            print(
                f"{name}: {stats['after_warmup_mib']} MiB after warm-up, {stats['end_mib']} MiB "
                f"at the end ({stats['growth_pct']:+.1f}%), peak {stats['peak_mib']} MiB"
            )
    print(f"usage events at the end: {report['usage_events_at_end']}")
    print(f"error-level log lines: {report['error_log_lines']}")
    for entry in report["error_log"]:
        where = " <- ".join(reversed(entry.get("frames", []))) or entry.get("origin", "")
        named = ", ".join(f"{k}={entry[k]}" for k in _ERROR_FIELDS if k in entry)
        print(f"  x{entry['count']} {named}" + (f" at {where}" if where else ""))


if __name__ == "__main__":
    raise SystemExit(main())
