"""Seed 001's tool set at /v1/mcp, driven by a real MCP client as the seed's examples do."""

from __future__ import annotations

import time

import pytest
from django.db import connection

from core import tenancy
from tests.clients import MODES, call, calls, list_tools, structured
from tests.conftest import usage_events
from tests.support import LiveServer
from tests.test_stdio import run_session, stdio_server

pytestmark = pytest.mark.slow

SEED_TOOLS = {
    "add_memory",
    "search_memory",
    "get_all_memories",
    "update_memory",
    "delete_memory",
    "delete_all_memories",
    "get_memory_history",
    "cache_stats",
    "optimize_cache",
    "health_check",
}


def v1(live) -> str:
    return f"{live.url}/v1/mcp"


def add(url: str, key: str, **arguments) -> dict:
    return structured(call(url, key, "add_memory", {"async": False, **arguments}))


@pytest.mark.parametrize("mode", MODES)
def test_it_lists_the_seeds_ten_tools_with_its_parameter_names(live, cast, mode):
    _, tools = list_tools(v1(live), cast.alice_key.raw, mode)
    by_name = {t.name: t for t in tools}

    assert set(by_name) == SEED_TOOLS
    assert set(by_name["add_memory"].input_schema["properties"]) == {
        "content",
        "messages",
        "user_id",
        "priority",
        "metadata",
        "async",
        "replaces",
    }
    assert by_name["add_memory"].input_schema["properties"]["async"]["default"] is True
    assert set(by_name["search_memory"].input_schema["properties"]) == {
        "query",
        "user_id",
        "limit",
        "prefer_cache",
        "metadata_filter",
        "include_superseded",
        "as_of",
    }
    assert by_name["search_memory"].input_schema["required"] == ["query"]
    assert by_name["update_memory"].input_schema["required"] == ["memory_id", "content"]
    assert set(by_name["optimize_cache"].input_schema["properties"]) == {
        "force_refresh",
        "max_memories",
    }
    assert by_name["cache_stats"].input_schema.get("properties", {}) == {}


@pytest.mark.parametrize("mode", MODES)
def test_the_seeds_example_session_works_unchanged(live, cast, mode):
    url, key = v1(live), cast.alice_key.raw
    added = structured(
        call(
            url,
            key,
            "add_memory",
            {
                "content": "User prefers dark mode and 14px font size",
                "priority": "high",
                "metadata": {"category": "preferences", "updated": "2024-01-15"},
                "async": False,
            },
            mode,
        )
    )
    assert added["message"] == "Memory added successfully"
    assert added["cached"] is False
    memory_id = added["memory_id"]

    search = structured(
        call(
            url,
            key,
            "search_memory",
            {
                "query": "user preferences for UI",
                "limit": 5,
                "metadata_filter": {"category": "preferences"},
            },
            mode,
        )
    )
    [result] = search["results"]
    assert set(result) >= {"memory", "metadata", "score", "id", "created_at", "user_id"}
    assert result["memory"] == "User prefers dark mode and 14px font size"
    assert (result["id"], result["user_id"]) == (memory_id, "default")
    assert result["metadata"] == {"category": "preferences", "updated": "2024-01-15"}
    assert search["source"] in ("cache", "model")

    updated = structured(
        call(
            url,
            key,
            "update_memory",
            {
                "memory_id": memory_id,
                "content": "User strongly prefers dark mode",
                "metadata": {"emphasized": True},
            },
            mode,
        )
    )
    assert updated == {"success": True, "message": "Memory updated successfully"}

    history = structured(call(url, key, "get_memory_history", {"memory_id": memory_id}, mode))
    assert history["message"] == "Retrieved 2 history entries"
    assert [(h["version"], h["action"], h["content"]) for h in history["history"]] == [
        (1, "created", "User prefers dark mode and 14px font size"),
        (2, "updated", "User strongly prefers dark mode"),
    ]
    assert all(h["client"] == "v1" for h in history["history"])

    every = structured(call(url, key, "get_all_memories", {}, mode))
    assert (every["count"], every["source"]) == (1, "database")
    [listed] = every["memories"]
    assert set(listed) >= {
        "id",
        "memory",
        "hash",
        "metadata",
        "created_at",
        "updated_at",
        "user_id",
    }

    deleted = structured(call(url, key, "delete_memory", {"memory_id": memory_id}, mode))
    assert deleted == {"success": True, "message": "Memory deleted successfully"}


