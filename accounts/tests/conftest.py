from __future__ import annotations

from collections.abc import Iterator

import pytest

from accounts.tests.redis_server import RedisServer, RedisServerMissing


class FakeClock:
    """A monotonic clock that moves only when a test says so."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def fake_clock() -> FakeClock:
    return FakeClock()


def _start_or_skip() -> RedisServer:
    try:
        return RedisServer.start_new()
    except RedisServerMissing as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """One redis-server for the session. Stop it only through ``own_redis_server``."""
    server = _start_or_skip()
    yield server
    server.close()


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    """The session server's URL, emptied of keys, scripts and command counts."""
    redis_server.start()
    with redis_server.client() as client:
        client.flushall()
        client.script_flush()
        client.config_resetstat()
    return redis_server.url


@pytest.fixture
def own_redis_server() -> Iterator[RedisServer]:
    """A redis-server of this test's own, to kill and restart at will."""
    server = _start_or_skip()
    yield server
    server.close()
