"""Recall behind PgBouncer in transaction mode, as managed PostgreSQL services deploy it.

A real ``pgbouncer`` (Debian's package) pools the test database with two
server connections, so the server's transactions take turns on them and
whatever one left on a server connection would meet the next. The server is
``recall serve`` with ``DATABASE_POOL_MODE=transaction``: it migrates and
bootstraps through the pooler, runs every tool through it, and background
workers, the rate limiter, usage events and OAuth tokens work as they do on a
database of its own. Without pgbouncer installed these tests skip, unless
RECALL_NO_SKIPS=1 (CI), where that is a failure.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import httpx2
import psycopg
import pytest
from django.db import connection
from django.test import override_settings

from accounts.models import User
from conftest import issue_key
from core import pooling, tenancy
from memories import services
from memories.models import Memory
from tests.clients import call, raw_call, structured
from tests.conftest import usage_events
from tests.pgbouncer import PgBouncer, PgBouncerMissing
from tests.support import LiveServer
from tests.test_protected_resource import mint

pytestmark = pytest.mark.slow

LOCK = 0x7465_7374_6C6B  # an advisory lock key of these tests' own


def _params() -> dict[str, Any]:
    return connection.get_connection_params()


def superuser() -> psycopg.Connection:
    """A direct superuser connection to the test database: sees every session and row."""
    params = _params()
    return psycopg.connect(
        host=params["host"], port=params.get("port"), user="postgres", dbname=params["dbname"],
        autocommit=True,
    )  # fmt: skip


@pytest.fixture(scope="module")
def bouncer(django_db_setup, django_db_blocker) -> Iterator[PgBouncer]:
    with django_db_blocker.unblock():
        params = _params()
    try:
        server = PgBouncer.start_new(params["host"], params.get("port"), users=[params["user"]])
    except PgBouncerMissing as exc:
        pytest.skip(str(exc))
    yield server
    server.close()


def pooled_env(bouncer: PgBouncer, **extra: str) -> dict[str, str]:
    params = _params()
    return {
        "DATABASE_URL": bouncer.url(params["dbname"], params["user"]),
        "DATABASE_POOL_MODE": "transaction",
        "DATABASE_CONN_MAX_AGE": "300",
        "RATE_LIMIT_FREE": "1000/min",
        "RATE_LIMIT_STARTER": "3/min",
        # Every search walks the HNSW index (no exact scan), one neighbour at a
        # time: a filtered search fills its limit only by the iterative scan,
        # which behind the pooler each search transaction must switch on.
        "RECALL_EXACT_SEARCH_MAX": "0",
        "RECALL_EXACT_SEARCH_RATIO": "0",
        "HNSW_EF_SEARCH": "1",
        "JOB_WORKERS": "2",
        "JOB_POLL_SECONDS": "1",
        **extra,
    }


@pytest.fixture(scope="module")
def pooled(bouncer, django_db_blocker) -> Iterator[LiveServer]:
    """``recall serve`` whose every connection goes through the pooler."""
    with django_db_blocker.unblock():
        server = LiveServer(env=pooled_env(bouncer), workers=1).start(timeout=180)
    yield server
    server.stop()
    logs = [json.loads(line) for line in server.logs().splitlines() if line.startswith('{"')]
    errors = [e for e in logs if e["level"] == "error"]
    assert not errors, json.dumps(errors, indent=1)


@pytest.fixture
def live_pooled(pooled, transactional_db) -> Iterator[LiveServer]:
    yield pooled
    settle(pooled)


def settle(server: LiveServer | None = None, timeout: float = 20.0) -> None:
    """Wait until the server has written its usage events and no connection is busy.

    The test database is emptied next; an event written after that would
    name a user who is gone.
    """
    deadline = time.monotonic() + timeout
    while server is not None and time.monotonic() < deadline:
        usage = httpx2.get(f"{server.url}/ready", timeout=10).json().get("usage_events", {})
        if not usage.get("queued") and not usage.get("held"):
            break
        time.sleep(0.05)
    with superuser() as su:
        while time.monotonic() < deadline:
            (busy,) = su.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                " AND pid <> pg_backend_pid() AND state NOT IN ('idle')"
                " AND backend_type = 'client backend'"
            ).fetchone() or (0,)
            if not busy:
                return
            time.sleep(0.05)


def server_connections(bouncer: PgBouncer) -> list[dict[str, Any]]:
    """What each of the pooler's server connections holds, seen from inside it.

    Two clients each hold a transaction open, which pins both server
    connections of the pool, one each; then each reads its session's state.
    """
    params = _params()
    clients = [bouncer.connect(params["dbname"], params["user"]) for _ in range(2)]
    try:
        seen = []
        for client in clients:
            row = client.execute(
                "SELECT pg_backend_pid(), current_user,"
                " coalesce(current_setting('app.current_user_id', true), ''),"
                " coalesce(current_setting('app.actor', true), ''),"
                " coalesce(current_setting('hnsw.iterative_scan', true), ''),"
                " current_setting('enable_seqscan'),"
                " (SELECT count(*) FROM pg_prepared_statements),"
                " (SELECT count(*) FROM pg_cursors),"
                " (SELECT count(*) FROM pg_listening_channels())"
            ).fetchone()
            assert row is not None
            keys = ("pid", "role", "tenant", "actor", "iterative_scan", "seqscan")
            seen.append(
                dict(zip(keys, row[:6], strict=True))
                | {"prepared": row[6], "cursors": row[7], "listening": row[8]}
            )
        return seen
    finally:
        for client in clients:
            client.rollback()
            client.close()


def recall(server: LiveServer, key: str, query: str, **arguments: Any) -> list[str]:
    result = call(server.mcp_url, key, "recall", {"query": query, **arguments})
    assert not result.is_error, structured(result)
    return [m["content"] for m in structured(result)["memories"]]


def test_every_tool_path_works_through_the_pooler_and_leaves_nothing_on_its_connections(
    live_pooled, bouncer, cast
):
    key = cast.alice_key.raw
    for n in range(12):  # other namespaces: the filtered walk must pass them by
        other = f"Unrelated note {n}: the garden shed needs a new padlock and paint."
        assert not call(live_pooled.mcp_url, key, "remember", {"content": other}).is_error
    facts = [
        "Alice prefers green tea to coffee in the morning.",
        "Alice deploys the backend on Tuesdays after standup.",
        "Alice keeps project notes in plain Markdown files.",
    ]
    for fact in facts:
        stored = call(live_pooled.mcp_url, key, "remember", {"content": fact, "namespace": "work"})
        assert not stored.is_error, structured(stored)

    for mode in ("hybrid", "semantic"):
        found = recall(live_pooled, key, "tea, deploys, notes", namespace="work", mode=mode,
                       threshold=0)  # fmt: skip
        # One neighbour per step of the walk: all three only by the iterative scan.
        assert sorted(found) == sorted(facts), mode
    assert recall(live_pooled, key, "Markdown", namespace="work", mode="lexical") == [facts[2]]
    # Charlie, another tenant through the same server connections, sees none of it.
    assert recall(live_pooled, cast.charlie_key.raw, "green tea", namespace="work") == []

    preview = structured(
        call(live_pooled.mcp_url, key, "forget",
             {"mode": "by_query", "query": "green tea", "namespace": "work"})
    )  # fmt: skip
    assert preview["preview"] is True and preview["matches"]
    confirmed = call(
        live_pooled.mcp_url, key, "forget",
        {"mode": "by_query", "confirmation_token": preview["confirmation_token"]},
    )  # fmt: skip
    assert structured(confirmed)["success"] is True
    assert facts[0] not in recall(live_pooled, key, "green tea", namespace="work", threshold=0)

    events = usage_events(expected=21, user_id=cast.alice.id)
    assert len(events) >= 21
    assert {e.tool_name for e in events} >= {"remember", "recall", "forget"}

    for state in server_connections(bouncer):
        assert state["role"] == _params()["user"], state  # no SET ROLE outlived its transaction
        assert state["tenant"] == "" and state["actor"] == "", state
        assert state["iterative_scan"] in ("", "off"), state  # only ever SET LOCAL
        assert state["seqscan"] == "on", state
        assert (state["prepared"], state["cursors"], state["listening"]) == (0, 0, 0), state
    with superuser() as su:
        held = su.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'").fetchone()
    assert held == (0,)  # the start-up lock went with its transaction


def test_background_adds_are_run_through_the_pooler(live_pooled, cast):
    key = cast.alice_key.raw
    queued = structured(
        call(live_pooled.mcp_url, key, "remember",
             {"content": "Alice's flight to Lisbon leaves at nine.", "async": True})
    )  # fmt: skip
    # One queued by another process, here the test's: its NOTIFY reaches no
    # listener (there is none behind the pooler without DATABASE_DIRECT_URL),
    # so the server's workers find it by polling.
    elsewhere = services.remember(
        user_id=cast.alice.id, tier="free", content="Alice's hotel is near the river.",
        background=True,
    )  # fmt: skip

    def status(job_id: str) -> str:
        found = call(live_pooled.mcp_url, key, "job_status", {"job_id": job_id})
        return str(structured(found)["status"])

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if status(queued["job_id"]) == status(elsewhere["job_id"]) == "done":
            break
        time.sleep(0.2)
    assert (status(queued["job_id"]), status(elsewhere["job_id"])) == ("done", "done")
    assert set(recall(live_pooled, key, "Lisbon flight, river hotel", threshold=0)) == {
        "Alice's flight to Lisbon leaves at nine.",
        "Alice's hotel is near the river.",
    }


def test_the_rate_limit_holds_through_the_pooler(live_pooled, cast):
    with tenancy.operator():
        User.objects.filter(id=cast.charlie.id).update(tier="starter")
    key = issue_key(cast.charlie, "charlie starter", tier="starter").raw

    statuses = [
        raw_call(live_pooled.mcp_url, key, "list_memories", {}).status_code for _ in range(4)
    ]

    assert statuses == [200, 200, 200, 429]


def test_an_oauth_token_is_checked_through_the_pooler(live_pooled, cast, agents):
    token = mint(cast.alice, agents.research, live_pooled.url + "/mcp")
    stored = call(live_pooled.mcp_url, token, "remember", {"content": "Research notes: done."})
    assert not stored.is_error, structured(stored)
    revoked = raw_call(live_pooled.mcp_url, "not-a-token", "list_memories", {})

    assert recall(live_pooled, token, "research notes", threshold=0) == ["Research notes: done."]
    assert revoked.status_code == 401
    with tenancy.tenant(cast.alice.id):
        assert Memory.objects.get().agent_id == agents.research.id


def test_the_listener_uses_the_direct_connection_when_there_is_one(bouncer, transactional_db):
    direct = _params()
    name = f"recall-direct-{uuid.uuid4().hex[:8]}"
    port = f":{direct['port']}" if direct.get("port") else ""
    url = (
        f"postgres://{direct['user']}@{quote(direct['host'], safe='')}{port}/{direct['dbname']}"
        f"?application_name={name}"
    )
    env = pooled_env(bouncer, DATABASE_DIRECT_URL=url)
    with LiveServer(env=env, workers=1) as server:
        deadline = time.monotonic() + 30
        listening: list[tuple[str, ...]] = []
        while time.monotonic() < deadline and not listening:
            with superuser() as su:
                listening = su.execute(
                    "SELECT query FROM pg_stat_activity WHERE application_name = %s"
                    " AND query LIKE 'LISTEN%%'",
                    [name],
                ).fetchall()
            time.sleep(0.1)
        assert listening, server.logs()[-2000:]
    settle()


def test_a_session_lock_taken_through_the_pooler_outlives_its_client(bouncer, transactional_db):
    """Why ``pooling.advisory_lock`` exists: PgBouncer keeps the server connection, lock and all."""
    params = _params()
    with bouncer.connect(params["dbname"], params["user"], autocommit=True) as client:
        client.execute("SELECT pg_advisory_lock(%s)", [LOCK])
    try:
        with superuser() as su:
            held = su.execute(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted"
            ).fetchone()
        assert held == (1,)
    finally:
        # No client can reach that session again to unlock it.
        with superuser() as su:
            su.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_locks"
                " WHERE locktype = 'advisory' AND pid <> pg_backend_pid()"
            )


def test_the_advisory_lock_helper_holds_a_lock_only_while_its_block_runs(
    bouncer, transactional_db, monkeypatch
):
    params = _params()
    through = {
        "host": "127.0.0.1", "port": bouncer.port, "dbname": params["dbname"],
        "user": params["user"],
    }  # fmt: skip
    monkeypatch.setattr(pooling, "lock_params", lambda: through)

    def taken_elsewhere() -> bool:
        with superuser() as su:
            row = su.execute("SELECT pg_try_advisory_lock(%s)", [LOCK]).fetchone()
            if row and row[0]:
                su.execute("SELECT pg_advisory_unlock(%s)", [LOCK])
                return False
        return True

    with override_settings(DATABASE_POOL_MODE="transaction", DATABASE_DIRECT_URL=None):
        # Another client's transaction on the pooler meanwhile, as the
        # server's threads would run: it must not get the lock's session.
        with (
            pooling.advisory_lock(LOCK) as held,
            bouncer.connect(params["dbname"], params["user"]) as other,
        ):
            other.execute("SELECT 1")
            assert held is True
            assert taken_elsewhere()
            other.rollback()
            with pooling.advisory_lock(LOCK, wait=False) as second:
                assert second is False
        assert not taken_elsewhere()
        with pooling.advisory_lock(LOCK, wait=False) as again:
            assert again is True
    with superuser() as su:
        assert su.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'"
        ).fetchone() == (0,)
