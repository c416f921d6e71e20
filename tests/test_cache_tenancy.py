"""The query cache keeps each tenant's queries to itself, on real servers.

Alice searches; Charlie, another tenant, must not be able to tell: no field
of any tool on any endpoint changes for him, a query she ran is a model run
when he asks it, and his ``optimize_cache`` never touches her entries, in
this process, in other server processes or in Redis. The operator's
``clear_query_cache`` does reach every tenant and every running server.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.core.management import call_command

from accounts.models import Agent
from core import tenancy
from tests.clients import call, structured
from tests.support import LiveServer
from tests.test_protected_resource import mint

pytestmark = pytest.mark.slow


def asked(label: str) -> str:
    """A query nobody has run before on this server."""
    return f"{label} {uuid.uuid4().hex[:12]}"


def search_source(server: LiveServer, key: str, query: str) -> str:
    return structured(call(f"{server.url}/v1/mcp", key, "search_memory", {"query": query}))[
        "source"
    ]


def charlies_view(server: LiveServer, key: str) -> dict[str, Any]:
    """Every figure about the query cache that any of Charlie's tools returns.

    Left out are the figures that are not the cache's: uptime, process
    memory, his own call latencies, the thread pool and the queue's depth
    (server-wide by design, and unrelated to queries).
    """
    mcp, v1 = f"{server.url}/mcp", f"{server.url}/v1/mcp"
    stats = structured(call(mcp, key, "memory_stats", {}))
    health = structured(call(mcp, key, "health_check", {}))
    v1_stats = structured(call(v1, key, "cache_stats", {}))
    v1_health = structured(call(v1, key, "health_check", {}))
    v1_stats.pop("connection_pool")
    return {
        "memory_stats": stats["cache"],
        "health_check": health["cache"],
        "v1 cache_stats": v1_stats,
        "v1 health_check": (v1_health["cache"], v1_health["memory"]["used"]),
    }


def run_everywhere(server: LiveServer, key: str, token: str, query: str) -> None:
    """Alice's query through every search tool of every endpoint."""
    call(f"{server.url}/mcp", key, "recall", {"query": query})
    call(f"{server.url}/mcp", key, "forget", {"mode": "by_query", "query": query})
    call(f"{server.url}/v1/mcp", key, "search_memory", {"query": query})
    call(f"{server.url}/agent/mcp", token, "memory_search", {"query": query})


@pytest.fixture
def alice_token(live, cast) -> str:
    with tenancy.operator():
        agent = Agent.objects.create(user=cast.alice, name="research")
    return mint(cast.alice, agent, live.url + "/agent/mcp")


def test_charlie_cannot_tell_by_any_field_that_alice_ran_a_query(live, cast, alice_token):
    alice, charlie = cast.alice_key.raw, cast.charlie_key.raw
    search_source(live, charlie, asked("charlie's own question"))  # his figures are not zeros
    query = asked("layoffs plan for the Berlin office")
    before = charlies_view(live, charlie)

    run_everywhere(live, alice, alice_token, query)

    assert charlies_view(live, charlie) == before
    assert search_source(live, charlie, query) == "model"
    assert search_source(live, charlie, query) == "cache"  # the field does tell his own
    assert search_source(live, alice, query) == "cache"  # and hers are still there


def test_each_tenant_sees_only_its_own_cache_figures(live, cast):
    alice, charlie = cast.alice_key.raw, cast.charlie_key.raw
    queries = [asked("question") for _ in range(3)]
    for query in [*queries, queries[0]]:
        search_source(live, alice, query)
    search_source(live, charlie, asked("his question"))

    v1 = f"{live.url}/v1/mcp"
    hers = structured(call(v1, alice, "cache_stats", {}))
    his = structured(call(v1, charlie, "cache_stats", {}))
    her_stats = structured(call(f"{live.url}/mcp", alice, "memory_stats", {}))["cache"]

    assert (hers["size"], hers["hit_rate"]) == (3, "25.0%")
    assert (his["size"], his["hit_rate"]) == (1, "0.0%")
    assert (her_stats["hits"], her_stats["misses"], her_stats["shared_hits"]) == (1, 3, 0)


