"""`recall serve --workers N`: several processes on one port, one set of limits, no Redis."""

from __future__ import annotations

import concurrent.futures
import json
import time

import httpx2
import pytest

from tests.clients import raw_call
from tests.conftest import usage_events
from tests.support import LiveServer

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def pids(server: LiveServer, *events: str) -> set[int]:
    """The processes that logged any of ``events``."""
    found = set()
    for line in server.logs().splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if entry.get("event") in events:
            found.add(entry["pid"])
    return found


def calls_at_once(server: LiveServer, key: str, count: int) -> list[int]:
    """``count`` list_memories calls, 16 at a time, each on a connection of its own."""

    def one(n: int) -> int:
        return raw_call(server.mcp_url, key, "list_memories", {}, call_id=n).status_code

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        return list(pool.map(one, range(count)))


def test_two_workers_admit_exactly_ten_calls_a_minute_for_one_free_key(cast):
    server = LiveServer(workers=2).start()  # the real limits: free is 10/min
    try:
        started = time.monotonic()
        statuses = calls_at_once(server, cast.alice_key.raw, 40)
        elapsed = time.monotonic() - started
        served_by = pids(server, "tool call finished", "rate limited")
    finally:
        assert server.stop() == 0  # each worker flushes its usage events as it stops

    assert len(served_by) == 2, "both workers must have answered calls"
    # Ten, the free allowance, between the workers (each on its own would
    # admit ten). A token comes back every 6 s, so a run slowed past that by a
    # busy machine may have earned one more per 6 s.
    admitted = statuses.count(200)
    assert admitted == 10 if elapsed < 6 else 10 <= admitted <= 10 + int(elapsed // 6)
    assert statuses.count(429) == 40 - statuses.count(200)
    # Exactly one usage event per call, whichever worker answered it.
    events = usage_events()
    assert len(events) == 40
    assert len({event.request_id for event in events}) == 40
    assert sum(event.error_code == "rate_limited" for event in events) == statuses.count(429)


def test_a_key_revoked_through_one_worker_stops_working_in_every_worker_at_once(cast):
    with LiveServer(workers=2, env={"RATE_LIMIT_FREE": "1000/min"}) as server:
        # Both workers authenticate Bob's key, so both have it cached. The
        # kernel hands connections to whichever worker accepts first, and a
        # worker still loading its model accepts none: a few rounds.
        for _ in range(10):
            assert calls_at_once(server, cast.bob_key.raw, 32) == [200] * 32
            if len(pids(server, "tool call finished")) == 2:
                break
        assert len(pids(server, "tool call finished")) == 2

        revoked = httpx2.delete(
            f"{server.url}/api/keys/{cast.bob_key.key.id}",
            headers={"Authorization": f"Bearer {cast.alice_key.raw}"},
        )
        assert revoked.status_code == 200, revoked.text

        # At once, in both workers: no cache TTL to wait out, no Redis.
        assert calls_at_once(server, cast.bob_key.raw, 32) == [401] * 32
        assert calls_at_once(server, cast.alice_key.raw, 8) == [200] * 8


def workers_of(server: LiveServer) -> list[int]:
    import psutil

    assert server.process is not None
    pids = []
    for child in psutil.Process(server.process.pid).children():
        # multiprocessing's resource tracker is a child too; workers run spawn_main.
        try:
            if "spawn_main" in " ".join(child.cmdline()):
                pids.append(child.pid)
        except psutil.Error:
            continue  # a worker that died and is not yet reaped
    return pids


def test_the_parent_starts_once_and_workers_restart_when_one_dies(cast):
    import os
    import signal

    with LiveServer(workers=2, env={"RATE_LIMIT_FREE": "1000/min"}) as server:
        first = workers_of(server)
        assert len(first) == 2
        os.kill(first[0], signal.SIGKILL)

        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            now = workers_of(server)
            if len(now) == 2 and first[0] not in now:
                break
            time.sleep(0.2)
        assert len(now) == 2 and first[0] not in now
        server.wait_ready()
        assert calls_at_once(server, cast.alice_key.raw, 16) == [200] * 16
        # Migrations and the first-run checks ran once, in the parent.
        assert server.logs().count('"event": "serving"') == 1
