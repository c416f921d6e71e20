"""/ready answers 503 with the reason while the database is down, and recovers."""

from __future__ import annotations

import socket
import threading
import time

import httpx2
import pytest

from tests.clients import raw_call
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
        assert int(down.headers["retry-after"]) > 0
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


@pytest.mark.django_db(transaction=True)
def test_ready_answers_ready_while_tool_calls_hold_every_thread(cast):
    # Its database ping waited behind the tool calls for a thread, and a busy
    # server answered 503 "the database did not answer" to its load balancer.
    with socket.socket() as hole:  # accepts, and never answers
        hole.bind(("127.0.0.1", 0))
        hole.listen()
        env = {
            "EMBEDDING_PROVIDER": "openai",
            "OPENAI_API_KEY": "sk-test-not-real",
            "OPENAI_BASE_URL": f"http://127.0.0.1:{hole.getsockname()[1]}/v1",
            "OPENAI_MAX_RETRIES": "0",
            "OPENAI_TIMEOUT": "15",
            "WORKER_THREADS": "1",
        }
        with LiveServer(env=env) as server:
            stuck = threading.Thread(
                target=raw_call,
                args=(server.mcp_url, cast.alice_key.raw, "remember", {"content": "hi"}),
            )
            stuck.start()
            time.sleep(1)  # the call is waiting on the provider, on the one thread

            ready = httpx2.get(f"{server.url}/ready", timeout=30)

            stuck.join()

    assert ready.status_code == 200, ready.text