def test_charlies_optimize_cache_leaves_alices_entries(live, cast):
    alice, charlie = cast.alice_key.raw, cast.charlie_key.raw
    query = asked("competitor acquisition")
    search_source(live, alice, query)
    search_source(live, alice, asked("another of hers"))
    search_source(live, charlie, query)
    v1 = f"{live.url}/v1/mcp"

    refreshed = structured(call(v1, charlie, "optimize_cache", {"force_refresh": True}))
    trimmed = structured(call(v1, charlie, "optimize_cache", {"max_memories": 0}))

    assert refreshed["refreshed"] == 1  # his one entry; Redis is not configured here
    assert trimmed["demoted"] == 0
    assert search_source(live, alice, query) == "cache"
    assert structured(call(v1, alice, "cache_stats", {}))["size"] == 2
    assert search_source(live, charlie, query) == "model"


# Several server processes --------------------------------------------------------------


@pytest.fixture
def listening_servers(live) -> Iterator[tuple[LiveServer, LiveServer]]:
    """Two more servers on the same database, each with a listener for cache clears."""
    env = {"JOB_WORKERS": "1", "RATE_LIMIT_FREE": "1000/min"}
    first, second = LiveServer(env=env), LiveServer(env=env)
    try:
        first.start()
        second.start()
        yield first, second
    finally:
        first.stop()
        second.stop()


def eventually(check: Callable[[], bool], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.2)
    return False


def test_a_force_refresh_reaches_the_callers_entries_in_other_processes_only(
    listening_servers, cast
):
    first, second = listening_servers
    alice, charlie = cast.alice_key.raw, cast.charlie_key.raw
    hers, his = asked("her question"), asked("his question")
    for server in (first, second):
        search_source(server, alice, hers)
        search_source(server, charlie, his)

    call(f"{first.url}/v1/mcp", charlie, "optimize_cache", {"force_refresh": True})

    # Each probe of Charlie's is itself a model run that caches again; so probe
    # his emptiness through the size the other server reports instead.
    assert eventually(
        lambda: structured(call(f"{second.url}/v1/mcp", charlie, "cache_stats", {}))["size"] == 0
    )
    assert search_source(second, alice, hers) == "cache"
    assert search_source(first, alice, hers) == "cache"


def test_the_operators_command_clears_every_tenant_on_every_running_server(listening_servers, cast):
    first, second = listening_servers
    alice, charlie = cast.alice_key.raw, cast.charlie_key.raw
    hers, his = asked("her question"), asked("his question")
    for server in (first, second):
        search_source(server, alice, hers)
        search_source(server, charlie, his)

    call_command("clear_query_cache", "alice@example.com")

    def size(server: LiveServer, key: str) -> int:
        return structured(call(f"{server.url}/v1/mcp", key, "cache_stats", {}))["size"]

    assert eventually(lambda: size(first, alice) == 0 and size(second, alice) == 0)
    assert (size(first, charlie), size(second, charlie)) == (1, 1)

    call_command("clear_query_cache")

    assert eventually(lambda: size(first, charlie) == 0 and size(second, charlie) == 0)


# Shared through Redis --------------------------------------------------------------------


def test_servers_sharing_redis_share_a_tenants_vectors_with_that_tenant_only(live, cast, redis):
    env = {"REDIS_URL": redis.url, "RATE_LIMIT_FREE": "1000/min", "JOB_WORKERS": "0"}
    first, second = LiveServer(env=env), LiveServer(env=env)
    try:
        first.start()
        second.start()
        alice, charlie = cast.alice_key.raw, cast.charlie_key.raw
        query = asked("patient's name")

        assert search_source(first, alice, query) == "model"
        assert search_source(second, charlie, query) == "model"
        assert search_source(second, alice, query) == "cache"  # from Redis: hers

        call(f"{second.url}/v1/mcp", charlie, "optimize_cache", {"force_refresh": True})
        health = structured(call(f"{first.url}/v1/mcp", alice, "health_check", {}))
        assert health["cache"]["l2_size"] == 1
        assert (
            structured(call(f"{first.url}/v1/mcp", charlie, "health_check", {}))["cache"]["l2_size"]
            == 0
        )
    finally:
        first.stop()
        second.stop()
