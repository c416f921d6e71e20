"""A server on an external PostgreSQL while that database goes away and comes back.

The server does not own the database (a second embedded server, reached by
DATABASE_URL), so it must not try to restart it; it answers 503 and
``unavailable`` meanwhile, holds usage events, and recovers by itself.
"""

from __future__ import annotations

import json
import time

import httpx2
import pytest

from tests.clients import raw_call
from tests.databases import Database
from tests.load import WriteLoad
from tests.support import LiveServer

pytestmark = pytest.mark.slow


@pytest.fixture
def database(tmp_path):
    database = Database(tmp_path)
    database.start()
    database.migrate()
    yield database
    if database.process is not None:
        database.stop()


def ready(server: LiveServer) -> httpx2.Response:
    return httpx2.get(f"{server.url}/ready", timeout=30)


def wait_ready(server: LiveServer, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while ready(server).status_code != 200:
        assert time.monotonic() < deadline, "the server did not recover"
        time.sleep(0.2)


def test_an_outage_is_503_and_unavailable_then_recovers_without_losing_usage(database):
    busy = database.issue_key("busy@example.com")
    idle = database.issue_key("idle@example.com")
    server = LiveServer(env={"DATABASE_URL": database.url, "DATABASE_CONN_MAX_AGE": "300"}).start()
    try:
        assert raw_call(server.mcp_url, busy, "remember", {"content": "before"}).status_code == 200

        database.stop()
        # A key the server has not seen: it cannot tell, so 503, never 401 or 500.
        refused = raw_call(server.mcp_url, idle, "list_memories", {})
        # A cached key reaches the tool, which reports a retryable error.
        during = raw_call(server.mcp_url, busy, "remember", {"content": "during"})
        down = ready(server)
        # Django's side, here the key API, says the same.
        keys = httpx2.get(
            f"{server.url}/api/keys", headers={"Authorization": f"Bearer {idle}"}, timeout=30
        )

        assert refused.status_code == 503
        assert refused.headers["retry-after"] == "2"
        assert refused.json()["error"]["data"]["error"]["code"] == "unavailable"
        assert during.status_code == 200
        result = during.json()["result"]
        assert result["isError"] is True
        assert result["structuredContent"]["error"]["code"] == "unavailable"
        assert down.status_code == 503
        assert keys.status_code == 503
        assert keys.headers["retry-after"] == "2"
        assert keys.json()["error"]["code"] == "unavailable"
        assert down.json()["usage_events"]["held"] >= 1
        assert down.json()["usage_events"]["dropped"] == 0

        database.start()
        wait_ready(server)
        after = raw_call(server.mcp_url, idle, "remember", {"content": "after"})
        assert after.json()["result"]["isError"] is False
        # Held events reach the table once the database is back: one per call.
        deadline = time.monotonic() + 30
        while True:
            with database.connect() as conn:
                rows = conn.execute(
                    "SELECT tool_name, error_code FROM usage_events ORDER BY occurred_at"
                ).fetchall()
            if len(rows) >= 3 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert rows == [("remember", None), ("remember", "unavailable"), ("remember", None)]
        assert ready(server).json()["usage_events"] == {"queued": 0, "held": 0, "dropped": 0}
    finally:
        server.stop()
    logs = [json.loads(line) for line in server.logs().splitlines() if line.startswith("{")]
    errors = [entry for entry in logs if entry["level"] == "error"]
    assert errors == []  # an outage is warned about, not an error per request
    outage_warnings = [e for e in logs if e["event"] == "database unavailable"]
    # Once per place that met it (the gate, tool calls, usage events, /ready,
    # the job workers and maintenance), not once per request.
    assert 1 <= len(outage_warnings) <= 6


def test_writes_under_load_survive_an_external_restart(database):
    key = database.issue_key("writer@example.com")
    server = LiveServer(env={"DATABASE_URL": database.url, "RATE_LIMIT_PRO": "100000/min"}).start()
    try:
        with WriteLoad(server.mcp_url, key, tag="external") as load:
            load.wait_for(20)
            database.stop()
            load.wait_for(10)
            database.start()
            wait_ready(server)
            load.wait_for(20)
    finally:
        server.stop()

    kinds = load.kinds()
    assert set(kinds) <= {"ok", "unavailable", "http 503"}, kinds
    assert kinds["unavailable"] + kinds["http 503"] >= 1
    with database.connect() as conn:
        stored = {row[0] for row in conn.execute("SELECT content FROM memories")}
    assert set(load.acknowledged()) <= stored
    assert not load.refused() & stored
