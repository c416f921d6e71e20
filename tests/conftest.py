"""End-to-end suites: each drives the whole server, as clients do.

Real uvicorn on loopback ports, the SDK's clients over real sockets, `recall
stdio` subprocesses, MCP Inspector's CLI and real redis-server processes. Each
app's own unit tests live in that app's ``tests/``.
"""

from __future__ import annotations

import time

import pytest
from django.db import connection

from accounts.tests.redis_server import RedisServer, RedisServerMissing
from billing.models import UsageEvent
from core import tenancy
from tests.support import SERVER_APPLICATION_NAME, LiveServer


@pytest.fixture
def redis():
    """A redis-server of the test's own, to share between servers or kill mid-test."""
    try:
        server = RedisServer.start_new()
    except RedisServerMissing as exc:
        pytest.skip(str(exc))
    yield server
    server.close()


@pytest.fixture(scope="session")
def server(django_db_setup, django_db_blocker):
    """One real server for the session, on the test database.

    Its free tier allows 1,000 calls a minute so that functional tests need not
    pace themselves, and its team tier is all but unlimited for the fuzz
    suites; the rate-limit tests start servers with the real limits. It runs
    no background workers, so that a test can say which process runs queued
    jobs; tests of background adds start servers or workers of their own.
    """
    env = {"RATE_LIMIT_FREE": "1000/min", "RATE_LIMIT_TEAM": "1000000/min", "JOB_WORKERS": "0"}
    with django_db_blocker.unblock():
        live = LiveServer(env=env).start()
    yield live
    live.stop()


@pytest.fixture
def live(server, transactional_db):
    """The session's server, for a test whose data is committed so the server can see it."""
    yield server
    # The test database is truncated next; wait until the server is not writing
    # (usage events land just after each call) so the two cannot deadlock.
    wait_until_quiet()


def wait_until_quiet(timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    quiet_since = None
    while time.monotonic() < deadline:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE application_name = %s AND state <> 'idle'",
                [SERVER_APPLICATION_NAME],
            )
            busy = cursor.fetchone()[0]
        now = time.monotonic()
        if busy:
            quiet_since = None
        elif quiet_since is None:
            quiet_since = now
        elif now - quiet_since > 0.2:
            return
        time.sleep(0.05)


def usage_events(expected: int | None = None, timeout: float = 10.0, **filters) -> list[UsageEvent]:
    """Read usage events (operator path), waiting for the server's writer to catch up."""
    deadline = time.monotonic() + timeout
    while True:
        with tenancy.operator():
            events = list(UsageEvent.objects.filter(**filters).order_by("id"))
        if expected is None or len(events) >= expected or time.monotonic() > deadline:
            return events
        time.sleep(0.1)