def test_user_id_is_a_namespace_of_the_callers_own_account(live, cast):
    url = v1(live)
    add(url, cast.alice_key.raw, content="Sarah likes hiking.", user_id="sarah_chen")
    add(url, cast.charlie_key.raw, content="Charlie's Sarah likes chess.", user_id="sarah_chen")

    alice = structured(call(url, cast.alice_key.raw, "get_all_memories", {"user_id": "sarah_chen"}))
    charlie = structured(
        call(url, cast.charlie_key.raw, "get_all_memories", {"user_id": "sarah_chen"})
    )
    # /mcp sees the same namespace of the same account.
    listed = structured(
        call(live.mcp_url, cast.alice_key.raw, "list_memories", {"namespace": "sarah_chen"})
    )

    assert [m["memory"] for m in alice["memories"]] == ["Sarah likes hiking."]
    assert [m["memory"] for m in charlie["memories"]] == ["Charlie's Sarah likes chess."]
    assert [m["content"] for m in listed["memories"]] == ["Sarah likes hiking."]
    assert alice["memories"][0]["user_id"] == "sarah_chen"


def test_delete_all_memories_is_one_call_and_empties_only_that_user_id(live, cast):
    url, key = v1(live), cast.alice_key.raw
    for n in range(3):
        add(url, key, content=f"Project note {n}", user_id="project")
    add(url, key, content="Kept", user_id="other")
    add(url, cast.charlie_key.raw, content="Charlie's project note", user_id="project")

    done = structured(call(url, key, "delete_all_memories", {"user_id": "project"}))

    assert done == {"deleted": 3, "message": "Deleted 3 memories"}
    with tenancy.operator(), connection.cursor() as cursor:
        cursor.execute("SELECT namespace, content FROM memories ORDER BY content")
        assert cursor.fetchall() == [("project", "Charlie's project note"), ("other", "Kept")]


def test_messages_become_one_memory_each(live, cast):
    url, key = v1(live), cast.alice_key.raw

    added = add(
        url,
        key,
        messages=[
            {"role": "user", "content": "I moved to Lisbon."},
            {"role": "assistant", "content": "Welcome to Lisbon!"},
        ],
    )

    assert len(added["memory_ids"]) == 2
    assert added["memory_id"] == added["memory_ids"][0]


@pytest.mark.django_db(transaction=True)
def test_add_memory_is_async_by_default_and_announces_the_memory_id(cast):
    with LiveServer(env={"JOB_WORKERS": "1", "JOB_POLL_SECONDS": "5"}) as server:
        url, key = f"{server.url}/v1/mcp", cast.alice_key.raw

        added = structured(call(url, key, "add_memory", {"content": "Queued by default."}))

        assert added["status"] == "queued"
        assert added["message"] == "Memory queued for processing"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            history = call(url, key, "get_memory_history", {"memory_id": added["memory_id"]})
            if not history.is_error:
                break
            time.sleep(0.1)
        assert structured(history)["history"][0]["content"] == "Queued by default."


def test_search_says_when_the_query_vector_came_from_the_cache(live, cast):
    url, key = v1(live), cast.alice_key.raw
    add(url, key, content="The user's cat is called Miso.")
    query = f"what is the cat called {time.monotonic()}"  # new to the server's cache

    first = structured(call(url, key, "search_memory", {"query": query}))
    second = structured(call(url, key, "search_memory", {"query": query}))
    fresh = structured(call(url, key, "search_memory", {"query": query, "prefer_cache": False}))

    assert (first["source"], second["source"], fresh["source"]) == ("model", "cache", "model")
    assert first["results"] == second["results"] == fresh["results"]


def test_a_repeated_search_is_answered_from_the_result_cache_until_a_write(live, cast):
    """Over a real client and server: the cached answer is the ranked one, a write ends it,
    and each call still leaves exactly one usage event."""
    url, key = v1(live), cast.alice_key.raw
    namespace = f"tea-{time.monotonic_ns()}"
    first_id = add(url, key, content="Alice drinks green tea.", user_id=namespace)["memory_id"]
    add(url, key, content="The tea shop on Elm Street closed.", user_id=namespace)
    asked = {"query": "green tea", "user_id": namespace}
    before = len(usage_events(2, user_id=cast.alice.id))  # the two adds

    ranked = structured(call(url, key, "search_memory", asked))
    cached = structured(call(url, key, "search_memory", asked))
    call(url, key, "update_memory", {"memory_id": first_id, "content": "Alice drinks oolong."})
    after = structured(call(url, key, "search_memory", asked))
    bypassed = structured(call(url, key, "search_memory", {**asked, "prefer_cache": False}))

    assert cached["source"] == "cache" and cached["results"] == ranked["results"]
    assert "Alice drinks oolong." in [r["memory"] for r in after["results"]]
    assert "Alice drinks green tea." not in [r["memory"] for r in after["results"]]
    assert after["results"] == bypassed["results"] and bypassed["source"] == "model"
    events = usage_events(before + 5, user_id=cast.alice.id)
    assert [e.tool_name for e in events[before:]] == [
        "search_memory",
        "search_memory",
        "update_memory",
        "search_memory",
        "search_memory",
    ]


