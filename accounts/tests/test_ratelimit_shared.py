"""The limiter the workers of one server share: one bucket per key across processes."""

from __future__ import annotations

import fcntl
import multiprocessing
import os
import random
from dataclasses import replace
from pathlib import Path

import pytest

from accounts.ratelimit import InMemoryRateLimiter, SharedMemoryRateLimiter
from accounts.tests.conftest import FakeClock
from core.sharedstate import HEADER_SIZE, SharedState

CAPACITY = 10
RATE = 10 / 60


@pytest.fixture
def state(tmp_path: Path):
    shared = SharedState.create(str(tmp_path))
    yield shared
    shared.remove()


def _hammer(path: str, checks: int, results: multiprocessing.Queue) -> None:
    limiter = SharedMemoryRateLimiter(SharedState.attach(path))
    results.put(sum(limiter.check("key:alice", CAPACITY, 1e-6).allowed for _ in range(checks)))


def test_workers_in_separate_processes_draw_from_one_bucket(state):
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    workers = [
        context.Process(target=_hammer, args=(str(state.path), 40, results)) for _ in range(4)
    ]
    for worker in workers:
        worker.start()
    allowed = [results.get(timeout=60) for _ in workers]
    for worker in workers:
        worker.join(30)

    # 160 checks from 4 processes at once, one allowance of 10: exactly 10 pass.
    assert sum(allowed) == CAPACITY


def test_it_decides_exactly_as_the_in_process_limiter(state):
    clock = FakeClock()
    shared = SharedMemoryRateLimiter(state, clock=clock)
    local = InMemoryRateLimiter(clock=clock)
    rng = random.Random(13)

    for _ in range(2000):
        clock.advance(rng.choice([0.0, 0.0, 0.5, 3.0, 6.0, 61.0]))
        key = rng.choice(["key:alice", "key:bob", "key:charlie"])
        ours, theirs = shared.check(key, CAPACITY, RATE), local.check(key, CAPACITY, RATE)
        assert replace(ours, backend="memory") == theirs


def test_a_full_set_gives_way_to_a_new_key_without_refusing_anyone_wrongly(tmp_path):
    clock = FakeClock()
    one_set = SharedState.create(str(tmp_path), buckets=1)  # eight keys fit
    limiter = SharedMemoryRateLimiter(one_set, clock=clock)
    for n in range(8):
        clock.advance(0.5)
        for _ in range(CAPACITY):
            assert limiter.check(f"key:{n}", CAPACITY, RATE).allowed

    # A ninth key takes the entry of the bucket that will be full soonest (the
    # first one spent): that key may get through early, no key is denied early.
    assert limiter.check("key:new", CAPACITY, RATE).remaining == CAPACITY - 1
    assert limiter.check("key:0", CAPACITY, RATE).allowed
    for n in range(1, 8):
        assert not limiter.check(f"key:{n}", CAPACITY, RATE).allowed
    one_set.remove()


def _die_holding_the_lock(path: str) -> None:
    fd = os.open(path, os.O_RDWR)
    fcntl.lockf(fd, fcntl.LOCK_EX, 0, HEADER_SIZE)  # every set, to the end of the file
    os._exit(1)


def test_a_worker_that_dies_holding_the_lock_does_not_block_the_others(state):
    context = multiprocessing.get_context("spawn")
    dying = context.Process(target=_die_holding_the_lock, args=(str(state.path),))
    dying.start()
    dying.join(30)

    assert dying.exitcode == 1
    assert SharedMemoryRateLimiter(state).check("key:alice", CAPACITY, RATE).allowed


def test_a_bumped_auth_version_is_seen_by_every_attached_process(state):
    other = SharedState.attach(state.path)
    before = other.auth_version()

    state.bump_auth_version()
    state.bump_auth_version()

    assert other.auth_version() == before + 2
    other.close()


def test_a_file_that_is_not_a_state_file_is_refused(tmp_path):
    stray = tmp_path / "stray"
    stray.write_bytes(b"x" * 4096)

    with pytest.raises(ValueError, match="not a Recall worker state file"):
        SharedState.attach(stray)


def test_each_state_file_places_buckets_in_sets_of_its_own(tmp_path):
    one = SharedState.create(str(tmp_path), buckets=1024)
    other = SharedState.create(str(tmp_path), buckets=1024)
    attached = SharedState.attach(one.path)
    names = [f"key:{n}:free" for n in range(20)]

    placed = [one.set_index(name) for name in names]

    # A client cannot work out which of its bucket names share a set with
    # another; the server's own workers agree on every one.
    assert placed != [other.set_index(name) for name in names]
    assert placed == [attached.set_index(name) for name in names]
    attached.close()
    one.remove()
    other.remove()
