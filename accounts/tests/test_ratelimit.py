from __future__ import annotations

import math
import random
import sys
import threading
from collections.abc import Iterator

import pytest
from django.core.exceptions import ImproperlyConfigured

from accounts import ratelimit
from accounts.ratelimit import InMemoryRateLimiter, limit_for_tier
from accounts.tests.conftest import FakeClock
from accounts.tiers import Tier
from recall import env

# The free tier's default: ten a minute, so one token every six seconds.
CAPACITY = 10
RATE = 10 / 60


@pytest.fixture
def limiter(fake_clock: FakeClock) -> InMemoryRateLimiter:
    return InMemoryRateLimiter(clock=fake_clock)


def exhaust(limiter: InMemoryRateLimiter, key: str = "alice") -> None:
    for _ in range(CAPACITY):
        assert limiter.check(key, CAPACITY, RATE).allowed
    assert not limiter.check(key, CAPACITY, RATE).allowed


def test_it_allows_a_burst_up_to_capacity_then_denies(limiter):
    decisions = [limiter.check("alice", CAPACITY, RATE) for _ in range(CAPACITY + 2)]

    assert [d.allowed for d in decisions] == [True] * CAPACITY + [False, False]
    assert [d.remaining for d in decisions] == [*range(CAPACITY - 1, -1, -1), 0, 0]
    assert all(d.retry_after == 0 for d in decisions[:CAPACITY])


def test_it_refills_lazily_as_time_passes(limiter, fake_clock):
    exhaust(limiter)

    fake_clock.advance(5.9)
    assert not limiter.check("alice", CAPACITY, RATE).allowed
    fake_clock.advance(0.1)
    assert limiter.check("alice", CAPACITY, RATE).allowed
    assert not limiter.check("alice", CAPACITY, RATE).allowed

    fake_clock.advance(12)
    assert [limiter.check("alice", CAPACITY, RATE).allowed for _ in range(3)] == [
        True,
        True,
        False,
    ]


def test_an_idle_key_never_holds_more_than_capacity(limiter, fake_clock):
    limiter.check("alice", CAPACITY, RATE)
    fake_clock.advance(86400)

    decisions = [limiter.check("alice", CAPACITY, RATE) for _ in range(CAPACITY + 1)]

    assert decisions[0].remaining == CAPACITY - 1
    assert sum(d.allowed for d in decisions) == CAPACITY


def test_retry_after_is_the_wait_for_one_whole_token(limiter, fake_clock):
    exhaust(limiter)

    denied = limiter.check("alice", CAPACITY, RATE)
    assert denied.retry_after == pytest.approx(6.0)
    assert math.ceil(denied.retry_after) == 6

    fake_clock.advance(2.5)
    denied = limiter.check("alice", CAPACITY, RATE)
    assert denied.retry_after == pytest.approx(3.5)
    assert math.ceil(denied.retry_after) == 4

    fake_clock.advance(3.499)
    denied = limiter.check("alice", CAPACITY, RATE)
    assert not denied.allowed
    assert 0 < denied.retry_after < 0.01
    assert math.ceil(denied.retry_after) == 1


def test_waiting_exactly_retry_after_is_always_enough(limiter, fake_clock):
    # Awkward rates and steps make the refill arithmetic round; a denial must
    # still never say "retry in 0 s", and waiting what it says must succeed.
    rng = random.Random(7)
    for rate in (RATE, 1 / 3, 0.7, 13 / 7):
        key = f"alice-{rate}"
        for _ in range(300):
            fake_clock.advance(rng.random() * 2)
            decision = limiter.check(key, 3, rate)
            if not decision.allowed:
                assert decision.retry_after > 0
                assert math.ceil(decision.retry_after) >= 1
                fake_clock.advance(decision.retry_after)
                assert limiter.check(key, 3, rate).allowed


def test_denied_requests_do_not_consume_tokens(limiter, fake_clock):
    exhaust(limiter)
    for _ in range(50):
        assert not limiter.check("alice", CAPACITY, RATE).allowed

    fake_clock.advance(6)

    assert limiter.check("alice", CAPACITY, RATE).allowed
    assert not limiter.check("alice", CAPACITY, RATE).allowed


def test_keys_have_separate_buckets(limiter):
    exhaust(limiter, "alice")

    assert limiter.check("charlie", CAPACITY, RATE).allowed
    assert not limiter.check("alice", CAPACITY, RATE).allowed


def test_it_rejects_an_impossible_limit(limiter):
    with pytest.raises(ValueError):
        limiter.check("alice", 0, RATE)
    with pytest.raises(ValueError):
        limiter.check("alice", CAPACITY, 0)


@pytest.fixture
def tiny_switch_interval() -> Iterator[None]:
    # Switch threads as often as possible so an unlocked read-modify-write
    # would interleave and admit too many.
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(before)


