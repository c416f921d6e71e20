from __future__ import annotations

import logging
import math
import multiprocessing
import os
import socket
import threading
from collections.abc import Iterator

import pytest
import redis

from accounts import ratelimit
from accounts.ratelimit import (
    KEY_PREFIX,
    FailoverRateLimiter,
    InMemoryRateLimiter,
    LimiterUnavailable,
    RedisRateLimiter,
)
from accounts.tests.conftest import FakeClock

CAPACITY = 10
RATE = 10 / 60
# For tests that must see no refill at all while they run.
NO_REFILL = 1e-6


@pytest.fixture
def limiter(redis_url: str) -> Iterator[RedisRateLimiter]:
    limiter = RedisRateLimiter(redis_url)
    yield limiter
    limiter.close()


def age(limiter: RedisRateLimiter, key: str, seconds: float) -> None:
    """Move a bucket's last update into the past, as if ``seconds`` had gone by."""
    stored = limiter.client.hget(KEY_PREFIX + key, "ts")
    assert isinstance(stored, bytes)
    ts = float(stored)
    limiter.client.hset(KEY_PREFIX + key, "ts", repr(ts - seconds))


def exhaust(limiter: RedisRateLimiter, key: str = "alice") -> None:
    for _ in range(CAPACITY):
        assert limiter.check(key, CAPACITY, RATE).allowed
    assert not limiter.check(key, CAPACITY, RATE).allowed


def test_it_allows_a_burst_up_to_capacity_then_denies(limiter):
    decisions = [limiter.check("alice", CAPACITY, RATE) for _ in range(CAPACITY + 2)]

    assert [d.allowed for d in decisions] == [True] * CAPACITY + [False, False]
    assert [d.remaining for d in decisions] == [*range(CAPACITY - 1, -1, -1), 0, 0]
    assert {(d.backend, d.limit) for d in decisions} == {("redis", CAPACITY)}


def test_it_refills_lazily_as_time_passes(limiter):
    exhaust(limiter)

    age(limiter, "alice", 6)

    assert limiter.check("alice", CAPACITY, RATE).allowed
    assert not limiter.check("alice", CAPACITY, RATE).allowed


def test_an_idle_key_never_holds_more_than_capacity(limiter):
    limiter.check("alice", CAPACITY, RATE)
    age(limiter, "alice", 86400)

    decisions = [limiter.check("alice", CAPACITY, RATE) for _ in range(CAPACITY + 1)]

    assert decisions[0].remaining == CAPACITY - 1
    assert sum(d.allowed for d in decisions) == CAPACITY


def test_retry_after_is_the_wait_for_one_whole_token(limiter):
    exhaust(limiter)

    denied = limiter.check("alice", CAPACITY, RATE)
    assert 5.0 < denied.retry_after <= 6.0

    age(limiter, "alice", 2.5)
    denied = limiter.check("alice", CAPACITY, RATE)
    assert not denied.allowed
    assert 3.0 < denied.retry_after <= 3.5
    assert math.ceil(denied.retry_after) == 4


def test_denied_requests_do_not_consume_tokens(limiter):
    exhaust(limiter)
    stored = limiter.client.hgetall(KEY_PREFIX + "alice")
    for _ in range(20):
        assert not limiter.check("alice", CAPACITY, RATE).allowed
    assert limiter.client.hgetall(KEY_PREFIX + "alice") == stored

    age(limiter, "alice", 6)

    assert limiter.check("alice", CAPACITY, RATE).allowed
    assert not limiter.check("alice", CAPACITY, RATE).allowed


def test_buckets_are_namespaced_and_expire_once_full_again(limiter):
    limiter.check("alice", CAPACITY, RATE)

    assert limiter.client.keys("*") == [b"recall:rl:alice"]
    # One token short, refilling one every 6 s, plus a second of slack.
    assert 6000 < limiter.client.pttl("recall:rl:alice") <= 7000


