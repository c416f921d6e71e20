"""The auth cache's sync through Redis says when it stops, and when it works again."""

from __future__ import annotations

import logging
import threading
import time

import pytest

from accounts import keycache


class FlakyRedis:
    def __init__(self) -> None:
        self.down = True

    def get(self, key: str) -> bytes:
        if self.down:
            raise ConnectionError("Error 111 connecting to 127.0.0.1:6390. Connection refused.")
        return b"7"


@pytest.mark.parametrize(
    ("pool_mode", "direct", "first_said"),
    [
        # The database's NOTIFY still carries a revocation at once.
        ("session", None, "auth cache sync through redis unavailable: key changes still reach"),
        # Behind a transaction pooler with no session of its own, nothing does.
        ("transaction", None, "auth cache sync unavailable: other instances will see"),
    ],
    ids=["listening", "pooled"],
)
def test_the_sync_logs_its_outage_and_its_end(
    settings, monkeypatch, caplog, pool_mode, direct, first_said
):
    settings.DATABASE_POOL_MODE = pool_mode
    settings.DATABASE_DIRECT_URL = direct
    settings.REDIS_URL = "redis://127.0.0.1:6390/0"
    settings.AUTH_CACHE_SYNC_SECONDS = 0
    sync = keycache._PeerSync()
    redis = FlakyRedis()
    monkeypatch.setattr(sync, "client", lambda url: redis)
    cache = keycache.AuthCache(ttl=60)

    with caplog.at_level(logging.WARNING, logger=keycache.logger.name):
        sync.poll(cache)
        sync.poll(cache)  # still down: said once
        redis.down = False
        sync.poll(cache)
        sync.poll(cache)

    said = [r.getMessage() for r in caplog.records if r.name == keycache.logger.name]
    assert len(said) == 2
    assert said[0].startswith(first_said)
    assert said[1].startswith("auth cache sync is back")
    assert "6390" not in caplog.text


class HungRedis:
    """Answers a GET only when the test lets it: a Redis that hangs, then comes back."""

    def __init__(self) -> None:
        self.answer = threading.Event()
        self.asked = threading.Event()
        self.version = b"1"

    def get(self, key: str) -> bytes:
        self.asked.set()
        assert self.answer.wait(5), "the test never let Redis answer"
        return self.version


def test_a_hung_redis_never_holds_a_request_and_a_change_still_arrives(settings, monkeypatch):
    """review136: the poll ran on the request path, in the event loop: a hung Redis
    held every request of the process for its timeout, every two seconds. review137:
    polled only when a request came, a key revoked elsewhere passed the first request
    after an idle spell. A thread of the process polls, requests or not."""
    settings.REDIS_URL = "redis://127.0.0.1:6390/0"
    settings.AUTH_CACHE_SYNC_SECONDS = 0.05
    sync = keycache._PeerSync()
    redis = HungRedis()
    monkeypatch.setattr(sync, "client", lambda url: redis)
    monkeypatch.setattr(keycache, "_sync", sync)
    cache = keycache.get_cache()
    cache.clear()
    try:
        keycache.synced()  # starts the thread, whose first poll hangs
        assert redis.asked.wait(10)
        started = time.monotonic()
        for _ in range(5):
            keycache.synced()  # waits on nothing
        assert time.monotonic() - started < 1.0

        redis.answer.set()  # Redis answers: the version it had is seen
        assert _soon(lambda: sync._seen == b"1")
        # Another process bumps the version while no request comes: the cache
        # is cleared all the same, before the next request reads it.
        cache.put("digest", object(), since=cache.generation)
        redis.version = b"2"
        assert _soon(lambda: cache.get("digest") is None)
        assert sync._seen == b"2"
    finally:
        sync.stop()


def _soon(condition, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.01)
    return False