def test_cache_stats_and_optimize_cache_report_real_work(live, cast):
    url, key = v1(live), cast.alice_key.raw
    for n in range(3):
        call(url, key, "search_memory", {"query": f"distinct question {n} {time.monotonic()}"})

    before = structured(call(url, key, "cache_stats", {}))
    optimized = structured(call(url, key, "optimize_cache", {"max_memories": 1}))
    after = structured(call(url, key, "cache_stats", {}))

    assert before["size"] >= 3
    assert before["hit_rate"].endswith("%")
    assert before["memory_usage"].endswith("MB")
    assert set(before["connection_pool"]) == {"active", "idle", "waiting"}
    assert before["connection_pool"]["active"] >= 1  # this very call
    assert optimized["demoted"] == before["size"] - 1
    assert optimized["duration"].endswith("ms")
    assert after["size"] == 1
    assert after["evictions"] >= optimized["demoted"]


def test_health_check_has_the_seeds_shape(live, cast):
    health = structured(call(v1(live), cast.alice_key.raw, "health_check", {}))

    assert health["mem0"] is True
    assert health["redis"] is False  # not configured on this server
    assert set(health["cache"]) == {"l1_size", "l2_size", "hit_rate"}
    assert health["cache"]["l2_size"] == 0  # no Redis: an empty shared cache, a number
    assert set(health["memory"]) == {"used", "rss"}
    assert health["uptime"].endswith("m")


def test_errors_use_the_seeds_codes_and_shape(live, cast):
    url, key = v1(live), cast.alice_key.raw

    missing, opaque, invalid, unknown_field = calls(
        url,
        key,
        [
            ("delete_memory", {"memory_id": "00000000-0000-0000-0000-000000000000"}),
            # An id in the seed's own style names no memory here either.
            ("get_memory_history", {"memory_id": "mem_abc123xyz"}),
            ("add_memory", {"async": False}),
            ("search_memory", {"query": ""}),
        ],
    )

    assert missing.is_error
    assert structured(missing)["code"] == "MEMORY_NOT_FOUND"
    assert structured(opaque)["code"] == "MEMORY_NOT_FOUND"
    assert structured(missing)["details"]["recall_code"] == "not_found"
    assert isinstance(structured(missing)["error"], str)
    assert structured(invalid)["code"] == "INVALID_PARAMETERS"
    assert structured(unknown_field)["code"] == "INVALID_PARAMETERS"
    events = usage_events(4, user_id=cast.alice.id)
    assert [(e.tool_name, e.error_code) for e in events] == [
        ("delete_memory", "not_found"),
        ("get_memory_history", "not_found"),
        ("add_memory", "validation_failed"),
        ("search_memory", "validation_failed"),
    ]


def test_the_same_gate_guards_it(live, cast):
    from tests.clients import raw_call

    assert raw_call(v1(live), None, "health_check", {}).status_code == 401
    assert raw_call(v1(live), "recall_live_" + "x" * 32, "health_check", {}).status_code == 401


@pytest.mark.django_db(transaction=True)
def test_the_same_rate_limit_applies(cast):
    with LiveServer(env={"RATE_LIMIT_FREE": "2/min", "JOB_WORKERS": "0"}) as server:
        results = calls(
            f"{server.url}/v1/mcp",
            cast.alice_key.raw,
            [("health_check", {}), ("health_check", {})],
        )
        assert not any(r.is_error for r in results)
        from tests.clients import raw_call

        limited = raw_call(f"{server.url}/v1/mcp", cast.alice_key.raw, "health_check", {})
        assert limited.status_code == 429
    events = usage_events(3, user_id=cast.alice.id)
    assert [e.error_code for e in events] == [None, None, "rate_limited"]


@pytest.mark.django_db(transaction=True)
def test_the_seed_tools_work_over_stdio(cast):
    params = stdio_server(cast.alice_key.raw)
    params.args = [*params.args, "--tools", "v1"]

    added, search, every, health = (
        structured(r)
        for r in run_session(
            params,
            "legacy",
            [
                ("add_memory", {"content": "Stdio remembers.", "async": False}),
                ("search_memory", {"query": "what does stdio do", "limit": 1}),
                ("get_all_memories", {}),
                ("health_check", {}),
            ],
        )
    )

    assert added["message"] == "Memory added successfully"
    assert search["results"][0]["memory"] == "Stdio remembers."
    assert every["count"] == 1
    assert health["mem0"] is True
    [history] = run_session(
        params, "legacy", [("get_memory_history", {"memory_id": added["memory_id"]})]
    )
    assert structured(history)["history"][0]["client"] == "stdio"