def test_the_script_is_loaded_once_and_run_by_sha(limiter, redis_url):
    other_process = RedisRateLimiter(redis_url)
    for _ in range(10):
        limiter.check("alice", CAPACITY, RATE)
        other_process.check("charlie", CAPACITY, RATE)
    other_process.close()

    stats = limiter.client.info("commandstats")
    assert stats["cmdstat_script|load"]["calls"] == 1
    assert stats["cmdstat_evalsha"]["calls"] >= 20
    assert "cmdstat_eval" not in stats


def hammer(url: str, key: str, attempts: int, start, results) -> None:
    limiter = RedisRateLimiter(url)
    start.wait()
    admitted = sum(limiter.check(key, 200, NO_REFILL).allowed for _ in range(attempts))
    results.put((os.getpid(), admitted))
    limiter.close()


def test_two_processes_sharing_a_key_admit_no_more_than_capacity(redis_url):
    context = multiprocessing.get_context("spawn")
    start = context.Barrier(2)
    results = context.Queue()
    workers = [
        context.Process(target=hammer, args=(redis_url, "alice", 300, start, results))
        for _ in range(2)
    ]
    for worker in workers:
        worker.start()
    outcomes = [results.get(timeout=60) for _ in workers]
    for worker in workers:
        worker.join(timeout=60)

    pids = {pid for pid, _ in outcomes}
    assert len(pids) == 2 and os.getpid() not in pids
    assert sum(admitted for _, admitted in outcomes) == 200


class CountingLimiter:
    """Wraps a limiter and counts the checks that reach it."""

    def __init__(self, inner: RedisRateLimiter) -> None:
        self.inner = inner
        self.calls = 0

    def check(self, key: str, capacity: int, refill_per_s: float) -> ratelimit.RateDecision:
        self.calls += 1
        return self.inner.check(key, capacity, refill_per_s)

    def close(self) -> None:
        self.inner.close()


def failover(url: str, clock: FakeClock) -> tuple[FailoverRateLimiter, CountingLimiter]:
    primary = CountingLimiter(RedisRateLimiter(url))
    return FailoverRateLimiter(primary, InMemoryRateLimiter(), backoff=5.0, clock=clock), primary


