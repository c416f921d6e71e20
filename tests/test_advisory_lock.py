"""``pooling.advisory_lock`` beside a migration's ``CREATE INDEX CONCURRENTLY``.

A concurrent index build waits for every snapshot older than its own. A
process that waited for the start-up lock inside a blocking statement held
one, while the migrating process that held the lock built an index: PostgreSQL
failed the waiter as a deadlock, so of servers started together on an empty
database all but one crashed. Behind a transaction pooler the holder's own
open transaction kept a snapshot too, and its migrations waited for it
forever.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import psycopg
import pytest
from django.db import connection, connections
from django.test import override_settings

from core import pooling

LOCK = 815_004


def _direct() -> dict[str, Any]:
    params = connection.get_connection_params()
    return {"host": params["host"], "port": params.get("port"), "dbname": params["dbname"]}


def _superuser() -> psycopg.Connection:
    return psycopg.connect(**_direct(), user="postgres", autocommit=True)


def _build_an_index_concurrently(name: str) -> None:
    """What a migration does; fails if an older snapshot keeps it waiting for 5 s."""
    with _superuser() as su:
        su.execute("SET statement_timeout = '5s'")
        su.execute(f"DROP TABLE IF EXISTS {name}")
        su.execute(f"CREATE TABLE {name} (x int)")
        su.execute(f"INSERT INTO {name} SELECT generate_series(1, 100)")
        try:
            su.execute(f"CREATE INDEX CONCURRENTLY {name}_x ON {name} (x)")
        finally:
            su.execute(f"DROP TABLE IF EXISTS {name}")


@pytest.mark.django_db(transaction=True)
def test_a_process_waiting_for_the_lock_holds_no_snapshot_the_holders_index_build_waits_for(
    caplog,
):
    with _superuser() as holder:
        holder.execute("SELECT pg_advisory_lock(%s)", [LOCK])
        outcome: list[bool] = []

        def wait_for_it() -> None:
            try:
                with pooling.advisory_lock(LOCK) as held:
                    outcome.append(held)
            finally:
                connections.close_all()

        waiter = threading.Thread(target=wait_for_it)
        waiter.start()
        time.sleep(1)  # waiting by now

        _build_an_index_concurrently("lock_wait_probe")

        assert outcome == []
        holder.execute("SELECT pg_advisory_unlock(%s)", [LOCK])
        waiter.join(10)
    assert outcome == [True]
    # The operator learns why a server is not up yet: the line was written to
    # a logger the configuration left at WARNING, whatever LOG_LEVEL said.
    assert pooling.logger.isEnabledFor(logging.INFO)
    assert "waiting for another process's advisory lock" in caplog.text


@pytest.mark.django_db(transaction=True)
def test_behind_a_pooler_the_open_transaction_holding_the_lock_keeps_no_snapshot(monkeypatch):
    monkeypatch.setattr(pooling, "lock_params", lambda: {**_direct(), "user": "postgres"})
    with override_settings(DATABASE_POOL_MODE="transaction", DATABASE_DIRECT_URL=None):
        with pooling.advisory_lock(LOCK) as held:
            assert held is True
            _build_an_index_concurrently("lock_hold_probe")
            with pooling.advisory_lock(LOCK, wait=False) as second:
                assert second is False
        with pooling.advisory_lock(LOCK, wait=False) as again:
            assert again is True
