"""The stall watch (core/stalls.py) on the real database: what it leaves alone.

What it ends, a wait on a database that stopped answering, is tested end to
end in tests/test_fault_embedded_postgres.py, on a server of its own.
"""

from __future__ import annotations

import logging

import pytest
from django.db import connection

from core import stalls


@pytest.fixture
def watched(settings):
    settings.DATABASE_STALL_SECONDS = 0.5
    connection.close()
    stalls.install()
    yield
    stalls.uninstall()
    connection.close()


@pytest.mark.django_db(transaction=True)
def test_a_long_statement_on_a_live_database_runs_to_its_end(watched, caplog):
    with caplog.at_level(logging.WARNING, logger="recall.stalls"), connection.cursor() as cursor:
        cursor.execute("SELECT pg_sleep(2.5), 42")
        assert cursor.fetchone()[1] == 42

    assert type(connection.connection) is stalls.WatchedConnection
    assert "stopped answering" not in caplog.text
    assert stalls._waiting == {}


@pytest.mark.django_db(transaction=True)
def test_with_the_watch_off_connections_stay_as_psycopg_made_them(settings):
    settings.DATABASE_STALL_SECONDS = 0
    connection.close()
    stalls.install()
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")

    assert type(connection.connection) is not stalls.WatchedConnection
