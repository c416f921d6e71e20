"""The auth cache's sync through Redis says when it stops, and when it works again."""

from __future__ import annotations

import logging

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
