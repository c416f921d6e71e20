"""Revocations and tier changes reach every server within seconds when Redis is shared."""

from __future__ import annotations

import time

import pytest
from django.test import override_settings

from accounts import auth, services
from tests.clients import raw_call
from tests.support import LiveServer, fill_memories

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def eventually(predicate, timeout: float = 10.0) -> float:
    started = time.monotonic()
    while not predicate():
        assert time.monotonic() - started < timeout, "the change never took effect"
        time.sleep(0.1)
    return time.monotonic() - started


def test_a_key_revoked_elsewhere_stops_working_within_seconds(cast, redis):
    with LiveServer(env={"REDIS_URL": redis.url}) as server:
        assert raw_call(server.mcp_url, cast.alice_key.raw, "list_memories", {}).status_code == 200

        with override_settings(REDIS_URL=redis.url):
            auth.reset()
            services.revoke_keys([cast.alice_key.key.id])  # this process plays the other instance

        took = eventually(
            lambda: (
                raw_call(server.mcp_url, cast.alice_key.raw, "list_memories", {}).status_code == 401
            )
        )
        still = raw_call(server.mcp_url, cast.bob_key.raw, "list_memories", {}).status_code
    assert took < 5  # AUTH_CACHE_SYNC_SECONDS is 2
    assert still == 200  # Alice's other key was not revoked


def test_an_upgrade_elsewhere_lifts_the_free_quota_within_seconds(cast, redis):
    fill_memories(cast.alice.id, 100)

    def remember() -> dict:
        response = raw_call(server.mcp_url, cast.alice_key.raw, "remember", {"content": "more"})
        return response.json()["result"]

    # A generous rate, so polling measures the cache and not the free tier's 10/min.
    with LiveServer(env={"REDIS_URL": redis.url, "RATE_LIMIT_FREE": "1000/min"}) as server:
        assert remember()["structuredContent"]["error"]["code"] == "quota_exceeded"

        with override_settings(REDIS_URL=redis.url):
            auth.reset()
            services.set_user_tier(user_id=cast.alice.id, tier="pro")

        eventually(lambda: not remember()["isError"])
