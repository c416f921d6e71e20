"""The memory lifecycle over /mcp and stdio, with real MCP clients.

History, conversations, priority, background adds, expiry, delete-all,
stats and health, each driven the way an agent drives them.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from django.conf import settings
from django.db import connection

from core import tenancy
from tests.clients import MODES, call, calls, list_tools, structured
from tests.conftest import usage_events
from tests.support import LiveServer, database_url
from tests.test_stdio import run_session, stdio_server

pytestmark = pytest.mark.slow

CONVERSATION = [
    {"role": "user", "content": "Remind me: the team offsite is in Porto."},
    {"role": "assistant", "content": "Noted: the offsite is in Porto."},
    {"role": "user", "content": "And it starts on the 12th."},
]


def wait_for_job(url: str, key: str, job_id: str, timeout: float = 30) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        status = structured(call(url, key, "job_status", {"job_id": job_id}))
        if status["status"] in ("done", "failed") or time.monotonic() > deadline:
            return status
        time.sleep(0.1)


def test_the_new_arguments_are_published_in_the_schemas(live, cast):
    _, tools = list_tools(live.mcp_url, cast.alice_key.raw)
    by_name = {t.name: t for t in tools}

    remember = by_name["remember"].input_schema["properties"]
    assert {"messages", "thread_id", "priority", "expires_at", "ttl_seconds", "async"} <= set(
        remember
    )
    assert "async_" not in remember
    assert remember["priority"]["anyOf"][0]["enum"] == ["critical", "high", "medium", "low"]
    assert by_name["remember"].input_schema.get("required", []) == []
    forget = by_name["forget"].input_schema["properties"]
    assert forget["mode"]["enum"] == ["by_id", "by_query", "all"]
    assert "purge" in forget
    assert "priority" in by_name["recall"].input_schema["properties"]
    assert {"priority", "thread_id"} <= set(by_name["list_memories"].input_schema["properties"])


@pytest.mark.parametrize("mode", MODES)
def test_history_shows_every_version_and_who_made_it(live, cast, mode):
    url = live.mcp_url
    created = structured(call(url, cast.alice_key.raw, "remember", {"content": "v1"}, mode))
    call(url, cast.bob_key.raw, "update_memory", {"id": created["id"], "content": "v2"}, mode)

    result = call(url, cast.alice_key.raw, "memory_history", {"id": created["id"]}, mode)

    history = structured(result)
    assert history["count"] == 2
    assert [(v["version"], v["action"], v["content"]) for v in history["history"]] == [
        (1, "created", "v1"),
        (2, "updated", "v2"),
    ]
    assert [(v["client"], v["api_key_id"]) for v in history["history"]] == [
        ("mcp", str(cast.alice_key.key.id)),
        ("mcp", str(cast.bob_key.key.id)),
    ]
    charlie = call(url, cast.charlie_key.raw, "memory_history", {"id": created["id"]}, mode)
    assert structured(charlie)["error"]["code"] == "not_found"


def test_a_conversation_goes_in_whole_and_comes_back_in_order(live, cast):
    url, key = live.mcp_url, cast.alice_key.raw
    stored = structured(
        call(url, key, "remember", {"messages": CONVERSATION, "namespace": "offsite"})
    )

    listed = structured(
        call(
            url,
            key,
            "list_memories",
            {"namespace": "offsite", "thread_id": stored["thread_id"]},
        )
    )

    assert stored["count"] == 3
    assert [(m["metadata"]["role"], m["content"]) for m in listed["memories"]] == [
        (m["role"], m["content"]) for m in CONVERSATION
    ]
    too_many = call(url, key, "remember", {"messages": [CONVERSATION[0]] * 101})
    assert too_many.is_error
    assert structured(too_many)["error"]["code"] == "validation_failed"


def test_priority_is_stored_filtered_and_updated(live, cast):
    url, key = live.mcp_url, cast.alice_key.raw
    vital = structured(
        call(url, key, "remember", {"content": "Allergic to penicillin.", "priority": "critical"})
    )["id"]
    call(url, key, "remember", {"content": "Likes jazz.", "priority": "low"})

    found = structured(
        call(url, key, "recall", {"query": "medical", "priority": ["critical"], "threshold": 0})
    )
    listed = structured(call(url, key, "list_memories", {"priority": "low"}))

    assert [m["id"] for m in found["memories"]] == [vital]
    assert [m["content"] for m in listed["memories"]] == ["Likes jazz."]


@pytest.mark.django_db(transaction=True)
def test_an_async_remember_returns_at_once_and_the_servers_worker_stores_it(cast):
    key = cast.alice_key.raw
    arguments = {"content": "The user's flight is at 7am.", "async": True, "idempotency_key": "f1"}
    with LiveServer(env={"JOB_WORKERS": "1", "JOB_POLL_SECONDS": "5"}) as server:
        url = server.mcp_url
        queued = structured(call(url, key, "remember", arguments))
        retried = structured(call(url, key, "remember", arguments))

        assert queued["status"] == "queued"
        assert retried["job_id"] == queued["job_id"]
        done = wait_for_job(url, key, queued["job_id"])
        assert done["status"] == "done"
        assert done["memory_ids"] == queued["memory_ids"]
        found = structured(call(url, key, "recall", {"query": "flight time", "threshold": 0}))
        assert found["memories"][0]["id"] == queued["memory_ids"][0]
        charlie = call(url, cast.charlie_key.raw, "job_status", {"job_id": queued["job_id"]})
        assert structured(charlie)["error"]["code"] == "not_found"


def test_an_async_remember_over_the_quota_is_refused_at_once(live, cast, settings):
    from tests.support import fill_memories

    fill_memories(cast.alice.id, 100)

    refused = call(
        live.mcp_url, cast.alice_key.raw, "remember", {"content": "one more", "async": True}
    )

    assert structured(refused)["error"]["code"] == "quota_exceeded"


def test_an_expired_memory_is_never_returned(live, cast):
    url, key = live.mcp_url, cast.alice_key.raw
    # Long enough that a loaded machine still lists it before it expires.
    ttl = 5
    stored_at = time.monotonic()
    brief = structured(
        call(url, key, "remember", {"content": "The door code is 4455.", "ttl_seconds": ttl})
    )["id"]
    lasting = structured(call(url, key, "remember", {"content": "The door is blue."}))["id"]
    assert len(structured(call(url, key, "list_memories", {}))["memories"]) == 2

    time.sleep(max(0.0, stored_at + ttl + 0.5 - time.monotonic()))

    listed = structured(call(url, key, "list_memories", {}))
    found = structured(call(url, key, "recall", {"query": "door code", "threshold": 0}))
    updated = call(url, key, "update_memory", {"id": brief, "content": "still here?"})
    assert [m["id"] for m in listed["memories"]] == [lasting]
    assert [m["id"] for m in found["memories"]] == [lasting]
    assert structured(updated)["error"]["code"] == "not_found"


def test_forget_all_previews_then_empties_only_that_namespace(live, cast):
    url, key = live.mcp_url, cast.alice_key.raw
    for n in range(3):
        call(url, key, "remember", {"content": f"scratch {n}", "namespace": "scratch"})
    call(url, key, "remember", {"content": "keep me", "namespace": "default"})
    call(url, cast.charlie_key.raw, "remember", {"content": "Charlie's", "namespace": "scratch"})

    preview = structured(call(url, key, "forget", {"mode": "all", "namespace": "scratch"}))
    unnamed = call(url, key, "forget", {"mode": "all"})
    done = structured(
        call(
            url,
            key,
            "forget",
            {"mode": "all", "confirmation_token": preview["confirmation_token"], "purge": True},
        )
    )

    assert (preview["namespace"], preview["total_matches"]) == ("scratch", 3)
    assert structured(unnamed)["error"]["code"] == "validation_failed"
    assert done == {"success": True, "deleted_count": 3, "purged": True}
    with tenancy.operator(), connection.cursor() as cursor:
        cursor.execute("SELECT user_id, namespace, content FROM memories ORDER BY content")
        left = cursor.fetchall()
    assert [(row[1], row[2]) for row in left] == [("scratch", "Charlie's"), ("default", "keep me")]


def test_stats_and_health_answer_for_the_caller(live, cast):
    url, key = live.mcp_url, cast.alice_key.raw
    call(url, key, "remember", {"content": "counted", "namespace": "n1"})
    call(url, key, "recall", {"query": "counted", "namespace": "n1"})
    usage_events(2, user_id=cast.alice.id)

    stats = structured(call(url, key, "memory_stats", {}))
    health = structured(call(url, key, "health_check", {}))

    assert [(n["namespace"], n["count"]) for n in stats["namespaces"]] == [("n1", 1)]
    assert stats["history_rows"] == 1
    assert stats["latency"]["calls"] >= 2
    assert stats["latency"]["p50_ms"] is not None
    assert stats["cache"]["misses"] >= 1
    assert health["status"] == "ok"
    assert health["database"]["ok"] and health["embedder"]["ok"]
    assert health["queue"]["depth"] == 0
    assert health["version"]
    assert settings.SECRET_KEY not in str(health)


@pytest.mark.django_db(transaction=True)
def test_the_lifecycle_tools_work_over_stdio(cast):
    results = run_session(
        stdio_server(cast.alice_key.raw, JOB_POLL_SECONDS="0.1"),
        "legacy",
        [
            ("remember", {"messages": CONVERSATION, "thread_id": "stdio", "priority": "high"}),
            ("remember", {"content": "queued over stdio", "async": True}),
            ("list_memories", {"thread_id": "stdio"}),
            ("memory_stats", {}),
            ("health_check", {}),
        ],
    )
    thread, queued, listed, stats, health = (structured(r) for r in results)

    assert thread["count"] == 3
    assert [m["priority"] for m in listed["memories"]] == ["high"] * 3
    history = run_session(
        stdio_server(cast.alice_key.raw),
        "legacy",
        [("memory_history", {"id": listed["memories"][0]["id"]})],
    )
    [created] = structured(history[0])["history"]
    assert (created["client"], created["api_key_id"]) == ("stdio", str(cast.alice_key.key.id))
    assert stats["memories"] in (3, 4)  # 4 once the worker has stored the queued one
    assert health["status"] == "ok"
    # The stdio process ran its own worker: the queued add landed.
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        [status] = run_session(
            stdio_server(cast.alice_key.raw),
            "legacy",
            [("job_status", {"job_id": queued["job_id"]})],
        )
        if structured(status)["status"] == "done":
            break
        time.sleep(0.2)
    assert structured(status)["status"] == "done"


@pytest.mark.django_db(transaction=True)
def test_a_standalone_worker_runs_jobs_queued_by_a_server_without_workers(cast, tmp_path):
    with LiveServer(env={"JOB_WORKERS": "0", "RATE_LIMIT_FREE": "1000/min"}) as server:
        key = cast.alice_key.raw
        first = structured(
            call(server.mcp_url, key, "remember", {"content": "queued first", "async": True})
        )
        time.sleep(0.5)
        assert (
            structured(call(server.mcp_url, key, "job_status", {"job_id": first["job_id"]}))[
                "status"
            ]
            == "queued"
        )

        env = {
            **os.environ,
            "DATABASE_URL": database_url(),
            "SECRET_KEY": settings.SECRET_KEY,
            "API_KEY_SECRET": settings.API_KEY_SECRET,
            "JOB_POLL_SECONDS": "30",  # so the second job can only be found through NOTIFY
        }
        worker = subprocess.Popen(
            [sys.executable, "-m", "recall", "worker", "--threads", "2"],
            cwd=settings.BASE_DIR,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert (
                wait_for_job(server.mcp_url, key, first["job_id"], timeout=60)["status"] == "done"
            )
            second = structured(
                call(server.mcp_url, key, "remember", {"content": "queued second", "async": True})
            )
            assert (
                wait_for_job(server.mcp_url, key, second["job_id"], timeout=20)["status"] == "done"
            )
        finally:
            worker.terminate()
            _, errors = worker.communicate(timeout=30)
        assert worker.returncode == 0, errors[-2000:]
    assert len(usage_events(5, user_id=cast.alice.id)) >= 5


def test_each_call_leaves_one_usage_event(live, cast):
    calls(
        live.mcp_url,
        cast.alice_key.raw,
        [("memory_stats", {}), ("health_check", {}), ("memory_history", {"id": "nope"})],
    )

    events = usage_events(3, user_id=cast.alice.id)

    assert [(e.tool_name, e.success, e.error_code) for e in events] == [
        ("memory_stats", True, None),
        ("health_check", True, None),
        ("memory_history", False, "validation_failed"),
    ]
