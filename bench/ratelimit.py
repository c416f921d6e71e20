"""Measure rate-limit checks per second and per-check latency.

    python bench/ratelimit.py                      # in-memory and shared memory
    python bench/ratelimit.py --redis-url redis://127.0.0.1:6379/0 --threads 8
    python bench/ratelimit.py --processes 2        # shared memory, checked from 2 processes at once

Redis runs use their own key prefix (recall:bench:) and leave keys that
expire by themselves within a minute or so.
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import sys
import threading
import time
from pathlib import Path

import redis

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from accounts.ratelimit import (
    FailoverRateLimiter,
    InMemoryRateLimiter,
    RateLimiter,
    RedisRateLimiter,
    SharedMemoryRateLimiter,
)
from core.sharedstate import SharedState


def run(
    limiter: RateLimiter, *, checks: int, threads: int, keys: int
) -> tuple[float, list[int], int]:
    """Return (seconds, per-check latencies in ns, checks allowed)."""
    per_thread = checks // threads
    # Fresh keys each run, so earlier runs against the same Redis leave no empty buckets.
    run_id = time.time_ns()
    start = threading.Barrier(threads + 1)
    latencies: list[list[int]] = [[] for _ in range(threads)]
    allowed = [0] * threads

    def work(n: int) -> None:
        names = [f"{run_id}-{(n * per_thread + i) % keys}" for i in range(per_thread)]
        mine = latencies[n]
        start.wait()
        for name in names:
            t0 = time.perf_counter_ns()
            decision = limiter.check(name, 60, 1.0)
            mine.append(time.perf_counter_ns() - t0)
            allowed[n] += decision.allowed

    workers = [threading.Thread(target=work, args=(n,)) for n in range(threads)]
    for worker in workers:
        worker.start()
    start.wait()
    began = time.perf_counter()
    for worker in workers:
        worker.join()
    elapsed = time.perf_counter() - began
    return elapsed, [ns for chunk in latencies for ns in chunk], sum(allowed)


def _in_process(path: str, args: argparse.Namespace, results: multiprocessing.Queue) -> None:
    limiter = SharedMemoryRateLimiter(SharedState.attach(path))
    run(limiter, checks=min(args.checks, 1000), threads=1, keys=args.keys)  # warm up
    results.put(run(limiter, checks=args.checks, threads=args.threads, keys=args.keys))


def report_processes(state: SharedState, args: argparse.Namespace) -> None:
    """Shared memory checked from ``--processes`` processes at once, as the workers do."""
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    procs = [
        context.Process(target=_in_process, args=(str(state.path), args, results))
        for _ in range(args.processes)
    ]
    for proc in procs:
        proc.start()
    outcomes = [results.get() for _ in procs]
    for proc in procs:
        proc.join()
    latencies = sorted(ns for _, chunk, _ in outcomes for ns in chunk)
    # Each process's own rate, summed: they ran side by side.
    rate = sum(len(chunk) / elapsed for elapsed, chunk, _ in outcomes)
    allowed = sum(count for _, _, count in outcomes)
    print_row(f"shared x{args.processes} procs", args, rate, latencies, allowed)


def report(name: str, limiter: RateLimiter, args: argparse.Namespace) -> None:
    run(limiter, checks=min(args.checks, 1000), threads=1, keys=args.keys)  # warm up
    elapsed, latencies, allowed = run(
        limiter, checks=args.checks, threads=args.threads, keys=args.keys
    )
    print_row(name, args, len(latencies) / elapsed, sorted(latencies), allowed)


def print_row(
    name: str, args: argparse.Namespace, rate: float, latencies: list[int], allowed: int
) -> None:
    median_us = statistics.median(latencies) / 1000
    p99_us = latencies[int(len(latencies) * 0.99) - 1] / 1000
    print(
        f"{name:<18} threads={args.threads:<3} checks={len(latencies):<8} "
        f"{rate:>12,.0f} checks/s  "
        f"median {median_us:8.1f} us  p99 {p99_us:8.1f} us  allowed {allowed / len(latencies):.0%}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--checks", type=int, default=50_000, help="checks per backend")
    parser.add_argument("--threads", type=int, default=1, help="threads checking at once")
    parser.add_argument("--keys", type=int, default=1000, help="distinct keys to spread over")
    parser.add_argument("--redis-url", help="also measure Redis and the Redis failover wrapper")
    parser.add_argument(
        "--processes", type=int, default=1, help="also check shared memory from N processes"
    )
    args = parser.parse_args()
    if args.checks < args.threads or args.threads < 1 or args.keys < 1:
        parser.error("need --threads >= 1, --keys >= 1 and --checks >= --threads")

    report("memory", InMemoryRateLimiter(), args)
    state = SharedState.create()
    try:
        report("shared memory", SharedMemoryRateLimiter(state), args)
        if args.processes > 1:
            report_processes(state, args)
    finally:
        state.remove()
    if args.redis_url:
        redis_limiter = RedisRateLimiter(args.redis_url, prefix="recall:bench:")
        try:
            redis_limiter.client.ping()
        except redis.RedisError as exc:
            sys.exit(f"Cannot reach {args.redis_url}: {exc}")
        report("redis", redis_limiter, args)
        report("failover(redis)", FailoverRateLimiter(redis_limiter, InMemoryRateLimiter()), args)
        redis_limiter.close()


if __name__ == "__main__":
    main()