def warnings_from(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [
        r for r in caplog.records if r.name == "accounts.ratelimit" and r.levelno >= logging.WARNING
    ]


def test_it_fails_open_to_local_limits_when_redis_dies(own_redis_server, fake_clock, caplog):
    limiter, primary = failover(own_redis_server.url, fake_clock)
    for _ in range(3):
        decision = limiter.check("alice", CAPACITY, NO_REFILL)
        assert decision.allowed
        assert decision.backend == "redis"

    own_redis_server.stop()
    with caplog.at_level(logging.INFO, logger="accounts.ratelimit"):
        decisions = []
        for _ in range(CAPACITY + 5):
            decisions.append(limiter.check("bob", CAPACITY, NO_REFILL))
            assert decisions[-1].backend == "memory"

    # Still limited, by this process alone.
    assert [d.allowed for d in decisions] == [True] * CAPACITY + [False] * 5
    assert limiter.degraded
    assert len(warnings_from(caplog)) == 1
    assert "unavailable" in warnings_from(caplog)[0].getMessage()
    # Only the first request waited on the dead Redis; the rest went straight to memory.
    assert primary.calls == 4
    limiter.close()


def test_it_probes_once_per_backoff_and_resumes_shared_limits(own_redis_server, fake_clock, caplog):
    limiter, primary = failover(own_redis_server.url, fake_clock)
    other_process, _ = failover(own_redis_server.url, fake_clock)
    limiter.check("alice", CAPACITY, NO_REFILL)
    own_redis_server.stop()

    with caplog.at_level(logging.INFO, logger="accounts.ratelimit"):
        limiter.check("alice", CAPACITY, NO_REFILL)
        fake_clock.advance(5.0)
        limiter.check("alice", CAPACITY, NO_REFILL)  # probes, still down
        limiter.check("alice", CAPACITY, NO_REFILL)
        assert primary.calls == 3
        assert len(warnings_from(caplog)) == 1

        own_redis_server.start()
        decision = limiter.check("alice", CAPACITY, NO_REFILL)
        assert decision.backend == "memory"  # the backoff has not run out
        assert primary.calls == 3

        fake_clock.advance(5.0)
        decision = limiter.check("alice", CAPACITY, NO_REFILL)
        assert decision.backend == "redis"
        assert not limiter.degraded

    assert len(warnings_from(caplog)) == 1
    assert any("back" in r.getMessage() for r in caplog.records if r.levelno == logging.INFO)
    # Both "processes" draw from Redis again, so together they get one allowance.
    decisions = [
        process.check("charlie", 4, NO_REFILL)
        for _ in range(6)
        for process in (limiter, other_process)
    ]
    assert sum(decision.allowed for decision in decisions) == 4
    assert {decision.backend for decision in decisions} == {"redis"}
    limiter.close()
    other_process.close()


class FlakyLimiter:
    """Answers its first check only when released; fails every later one."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self.calls = 0

    def check(self, key: str, capacity: int, refill_per_s: float) -> ratelimit.RateDecision:
        self.calls += 1
        if self.calls > 1:
            raise LimiterUnavailable("down")
        self.entered.set()
        self.release.wait(timeout=10)
        return ratelimit.RateDecision(True, 0, 0.0, 1, 0.0, "test")

    def close(self) -> None:
        pass


def test_a_late_answer_from_before_the_outage_does_not_end_it(fake_clock, caplog):
    primary = FlakyLimiter()
    limiter = FailoverRateLimiter(primary, InMemoryRateLimiter(), clock=fake_clock)
    slow = threading.Thread(target=limiter.check, args=("alice", CAPACITY, RATE))
    slow.start()
    primary.entered.wait(timeout=10)

    with caplog.at_level(logging.INFO, logger="accounts.ratelimit"):
        limiter.check("bob", CAPACITY, RATE)  # finds the outage
        primary.release.set()
        slow.join()
        for _ in range(5):
            limiter.check("bob", CAPACITY, RATE)

    assert limiter.degraded
    assert primary.calls == 2
    assert len(warnings_from(caplog)) == 1


@pytest.fixture
def hung_redis() -> Iterator[tuple[str, list[socket.socket]]]:
    """A TCP server that accepts connections and never answers."""
    listener = socket.create_server(("127.0.0.1", 0))
    accepted: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                accepted.append(listener.accept()[0])
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    yield f"redis://127.0.0.1:{listener.getsockname()[1]}/0", accepted
    listener.close()
    for conn in accepted:
        conn.close()


def test_a_hung_redis_times_out_without_retrying(hung_redis, fake_clock):
    url, accepted = hung_redis
    redis_limiter = RedisRateLimiter(url)
    options = redis_limiter.client.connection_pool.connection_kwargs
    assert options["socket_connect_timeout"] == options["socket_timeout"] == 0.25

    with pytest.raises(LimiterUnavailable, match="Timeout"):
        redis_limiter.check("alice", CAPACITY, RATE)
    assert len(accepted) == 1

    limiter = FailoverRateLimiter(redis_limiter, InMemoryRateLimiter(), clock=fake_clock)
    for _ in range(5):
        assert limiter.check("alice", CAPACITY, RATE).allowed
    assert len(accepted) == 2
    limiter.close()


def test_with_redis_the_process_uses_redis_with_a_local_fallback(settings, redis_url):
    settings.REDIS_URL = redis_url
    ratelimit.reset_rate_limiter()
    try:
        limiter = ratelimit.get_rate_limiter()
        assert isinstance(limiter, FailoverRateLimiter)
        assert isinstance(limiter.primary, RedisRateLimiter)
        assert isinstance(limiter.fallback, InMemoryRateLimiter)
        assert ratelimit.get_rate_limiter() is limiter

        assert limiter.check("alice", CAPACITY, RATE).backend == "redis"
        assert redis.Redis.from_url(redis_url).exists("recall:rl:alice")
    finally:
        ratelimit.reset_rate_limiter()
