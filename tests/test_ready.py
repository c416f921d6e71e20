"""/ready answers 503 with the reason while the database is down, and recovers."""

from __future__ import annotations

import time

import httpx2
import pytest

from tests.databases import Database
from tests.support import LiveServer

pytestmark = pytest.mark.slow


def test_ready_is_503_while_the_database_is_down(tmp_path):
    database = Database(tmp_path)
    database.start()
    database.migrate()
    server = LiveServer(env={"DATABASE_URL": database.url}).start()
    try:
        assert httpx2.get(f"{server.url}/ready").status_code == 200

        database.stop()
        down = httpx2.get(f"{server.url}/ready", timeout=30)
        health = httpx2.get(f"{server.url}/health")

        assert down.status_code == 503
        assert down.json()["status"] == "unavailable"
        assert down.json()["checks"] == {
            "database": "unavailable: the database did not answer",
            "embedder": "ok",
        }
        assert health.status_code == 200  # liveness never touches the database

        database.start()
        deadline = time.monotonic() + 30
        while httpx2.get(f"{server.url}/ready").status_code != 200:
            assert time.monotonic() < deadline, "the server did not recover"
            time.sleep(0.2)
    finally:
        server.stop()
        if database.process is not None:
            database.stop()
