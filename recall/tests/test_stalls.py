"""The stall watch (core/stalls.py) on the real database: what it leaves alone.

What it ends, a wait on a database that stopped answering, is tested end to
end in tests/test_fault_embedded_postgres.py, on a server of its own.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import struct
import threading

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


class FakeServer:
    """A TCP server that takes a connection's startup packet, then refuses it
    as a full PostgreSQL would, or says nothing at all."""

    def __init__(self, *, refuse: bool) -> None:
        self.refuse = refuse
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.held: list[socket.socket] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = self.listener.accept()
                self.held.append(conn)
                (length,) = struct.unpack("!I", conn.recv(4))
                conn.recv(length - 4)
                if self.refuse:
                    fields = b"SFATAL\0C53300\0Msorry, too many clients already\0\0"
                    conn.sendall(b"E" + struct.pack("!I", len(fields) + 4) + fields)

    def params(self) -> dict:
        return {
            "host": "127.0.0.1",
            "port": self.port,
            "user": "probe",
            "dbname": "probe",
            "sslmode": "disable",
            "connect_timeout": 1,
        }

    def close(self) -> None:
        self.listener.close()
        for conn in self.held:
            conn.close()


@pytest.mark.parametrize(("refuse", "answers"), [(True, True), (False, False)])
def test_only_a_database_that_does_not_answer_in_time_counts_as_stopped(
    monkeypatch, refuse, answers
):
    # A refusal the server sent ("too many clients") came back without a
    # SQLSTATE and was taken for silence: healthy long statements were ended.
    from core import pooling

    server = FakeServer(refuse=refuse)
    monkeypatch.setattr(pooling, "lock_params", server.params)
    try:
        assert stalls._database_answers() is answers
    finally:
        server.close()


@pytest.mark.parametrize(
    ("pooler", "database", "answers"),
    [(False, True, False), (True, False, False), (True, True, True)],
)
def test_behind_a_pooler_with_a_direct_url_both_ways_must_answer(
    monkeypatch, settings, pooler, database, answers
):
    # A paused PgBouncer held every call for as long as it was paused: the
    # check asked only the direct URL, where the database itself answered.
    from core import pooling

    settings.DATABASE_DIRECT_URL = {"NAME": "probe"}
    through, direct = FakeServer(refuse=pooler), FakeServer(refuse=database)
    monkeypatch.setattr(pooling, "default_params", through.params)
    monkeypatch.setattr(pooling, "lock_params", direct.params)
    try:
        assert stalls._database_answers() is answers
    finally:
        through.close()
        direct.close()


def test_the_watchs_outage_ends_in_the_log_once_the_database_answers_again(
    monkeypatch, settings, caplog
):
    # The watch asked only while waits were stalled: once the database came
    # back nothing stalled, it never asked again, and the log never said so.
    from core import outage, pooling

    settings.DATABASE_STALL_SECONDS = 0.5
    monkeypatch.setattr(outage, "_open", {})
    monkeypatch.setattr(outage, "_quiet", {})
    monkeypatch.setattr(stalls, "_answered_at", float("-inf"))
    silent = FakeServer(refuse=False)
    monkeypatch.setattr(pooling, "lock_params", silent.params)
    with caplog.at_level(logging.WARNING, logger="recall.outage"):
        try:
            assert stalls._database_answers() is False
        finally:
            silent.close()
        answering = FakeServer(refuse=True)
        monkeypatch.setattr(pooling, "lock_params", answering.params)
        try:
            stalls.check()  # nothing waits on the database now
        finally:
            answering.close()

    assert [r.getMessage() for r in caplog.records if r.name == "recall.outage"] == [
        "database unavailable",
        "database available again",
    ]
