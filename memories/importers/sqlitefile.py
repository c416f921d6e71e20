"""Opening an SQLite file a user gave us so that reading it always ends, and soon.

A 4 KB file can be a bomb: a ``memories`` view over a recursive query has
no end, and ``ORDER BY`` over it had SQLite sort it in temporary files that
grew 23 MB a second, while the job's thread sat in SQLite's C code where
neither the job's time limit nor SIGTERM could reach it. So a file is:

* opened read-only and, when no write-ahead log sits beside it (an upload
  never has one), immutable: SQLite takes no lock and reads that file alone;
* read with ``trusted_schema`` off, so that what its schema defines calls no
  function that is not harmless;
* given its temporary storage in memory, under a cap on SQLite's heap, so
  that nothing spills to disk and a sort without end runs out of room;
* watched by a progress handler that stops a statement once the reading has
  spent a number of SQLite's steps proportional to the file's size (a real
  database of mcp-memory-service takes well under one step per byte), or
  when the caller's deadline has passed;

and only ordinary tables are read from it (``table``): a view, a virtual
table, anything else under the name, or a table with generated columns is
refused.
"""

from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path

from core.errors import ValidationFailed
from memories.importers.sources import Source

# Steps of SQLite's virtual machine a read may take: per byte of the file,
# and at least. 5,000 memories with vectors took 0.012 a byte, 23 a row.
STEPS_PER_BYTE = 100
STEPS_FLOOR = 20_000_000
# How often (in steps) the handler runs: often enough to stop within
# milliseconds, rarely enough to cost nothing measurable.
EVERY = 10_000
# SQLite's heap, for the whole process (SQLite has no per-connection cap):
# rows are streamed, so a reader needs a few pages of cache, not this.
HEAP_LIMIT = 256 * 1024 * 1024
# The fewest bytes a table's row takes in the file (a cell's pointer, its
# size, its rowid and a header): more rows than this allows is not a table.
ROW_MIN_BYTES = 4


class Database:
    """A read-only connection to ``source`` whose every statement its guard may stop."""

    def __init__(self, source: Source, until: float | None = None) -> None:
        self.label = source.label
        # With a write-ahead log beside it (read too, see _uri), the rows may all be
        # in the log until SQLite checkpoints: the file alone can be one page.
        log = _log(source.path)
        self.size = os.path.getsize(source.path) + (log.stat().st_size if log.exists() else 0)
        self.until = until
        self.steps = max(STEPS_FLOOR, STEPS_PER_BYTE * self.size) // EVERY
        self.stopped: str | None = None
        # Raised while the handler ran (a signal's KeyboardInterrupt, say):
        # SQLite would only report the statement "interrupted".
        self.raised: BaseException | None = None
        self.db = sqlite3.connect(_uri(source.path), uri=True)
        try:
            for pragma in (
                "PRAGMA trusted_schema = OFF",
                "PRAGMA query_only = ON",
                "PRAGMA temp_store = MEMORY",
                "PRAGMA mmap_size = 0",
                f"PRAGMA hard_heap_limit = {HEAP_LIMIT}",
            ):
                self.db.execute(pragma)
            # No value read from a real table is larger than the file it is in.
            self.db.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, max(self.size, 1024 * 1024))
            self.db.set_progress_handler(self._check, EVERY)
            # Also what tells a file that is not a database.
            self.db.execute("SELECT count(*) FROM sqlite_master").fetchone()
        except sqlite3.Error as error:
            self.db.close()
            if self.stopped is not None or self.raised is not None:
                raise self.failed(error) from None
            raise ValidationFailed(f"{self.label}: not an SQLite database.") from None

    def _check(self) -> int:
        try:
            self.steps -= 1
            if self.steps < 0:
                self.stopped = (
                    f"{self.label}: reading it takes far more work than a database of its size"
                    " can need; it is damaged or built to never end."
                )
            elif self.until is not None and time.monotonic() > self.until:
                self.stopped = f"{self.label}: reading it ran past the import's time limit."
        except BaseException as error:  # re-raised by ``failed`` once SQLite has stopped
            self.raised = error
            return 1
        return 1 if self.stopped else 0

    def failed(self, error: sqlite3.Error) -> BaseException:
        """Return what to raise for ``error``: why the guard stopped it, or the error named."""
        if self.raised is not None:
            return self.raised
        if self.stopped is not None:
            return ValidationFailed(self.stopped)
        if isinstance(error, sqlite3.DataError | sqlite3.OperationalError) and "memory" in str(
            error
        ):
            return ValidationFailed(
                f"{self.label}: reading it takes more memory than an import may use."
            )
        return ValidationFailed(f"{self.label}: the database cannot be read ({error}).")

    def table(self, name: str) -> bool:
        """Return whether ``name`` is in the file; refuse it unless it is an ordinary table."""
        found = self.db.execute(
            "SELECT type, sql FROM sqlite_master WHERE name = ? COLLATE NOCASE", (name,)
        ).fetchall()
        if not found:
            return False
        kind, sql = found[0]
        if (
            len(found) > 1
            or kind != "table"
            or not str(sql or "").lstrip().upper().startswith("CREATE TABLE")
        ):
            what = "a virtual table" if kind == "table" else f"a {kind}"
            raise ValidationFailed(
                f"{self.label}: {name} is {what}, not a table; only tables are read."
            )
        # A generated column is computed as it is read: what it computes is
        # the file's to choose. Column 6 is "hidden": 2 or 3 for a generated one.
        columns = self.db.execute(f"PRAGMA table_xinfo({name})").fetchall()
        if any(column[6] for column in columns):
            raise ValidationFailed(
                f"{self.label}: {name} has generated columns; only stored values are read."
            )
        return True

    def most_rows(self) -> int:
        """Return the most rows a table of this file can hold."""
        return self.size // ROW_MIN_BYTES + 1

    def close(self) -> None:
        self.db.close()


def _uri(path: Path) -> str:
    # A database in WAL mode keeps its latest writes in the log beside it:
    # an operator's own file may, and then the log is read too.
    immutable = "" if _log(path).exists() else "&immutable=1"
    return f"{path.resolve().as_uri()}?mode=ro{immutable}"


def _log(path: Path) -> Path:
    """The write-ahead log SQLite keeps beside ``path`` in WAL mode."""
    where = path.resolve()
    return where.with_name(where.name + "-wal")
