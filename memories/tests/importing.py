"""Writing other servers' files in the shape they have, for the import tests and bench/imports.py.

Everything is made here from the fixture data in fixtures/imports/ (or a
benchmark's generated records) with the standard library: an OpenMemory
export zip, and an mcp-memory-service SQLite-vec database whose ``vec0``
table is laid out as sqlite-vec lays it out (memories/importers/
mcp_memory_service.py describes it), without the extension.
"""

from __future__ import annotations

import gzip
import json
import sqlite3
import struct
import zipfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "imports"
CHUNK_SIZE = 1024  # sqlite-vec's default chunk size


def openmemory_zip(path: Path, *, with_lines: bool = True) -> Path:
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.write(FIXTURES / "openmemory" / "memories.json", "memories.json")
        if with_lines:
            lines = (FIXTURES / "openmemory" / "memories.jsonl").read_bytes()
            archive.writestr("memories.jsonl.gz", gzip.compress(lines))
    return path


def mcp_memory_service_db(
    path: Path,
    rows: Iterable[dict[str, Any]],
    vector_for: Callable[[list[str]], np.ndarray] | None,
    *,
    dimensions: int = 384,
    batch: int = 512,
) -> Path:
    """Write rows ({content, tags, memory_type, metadata, created_at, deleted_at?}) as its database.

    ``vector_for`` turns a list of contents into vectors (None: the
    embeddings table is left out, as in a database without vectors).
    """
    db = sqlite3.connect(path)
    db.executescript(
        """
        CREATE TABLE metadata (key TEXT PRIMARY KEY, value TEXT NOT NULL);
        INSERT INTO metadata VALUES ('distance_metric', 'cosine');
        CREATE TABLE memories (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            content_hash TEXT UNIQUE NOT NULL,
            content TEXT NOT NULL,
            tags TEXT,
            memory_type TEXT,
            metadata TEXT,
            created_at REAL,
            updated_at REAL,
            created_at_iso TEXT,
            updated_at_iso TEXT,
            deleted_at REAL DEFAULT NULL
        );
        CREATE INDEX idx_content_hash ON memories(content_hash);
        """
    )
    if vector_for is not None:
        db.executescript(
            """
            CREATE TABLE memory_embeddings_chunks (chunk_id INTEGER PRIMARY KEY AUTOINCREMENT,
                size INTEGER NOT NULL, validity BLOB NOT NULL, rowids BLOB NOT NULL);
            CREATE TABLE memory_embeddings_rowids (rowid INTEGER PRIMARY KEY AUTOINCREMENT, id,
                chunk_id INTEGER, chunk_offset INTEGER);
            CREATE TABLE memory_embeddings_vector_chunks00 (rowid PRIMARY KEY,
                vectors BLOB NOT NULL);
            """
        )
        # The virtual table's own entry: what CREATE VIRTUAL TABLE ... USING vec0
        # leaves in sqlite_master, written directly since the module is not loaded.
        db.execute("PRAGMA writable_schema = ON")
        db.execute(
            "INSERT INTO sqlite_master (type, name, tbl_name, rootpage, sql) VALUES"
            " ('table', 'memory_embeddings', 'memory_embeddings', 0, ?)",
            (
                "CREATE VIRTUAL TABLE memory_embeddings USING vec0(\n"
                f"    content_embedding FLOAT[{dimensions}] distance_metric=cosine\n)",
            ),
        )
        db.execute("PRAGMA writable_schema = OFF")
    chunk = _Chunk(db, dimensions) if vector_for is not None else None
    pending: list[dict[str, Any]] = []

    def flush() -> None:
        vectors = vector_for([r["content"] for r in pending]) if vector_for else None
        for n, row in enumerate(pending):
            created = row.get("created_at")
            cursor = db.execute(
                "INSERT INTO memories (content_hash, content, tags, memory_type, metadata,"
                " created_at, updated_at, created_at_iso, updated_at_iso, deleted_at)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    _hash(row["content"]),
                    row["content"],
                    row.get("tags") or "",
                    row.get("memory_type"),
                    json.dumps(row["metadata"]) if row.get("metadata") is not None else "{}",
                    created,
                    row.get("updated_at", created),
                    None,
                    None,
                    row.get("deleted_at"),
                ),
            )
            if chunk is not None and vectors is not None:
                chunk.add(int(cursor.lastrowid or 0), np.asarray(vectors[n], dtype="<f4"))
        pending.clear()

    for row in rows:
        pending.append(row)
        if len(pending) >= batch:
            flush()
    flush()
    if chunk is not None:
        chunk.close()
    db.commit()
    db.close()
    return path


def _hash(text: str) -> str:
    import hashlib

    return hashlib.sha256(text.encode("utf-8")).hexdigest()


class _Chunk:
    """Fills vec0 chunks as sqlite-vec does: a validity bitmap, rowids, packed vectors."""

    def __init__(self, db: sqlite3.Connection, dimensions: int) -> None:
        self.db = db
        self.dimensions = dimensions
        self.id: int | None = None
        self.used = 0
        self.validity = bytearray(CHUNK_SIZE // 8)
        self.rowids = bytearray(CHUNK_SIZE * 8)
        self.vectors = bytearray(CHUNK_SIZE * dimensions * 4)

    def add(self, rowid: int, vector: np.ndarray) -> None:
        if self.id is None or self.used == CHUNK_SIZE:
            self.close()
            cursor = self.db.execute(
                "INSERT INTO memory_embeddings_chunks (size, validity, rowids) VALUES (?, ?, ?)",
                (CHUNK_SIZE, bytes(CHUNK_SIZE // 8), bytes(CHUNK_SIZE * 8)),
            )
            self.id = int(cursor.lastrowid or 0)
            self.used = 0
            self.validity = bytearray(CHUNK_SIZE // 8)
            self.rowids = bytearray(CHUNK_SIZE * 8)
            self.vectors = bytearray(CHUNK_SIZE * self.dimensions * 4)
        offset = self.used
        self.validity[offset // 8] |= 1 << (offset % 8)
        struct.pack_into("<q", self.rowids, offset * 8, rowid)
        size = self.dimensions * 4
        self.vectors[offset * size : (offset + 1) * size] = vector.astype("<f4").tobytes()
        self.db.execute(
            "INSERT INTO memory_embeddings_rowids (rowid, id, chunk_id, chunk_offset)"
            " VALUES (?, NULL, ?, ?)",
            (rowid, self.id, offset),
        )
        self.used += 1

    def close(self) -> None:
        if self.id is None:
            return
        self.db.execute(
            "UPDATE memory_embeddings_chunks SET validity = ?, rowids = ? WHERE chunk_id = ?",
            (bytes(self.validity), bytes(self.rowids), self.id),
        )
        self.db.execute(
            "INSERT OR REPLACE INTO memory_embeddings_vector_chunks00 (rowid, vectors)"
            " VALUES (?, ?)",
            (self.id, bytes(self.vectors)),
        )
