"""mcp-memory-service: its SQLite-vec database file (``sqlite_vec.db``).

Its storage is two tables, read with the standard library alone:

* ``memories``: ``id`` (integer), ``content_hash``, ``content``, ``tags``
  (comma-separated), ``memory_type``, ``metadata`` (JSON text),
  ``created_at`` and ``updated_at`` (Unix seconds), their ``*_iso`` twins,
  and ``deleted_at`` (soft deletion, in later versions);
* ``memory_embeddings``: a sqlite-vec ``vec0`` virtual table,
  ``content_embedding FLOAT[n]``, whose rowid is the memory's id.

The extension need not be loaded: ``vec0`` keeps its data in ordinary
"shadow" tables. ``memory_embeddings_rowids`` maps a rowid to a chunk and an
offset, ``memory_embeddings_chunks`` holds each chunk's validity bitmap and
rowids (int64), and ``memory_embeddings_vector_chunks00`` each chunk's
vectors, packed little-endian float32, ``n`` to a row. A vector is taken only
when its slot is marked valid and names the same rowid.

The file does not say which model made the vectors; mcp-memory-service's
default is all-MiniLM-L6-v2, Recall's bundled model, so that is assumed
unless ``--source-model`` says otherwise. Whether they are reused is then
decided by comparing a sample with our own embeddings (memories/importers/run.py).
"""

from __future__ import annotations

import json
import re
import sqlite3
import struct
from collections import OrderedDict
from typing import Any

import numpy as np

from core.errors import ValidationFailed
from memories.importers import sqlitefile
from memories.importers.base import Record, Refused, Stream, tags, vector_from_blob
from memories.importers.sources import Source

FORMAT = "mcp-memory-service"
DEFAULT_MODEL = "all-MiniLM-L6-v2"
TABLE = "memory_embeddings"
# Its own table of memories, in the file (not ours: named apart for that reason).
SOURCE = "memories"
COLUMNS = (
    "content_hash",
    "content",
    "tags",
    "memory_type",
    "metadata",
    "created_at",
    "updated_at",
    "created_at_iso",
    "updated_at_iso",
    "deleted_at",
)


def read(
    source: Source, *, source_model: str | None = None, until: float | None = None, **_: Any
) -> Stream:
    """Yield the file's memories; ``until`` (a ``time.monotonic()``) stops the reading then."""
    guarded = sqlitefile.Database(source, until)
    try:
        yield from _rows(guarded, source_model or DEFAULT_MODEL)
    except sqlite3.Error as error:
        raise guarded.failed(error) from None
    finally:
        guarded.close()


def count(source: Source) -> int | None:
    """Return how many memories the file holds, or None when that cannot be told cheaply."""
    try:
        guarded = sqlitefile.Database(source)
    except (ValidationFailed, OSError):
        return None
    try:
        if not guarded.table(SOURCE):
            return None
        found = guarded.db.execute(f"SELECT count(*) FROM {SOURCE}").fetchone()  # noqa: S608
        return int(found[0])
    except (sqlite3.Error, ValidationFailed):
        return None
    finally:
        guarded.close()


def _rows(guarded: sqlitefile.Database, model: str) -> Stream:
    db, label = guarded.db, guarded.label
    present = (
        {row[1] for row in db.execute(f"PRAGMA table_info({SOURCE})")}
        if guarded.table(SOURCE)
        else set()
    )
    if not {"content", "content_hash"} <= present:
        raise ValidationFailed(
            f"{label}: not an mcp-memory-service database (no memories table with content)."
        )
    columns = [c for c in COLUMNS if c in present]
    vectors = _Vectors.open(guarded)
    select = ", ".join(f"m.{c}" for c in columns)
    if vectors is not None:
        # Column and table names are ours (COLUMNS, TABLE), never the file's.
        join = f" LEFT JOIN {TABLE}_rowids r ON r.rowid = m.id"
        query = f"SELECT m.id, {select}, r.chunk_id, r.chunk_offset FROM {SOURCE} m{join}"  # noqa: S608
    else:
        query = f"SELECT m.id, {select}, NULL, NULL FROM {SOURCE} m"  # noqa: S608
    query += " ORDER BY m.id"
    most = guarded.most_rows()
    for n, row in enumerate(db.execute(query), start=1):
        if n > most:
            raise ValidationFailed(
                f"{label}: more rows than a file of {guarded.size:,} bytes can hold; it is damaged."
            )
        yield _memory(row, columns, vectors, model)


