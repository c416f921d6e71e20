"""How an import spends less time: one connection per writer for the whole import,
and a scratch table that lives with it (BENCHMARKS.md, "Imports").

Each test checks a path that makes imports faster and that would quietly go
wrong, or back to the slow way, if it broke.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection, connections

from core import context, tenancy
from memories import embeddings, services, validation
from memories.importers import Source, run
from memories.importers.run import Options, run_import
from memories.models import Memory
from memories.tests.importing import FIXTURES

pytestmark = pytest.mark.django_db(transaction=True)


def backend() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return int(cursor.fetchone()[0])


def item(content: str) -> services.ImportItem:
    return services.ImportItem(
        namespace="default",
        agent_id=None,
        thread_id=None,
        kind="note",
        author="",
        path="",
        content=content,
        content_hash=validation.content_hash(content),
        metadata={"imported_from": {"format": "jsonl", "file": "test.jsonl"}},
        priority="medium",
        created_at=None,
        updated_at=None,
    )


def scratch_rows() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM recall_import_rows")
        return int(cursor.fetchone()[0])


# writers ------------------------------------------------------------------------


def test_a_writer_keeps_one_connection_for_the_whole_import_and_closes_it(cast, monkeypatch):
    monkeypatch.setattr(run, "BATCH", 1)  # a batch per record
    seen: list[tuple[int, Any]] = []
    store = services.store_imports

    def storing(**kwargs: Any) -> int:
        stored = store(**kwargs)
        seen.append((backend(), connections["default"]))
        return stored

    monkeypatch.setattr(services, "store_imports", storing)
    with context.acting_as("import"):
        report = run_import(
            user_id=cast.alice.id,
            source=Source.at(FIXTURES / "mem0.json"),
            options=Options(format="mem0"),
        )

    assert report.imported == 3
    assert len(seen) >= 3
    # One PostgreSQL backend for every batch, not a new one per batch ...
    assert len({pid for pid, _ in seen}) == 1
    # ... and it is closed once the import ends.
    assert seen[0][1].connection is None
    with tenancy.tenant(cast.alice.id):
        assert Memory.objects.filter(user_id=cast.alice.id).count() == 3


def test_a_job_after_a_failed_one_runs_on_a_new_connection(cast):
    writers = run._Writers(1)
    pids: list[int] = []

    def fails() -> None:
        pids.append(backend())
        raise RuntimeError("the batch failed")

    def works() -> None:
        pids.append(backend())

    failed = writers.submit(fails)
    worked = writers.submit(works)
    writers.close()

    with pytest.raises(RuntimeError, match="the batch failed"):
        failed.result()
    assert worked.result() is None
    assert len(pids) == 2 and pids[0] != pids[1]
    assert all(not thread.is_alive() for thread in writers.threads)


# the scratch table ----------------------------------------------------------------


def test_the_scratch_table_keeps_no_rows_between_batches(cast):
    texts = ["Alice keeps her bike in the hall", "Alice waters the ferns on Sundays"]
    items = [item(text) for text in texts]
    vectors = list(embeddings.get_embedder().embed(texts))

    with context.acting_as("import"):
        first = services.store_imports(
            user_id=cast.alice.id, items=items[:1], vectors=vectors[:1], model_id="all-MiniLM-L6-v2"
        )
        with tenancy.tenant(cast.alice.id):
            assert scratch_rows() == 0  # emptied at the first batch's commit
        with pytest.raises(RuntimeError):
            services.store_imports(
                user_id=cast.alice.id,
                items=items[1:],
                vectors=vectors[1:],
                model_id="all-MiniLM-L6-v2",
                finish=failing,
            )
        with tenancy.tenant(cast.alice.id):
            assert scratch_rows() == 0  # and by the failed one's rollback
        again = services.store_imports(
            user_id=cast.alice.id, items=items, vectors=vectors, model_id="all-MiniLM-L6-v2"
        )

    # The same connection, table and all: the second batch stores only its own.
    assert (first, again) == (1, 1)
    with tenancy.tenant(cast.alice.id):
        stored = sorted(
            Memory.objects.filter(user_id=cast.alice.id).values_list("content", flat=True)
        )
    assert stored == sorted(texts)


def failing(inserted: int, cut: int, withdrawn: int) -> None:
    raise RuntimeError("the checkpoint could not be saved")