def test_eight_threads_on_one_key_admit_exactly_capacity(tiny_switch_interval: None) -> None:
    limiter = InMemoryRateLimiter()
    capacity, threads, per_thread = 1000, 8, 400
    start = threading.Barrier(threads)
    admitted: list[int] = []

    def hammer() -> None:
        start.wait()
        count = 0
        for _ in range(per_thread):
            # Effectively no refill while the test runs.
            decision = limiter.check("alice", capacity, 1e-9)
            count += decision.allowed
        admitted.append(count)

    workers = [threading.Thread(target=hammer) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()

    assert len(admitted) == threads
    assert sum(admitted) == capacity


def test_it_forgets_buckets_once_they_have_refilled(limiter, fake_clock):
    for i in range(1000):
        limiter.check(f"agent-{i}", 1, 1.0)
    assert len(limiter) == 1000

    fake_clock.advance(1.0)
    limiter.check("alice", CAPACITY, RATE)

    assert len(limiter) == 1


def test_memory_stays_bounded_by_the_refill_window(limiter, fake_clock):
    # A new key every 10 ms, each full again after 1 s: about 100 are live.
    largest = 0
    for i in range(5000):
        fake_clock.advance(0.01)
        limiter.check(f"agent-{i}", 1, 1.0)
        largest = max(largest, len(limiter))

    assert largest <= 101


def test_it_keeps_a_bucket_that_has_not_refilled(limiter, fake_clock):
    exhaust(limiter, "alice")
    for i in range(100):
        limiter.check(f"agent-{i}", 1, 1.0)
    fake_clock.advance(1.0)

    assert not limiter.check("alice", CAPACITY, RATE).allowed


def test_it_never_holds_more_than_max_keys(fake_clock):
    limiter = InMemoryRateLimiter(max_keys=100, clock=fake_clock)
    for i in range(1000):
        limiter.check(f"agent-{i}", CAPACITY, RATE)

    assert len(limiter) == 100


def test_a_decision_describes_the_bucket_for_response_headers(limiter, fake_clock):
    decision = limiter.check("alice", CAPACITY, RATE)
    assert (decision.allowed, decision.limit, decision.remaining, decision.backend) == (
        True,
        10,
        9,
        "memory",
    )
    assert decision.reset_after == pytest.approx(6.0)
    assert "Retry-After" not in decision.headers()

    exhaust(limiter, "charlie")
    fake_clock.advance(2.5)
    decision = limiter.check("charlie", CAPACITY, RATE)
    assert decision.headers() == {
        "RateLimit-Limit": "10",
        "RateLimit-Remaining": "0",
        "RateLimit-Reset": "58",
        "Retry-After": "4",
    }


def test_each_tier_has_a_limit_that_bursts_one_period(settings):
    settings.RATE_LIMITS = {
        "free": (10, 60),
        "starter": (60, 60),
        "pro": (5, 1),
        "team": (100, 3600),
    }

    assert limit_for_tier(Tier.FREE) == (10, pytest.approx(10 / 60))
    assert limit_for_tier("starter") == (60, pytest.approx(1.0))
    assert limit_for_tier("pro") == (5, pytest.approx(5.0))
    assert limit_for_tier("team") == (100, pytest.approx(100 / 3600))


def test_every_tier_is_configured(settings):
    assert set(settings.RATE_LIMITS) == {tier.value for tier in Tier}
    with pytest.raises(ValueError, match="enterprise"):
        limit_for_tier("enterprise")


def test_the_free_tier_obeys_its_limit(limiter, settings):
    settings.RATE_LIMITS = {**settings.RATE_LIMITS, "free": (10, 60)}
    capacity, refill = limit_for_tier(Tier.FREE)

    assert sum(limiter.check("alice", capacity, refill).allowed for _ in range(20)) == 10


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("", (10, 60)),
        ("10/min", (10, 60)),
        ("5/s", (5, 1)),
        ("1000/hour", (1000, 3600)),
        ("60 / minute", (60, 60)),
        ("2/sec", (2, 1)),
        ("30/h", (30, 3600)),
    ],
)
def test_rate_settings_accept_a_count_per_period(monkeypatch, raw, expected):
    monkeypatch.setenv("RATE_LIMIT_FREE", raw)

    assert env.rate("RATE_LIMIT_FREE", "10/min") == expected


@pytest.mark.parametrize(
    "raw", ["60", "60/day", "0/min", "-5/min", "1.5/min", "sixty/min", "60/min/s", "60/MIN", "٣/s"]
)
def test_rate_settings_reject_anything_else(monkeypatch, raw):
    monkeypatch.setenv("RATE_LIMIT_PRO", raw)

    with pytest.raises(ImproperlyConfigured, match=r"RATE_LIMIT_PRO must be .* such as 60/min"):
        env.rate("RATE_LIMIT_PRO", "60/min")


def test_redis_url_setting_is_optional_and_checked(monkeypatch):
    monkeypatch.delenv("REDIS_URL", raising=False)
    assert env.redis_url("REDIS_URL") is None

    monkeypatch.setenv("REDIS_URL", "redis://:s3cret@cache:6379/0")
    assert env.redis_url("REDIS_URL") == "redis://:s3cret@cache:6379/0"

    monkeypatch.setenv("REDIS_URL", "http://:s3cret@cache:6379/0")
    with pytest.raises(ImproperlyConfigured, match="REDIS_URL") as error:
        env.redis_url("REDIS_URL")
    assert "s3cret" not in str(error.value)


@pytest.fixture
def fresh_limiter() -> Iterator[None]:
    ratelimit.reset_rate_limiter()
    yield
    ratelimit.reset_rate_limiter()


def test_without_redis_the_process_uses_one_in_memory_limiter(settings, fresh_limiter):
    settings.REDIS_URL = None

    first = ratelimit.get_rate_limiter()

    assert isinstance(first, InMemoryRateLimiter)
    assert ratelimit.get_rate_limiter() is first
    ratelimit.reset_rate_limiter()
    assert ratelimit.get_rate_limiter() is not first
