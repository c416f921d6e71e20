"""An SQLite file built so that reading it never ends, imported as mcp-memory-service.

A 4 KB file whose ``memories`` is a view over an endless recursive query held
a job worker in SQLite's C code, sorting to disk, past the job's time limit
and SIGTERM. Each case must end on its own, with a message naming the file
and the problem; the bounds on waiting are generous, for it is the ending
that is tested, not its speed.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path

import pytest
from django.core.management.base import CommandError
from django.db import connection

from accounts.tiers import Tier
from core.errors import ValidationFailed
from memories import services
from memories.importers import Source, sqlitefile
from memories.importers.run import Options, estimate_total, run_import
from memories.tests.importing import mcp_memory_service_db
from memories.tests.test_import_from import fixture_rows, imported, rows

pytestmark = pytest.mark.django_db(transaction=True)

WATCHDOG_SECONDS = 60

ENDLESS = (
    "CREATE VIEW memories AS WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i+1 FROM n)"
    " SELECT i AS id, 'same' AS content_hash, 'the same memory again' AS content FROM n;"
)


def sqlite_file(path: Path, script: str) -> Path:
    db = sqlite3.connect(path)
    db.executescript(script)
    db.commit()
    db.close()
    return path


def ended(work: threading.Thread) -> bool:
    work.join(WATCHDOG_SECONDS)
    return not work.is_alive()


def test_an_endless_view_fails_the_job_at_once_and_frees_the_worker(cast, tmp_path):
    bomb = sqlite_file(tmp_path / "hang.db", ENDLESS)
    job_id = services.enqueue_import(
        user_id=cast.alice.id,
        tier=Tier.PRO,
        filename="hang.db",
        options={"format": "mcp-memory-service"},
        chunks=[bomb.read_bytes()],
    )

    def work() -> None:
        try:
            services.run_next_job()
        finally:
            connection.close()

    worker = threading.Thread(target=work, daemon=True)
    worker.start()

    assert ended(worker), "the job worker is still reading the file"
    [job] = [j for j in services.import_jobs(user_id=cast.alice.id) if j["id"] == job_id]
    assert job["status"] == "failed"
    assert job["error_message"] == "hang.db: memories is a view, not a table; only tables are read."
    assert rows(cast.alice) == []


def test_the_command_refuses_an_endless_view_and_counts_nothing(cast, tmp_path):
    bomb = sqlite_file(tmp_path / "hang.db", ENDLESS)
    outcome: list[BaseException] = []

    def work() -> None:
        try:
            imported("alice@example.com", "mcp-memory-service", bomb)
        except BaseException as error:
            outcome.append(error)
        finally:
            connection.close()

    worker = threading.Thread(target=work, daemon=True)
    worker.start()

    assert ended(worker)
    assert isinstance(outcome[0], CommandError)
    assert "memories is a view, not a table" in str(outcome[0])
    assert estimate_total(Source.at(bomb), "mcp-memory-service") is None


@pytest.mark.parametrize(
    ("script", "said"),
    [
        (
            "CREATE VIRTUAL TABLE memories USING fts5(content_hash, content);",
            "memories is a virtual table, not a table",
        ),
        (
            "CREATE TABLE memories (id INTEGER PRIMARY KEY, content_hash TEXT,"
            " content TEXT GENERATED ALWAYS AS (printf('%.*c', 100000000, 'x')));"
            " INSERT INTO memories (id, content_hash) VALUES (1, 'a');",
            "memories has generated columns; only stored values are read",
        ),
        (
            "CREATE TABLE memories (id INTEGER PRIMARY KEY, content_hash TEXT, content TEXT);"
            " INSERT INTO memories VALUES (1, 'a', 'fine');"
            " CREATE TABLE memory_embeddings_chunks"
            " (chunk_id INTEGER PRIMARY KEY, validity, rowids);"
            " CREATE VIEW memory_embeddings_rowids AS WITH RECURSIVE n(i) AS"
            " (SELECT 1 UNION ALL SELECT i+1 FROM n) SELECT i AS rowid, 1 AS chunk_id,"
            " 0 AS chunk_offset FROM n;"
            " CREATE TABLE memory_embeddings_vector_chunks00 (rowid PRIMARY KEY, vectors);"
            # Names the vectors' width as sqlite-vec's own entry does.
            " CREATE TABLE memory_embeddings (content_embedding 'FLOAT[4]');",
            "memory_embeddings_rowids is a view, not a table",
        ),
    ],
    ids=["virtual", "generated", "view-of-vectors"],
)
def test_only_ordinary_tables_are_read(cast, tmp_path, script, said):
    path = sqlite_file(tmp_path / "odd.db", script)

    with pytest.raises(CommandError, match=said):
        imported("alice@example.com", "mcp-memory-service", path)
    assert rows(cast.alice) == []


def test_a_read_that_spends_its_budget_of_steps_stops_naming_the_file(cast, tmp_path, monkeypatch):
    db = mcp_memory_service_db(tmp_path / "sqlite_vec.db", fixture_rows(), None)
    # A budget a few rows spend: what an endless query spends at any budget.
    monkeypatch.setattr(sqlitefile, "EVERY", 1)
    monkeypatch.setattr(sqlitefile, "STEPS_FLOOR", 150)
    monkeypatch.setattr(sqlitefile, "STEPS_PER_BYTE", 0)

    with pytest.raises(CommandError, match=r"sqlite_vec\.db: reading it takes far more work"):
        imported("alice@example.com", "mcp-memory-service", db)


def test_a_read_past_its_deadline_stops_naming_the_time_limit(cast, tmp_path, monkeypatch):
    db = mcp_memory_service_db(tmp_path / "sqlite_vec.db", fixture_rows(), None)
    monkeypatch.setattr(sqlitefile, "EVERY", 1)

    with pytest.raises(ValidationFailed, match=r"sqlite_vec\.db: reading it ran past the import"):
        run_import(
            user_id=cast.alice.id,
            source=Source.at(db),
            options=Options(format="mcp-memory-service"),
            until=time.monotonic() - 1,
        )
    assert rows(cast.alice) == []


def test_a_live_database_whose_rows_are_still_in_its_write_ahead_log_is_read_whole(cast, tmp_path):
    # The service still running: its rows sit in the -wal file until SQLite
    # checkpoints, and the main file is a page or two. Sized by that file alone,
    # 2,000 memories were "more rows than a file of 4,096 bytes can hold".
    path = tmp_path / "live.db"
    writer = sqlite3.connect(path)
    writer.execute("PRAGMA journal_mode = WAL")
    writer.execute("PRAGMA wal_autocheckpoint = 0")
    writer.executescript(
        "CREATE TABLE memories (id INTEGER PRIMARY KEY, content_hash TEXT UNIQUE NOT NULL,"
        " content TEXT NOT NULL, tags TEXT, memory_type TEXT, metadata TEXT,"
        " created_at REAL, updated_at REAL, deleted_at REAL DEFAULT NULL);"
    )
    writer.executemany(
        "INSERT INTO memories (content_hash, content, created_at) VALUES (?, ?, ?)",
        [(f"h{n}", f"Live note number {n}.", 1_700_000_000 + n) for n in range(2_000)],
    )
    writer.commit()
    try:
        assert path.stat().st_size < Path(f"{path}-wal").stat().st_size
        out = imported("alice@example.com", "mcp-memory-service", path, "--dry-run")
    finally:
        writer.close()

    assert "Would import 2,000 of 2,000" in out, out
