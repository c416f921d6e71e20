"""When the embedding provider is down, tools answer embedding_unavailable and stay up."""

from __future__ import annotations

import pytest

from tests.clients import raw_call
from tests.support import LiveServer, free_port

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def test_a_dead_provider_gives_embedding_unavailable(cast):
    dead = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens here
    env = {
        "EMBEDDING_PROVIDER": "openai",
        "OPENAI_API_KEY": "sk-test-not-real",
        "OPENAI_BASE_URL": dead,
        "OPENAI_MAX_RETRIES": "0",
        "OPENAI_TIMEOUT": "2",
    }
    with LiveServer(env=env) as server:
        response = raw_call(server.mcp_url, cast.alice_key.raw, "remember", {"content": "hello"})
        listed = raw_call(server.mcp_url, cast.alice_key.raw, "list_memories", {})
        logs = server.logs()

    result = response.json()["result"]
    assert result["isError"] is True
    assert result["structuredContent"]["error"]["code"] == "embedding_unavailable"
    assert listed.json()["result"]["isError"] is False  # what needs no embedding still works
    assert "sk-test-not-real" not in logs and "hello" not in logs
