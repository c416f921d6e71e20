"""Revocations and tier changes reach every server: at once through the database's
NOTIFY, and within seconds through Redis when it is shared."""

from __future__ import annotations

import subprocess
import sys
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


def test_a_key_revoked_with_the_cli_beside_a_server_without_redis_stops_at_once(cast):
    # The default install has no Redis: `recall revoke-key` ran in a process
    # of its own, and the server kept the key cached for the TTL (300 s).
    with LiveServer() as server:
        assert raw_call(server.mcp_url, cast.alice_key.raw, "list_memories", {}).status_code == 200

        revoked = subprocess.run(
            [sys.executable, "-m", "recall", "revoke-key", str(cast.alice_key.key.id)],
            env=server.environment(),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert revoked.returncode == 0, revoked.stderr

        took = eventually(
            lambda: (
                raw_call(server.mcp_url, cast.alice_key.raw, "list_memories", {}).status_code == 401
            )
        )
        still = raw_call(server.mcp_url, cast.bob_key.raw, "list_memories", {}).status_code
    assert took < 5
    assert still == 200


def test_a_tier_change_in_another_process_without_redis_takes_effect_at_once(cast):
    fill_memories(cast.alice.id, 100)

    def remember() -> dict:
        response = raw_call(server.mcp_url, cast.alice_key.raw, "remember", {"content": "more"})
        return response.json()["result"]

    with LiveServer(env={"RATE_LIMIT_FREE": "1000/min"}) as server:
        assert remember()["structuredContent"]["error"]["code"] == "quota_exceeded"

        auth.reset()
        services.set_user_tier(user_id=cast.alice.id, tier="pro")  # this process plays the CLI

        assert eventually(lambda: not remember()["isError"]) < 5