def _memory(
    row: tuple[Any, ...], columns: list[str], vectors: _Vectors | None, model: str
) -> Record | Refused:
    rowid, *values, chunk_id, offset = row
    fields = dict(zip(columns, values, strict=True))
    where = f"memory {rowid}"
    if fields.get("deleted_at") is not None:
        return Refused(where, "deleted in mcp-memory-service")
    record = Record(
        content=fields.get("content"),
        where=where,
        source_id=fields.get("content_hash"),
        created_at=_first(fields.get("created_at"), fields.get("created_at_iso")),
        updated_at=_first(fields.get("updated_at"), fields.get("updated_at_iso")),
    )
    raw = fields.get("metadata")
    if raw:
        try:
            record.metadata = json.loads(raw)
        except (ValueError, RecursionError):
            record.extra["metadata_text"] = str(raw)[:2000]
    if fields.get("tags"):
        # A column holds text or a number, never a list: as text, it is the comma-separated form.
        record.extra["tags"] = tags(str(fields["tags"]))
    if fields.get("memory_type"):
        record.extra["memory_type"] = fields["memory_type"]
    if vectors is not None and chunk_id is not None:
        record.vector = vectors.get(rowid, chunk_id, offset)
        record.vector_model = model if record.vector is not None else None
    return record


def _first(*values: Any) -> Any:
    for value in values:
        if value is not None and value != "":
            return value
    return None


class _Vectors:
    """Reads vectors out of a vec0 table's shadow tables, a chunk at a time."""

    KEEP = 4  # chunks kept in memory: rows come in id order, chunks mostly in turn

    def __init__(self, db: sqlite3.Connection, dimensions: int) -> None:
        self.db = db
        self.dimensions = dimensions
        self.chunks: OrderedDict[int, tuple[bytes, bytes, bytes] | None] = OrderedDict()

    @classmethod
    def open(cls, guarded: sqlitefile.Database) -> _Vectors | None:
        db = guarded.db
        found = db.execute("SELECT sql FROM sqlite_master WHERE name = ?", (TABLE,)).fetchone()
        if not found or not found[0]:
            return None
        width = re.search(r"float\s*\[\s*(\d+)\s*\]", found[0], re.I)
        names = {
            row[0]
            for row in db.execute(
                "SELECT name FROM sqlite_master WHERE name LIKE ?", (f"{TABLE}_%",)
            )
        }
        needed = {f"{TABLE}_rowids", f"{TABLE}_chunks", f"{TABLE}_vector_chunks00"}
        if width is None or not needed <= names:
            return None
        # Read from, so held to what the memories table is.
        for name in sorted(needed):
            guarded.table(name)
        return cls(db, int(width.group(1)))

    def get(self, rowid: int, chunk_id: int, offset: int) -> np.ndarray | None:
        # SQLite keeps whatever type a row was given: a slot that is not a number
        # names no vector (sqlite-vec writes integers and blobs only).
        if not all(type(n) is int for n in (rowid, chunk_id, offset)) or offset < 0:
            return None
        chunk = self._chunk(chunk_id)
        if chunk is None:
            return None
        validity, rowids, vectors = chunk
        if offset // 8 >= len(validity) or not validity[offset // 8] >> (offset % 8) & 1:
            return None
        if (offset + 1) * 8 > len(rowids) or struct.unpack_from("<q", rowids, offset * 8)[
            0
        ] != rowid:
            return None
        size = self.dimensions * 4
        return vector_from_blob(vectors[offset * size : (offset + 1) * size], self.dimensions)

    def _chunk(self, chunk_id: int) -> tuple[bytes, bytes, bytes] | None:
        if chunk_id in self.chunks:
            self.chunks.move_to_end(chunk_id)
            return self.chunks[chunk_id]
        meta = self.db.execute(
            f"SELECT validity, rowids FROM {TABLE}_chunks WHERE chunk_id = ?",  # noqa: S608
            (chunk_id,),
        ).fetchone()
        data = self.db.execute(
            f"SELECT vectors FROM {TABLE}_vector_chunks00 WHERE rowid = ?",  # noqa: S608
            (chunk_id,),
        ).fetchone()
        blobs = (*meta, *data) if meta and data else ()
        chunk = (
            (bytes(blobs[0]), bytes(blobs[1]), bytes(blobs[2]))
            if len(blobs) == 3 and all(isinstance(b, bytes) for b in blobs)
            else None
        )
        self.chunks[chunk_id] = chunk
        while len(self.chunks) > self.KEEP:
            self.chunks.popitem(last=False)
        return chunk
