"""Imports from other memory servers (``memories/importers``): dedup, batches, upload jobs.

The readers and the runner live in ``memories/importers``; what they need of
the tables is here. A batch is stored in one transaction under the user's
row-level security, so an interrupted import never leaves half a batch. An
upload on the dashboard becomes a job of kind ``import`` in ``memory_jobs``,
its file kept in ``memory_import_chunks`` until the job ends;
``memories/importers/job.py`` runs it when a worker takes it. As for a
background add, each run of a job names itself by the ``attempts`` it took the
job with, and saves, settles or requeues the job only while it is still its
own (``queue.JobLost`` otherwise).
"""

from __future__ import annotations

import json
import uuid
import weakref
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, TypedDict, cast

import numpy as np
from django.conf import settings
from django.db import connection
from django.db.models.functions import Now

from accounts import tiers
from core import context, tenancy
from core.errors import Conflict, RecallError
from memories.models import ImportChunk, Job, JobStatus, Memory
from memories.services import quota
from memories.services.queue import CHANNEL, JobLost, retry_in, wake
from memories.services.shapes import Metadata
from memories.services.storing import fingerprint

# memories_dedup's columns: agent, namespace, thread, path, content hash.
Place = tuple[uuid.UUID | None, str, str | None, str, str]


@dataclass(frozen=True)
class ImportItem:
    """One memory an import stores: validated, with its agent resolved, and its place."""

    namespace: str
    agent_id: uuid.UUID | None
    thread_id: str | None
    kind: str
    author: str
    path: str
    content: str
    content_hash: str
    metadata: Metadata
    priority: str
    created_at: datetime | None
    updated_at: datetime | None

    @property
    def place(self) -> Place:
        # memories_dedup's columns; an import sets no position and no task.
        return (self.agent_id, self.namespace, self.thread_id, self.path, self.content_hash)


def new_imports(*, user_id: uuid.UUID | str, items: list[ImportItem]) -> list[int]:
    """Return the positions of ``items`` whose place no live memory (nor an earlier item) holds."""
    with tenancy.tenant(user_id):
        rows = (
            Memory.objects.live()
            .filter(
                user_id=user_id,
                content_hash__in={item.content_hash for item in items},
                position__isnull=True,
                task_id__isnull=True,
            )
            .values_list("agent_id", "namespace", "thread_id", "path", "content_hash")
        )
        held: set[Place] = set(rows)
    fresh = []
    for n, item in enumerate(items):
        if item.place not in held:
            held.add(item.place)
            fresh.append(n)
    return fresh


def store_imports(
    *,
    user_id: uuid.UUID | str,
    items: list[ImportItem],
    vectors: list[np.ndarray],
    model_id: str,
    tier: str | None = None,
    finish: Callable[[int, int, int], None] | None = None,
    cleared: Callable[[], Collection[Cleared]] | None = None,
) -> int:
    """Store a batch of imported memories in one transaction; return how many were new.

    A memory whose place is taken meanwhile is skipped (memories_dedup), and
    an expired memory holding a place gives it up, as in ``store``. The
    history trigger records each as created by the acting client, with its
    metadata (``imported_from`` included). ``tier`` applies the free tier's
    quota: the batch's first memories up to it are stored, and then
    ``QuotaExceeded`` stops the import (a batch over the quota used to store
    none of them). ``vectors`` may be fewer than ``items``: the runner found
    no room for the rest before embedding them, and they are left out as
    past the quota too. ``finish`` runs inside the transaction with the count
    stored and the count left out for the quota, so that a job's progress
    is saved atomically with what it stored and the count it withdrew:
    ``cleared`` runs first in the transaction and names where a namespace
    was emptied since the import was queued (``cleared_namespaces``), and
    the memories that go there are left out.
    """
    withdrawn = 0
    with tenancy.tenant(user_id):
        if cleared is not None and items:
            emptied = cleared()
            kept = [n for n, item in enumerate(items) if not is_withdrawn(item, emptied)]
            withdrawn = len(items) - len(kept)
            if withdrawn:
                # Those with vectors are still the first of those kept.
                vectors = [vectors[n] for n in kept if n < len(vectors)]
                items = [items[n] for n in kept]
        left = quota.room(user_id, tier) if tier is not None and items else None
        fits = len(vectors) if left is None else min(left, len(vectors))
        cut = len(items) - fits
        if cut:
            items, vectors = items[:fits], vectors[:fits]
        inserted = _insert_imports(user_id, items, vectors, model_id) if items else 0
        if finish is not None:
            finish(inserted, cut, withdrawn)
    if cut:
        raise quota.full(tiers.memory_limit(tier or "") or 0)
    return inserted


def _insert_imports(
    user_id: uuid.UUID | str, items: list[ImportItem], vectors: list[np.ndarray], model_id: str
) -> int:
    """Insert the batch in the caller's tenant transaction; return how many were new."""
    Memory.objects.filter(
        user_id=user_id,
        content_hash__in={item.content_hash for item in items},
        expires_at__lte=Now(),
    ).delete()
    with connection.cursor() as cursor:
        # COPY (binary, vectors too) into a scratch table, then one INSERT:
        # several times faster than a VALUES list of vector literals
        # (BENCHMARKS.md, "Imports"). The table lives as long as the
        # connection (an import's writer keeps one) and is emptied at
        # every commit, so no batch sees another's rows and no batch pays
        # for creating and dropping it in the catalog.
        cursor.execute(
            "CREATE TEMP TABLE IF NOT EXISTS recall_import_rows (id uuid, agent_id uuid,"
            " namespace text, source_kind text, author text, path text, thread_id text,"
            " content text, content_hash text, embedding vector, metadata jsonb,"
            " priority text, created_at timestamptz, updated_at timestamptz)"
            " ON COMMIT DELETE ROWS"
        )
        _copy_imports(cursor.cursor, items, vectors)
        cursor.execute(
            "INSERT INTO memories (id, user_id, agent_id, namespace, source_kind, author, path,"
            " thread_id, content, content_hash, embedding, embedding_model, metadata, priority,"
            " created_at, updated_at) SELECT id, %s, agent_id, namespace, source_kind, author,"
            " path, thread_id, content, content_hash, embedding, %s, metadata, priority,"
            " coalesce(created_at, statement_timestamp()),"
            " coalesce(updated_at, created_at, statement_timestamp()) FROM recall_import_rows"
            " ON CONFLICT ON CONSTRAINT memories_dedup DO NOTHING RETURNING id",
            [str(user_id), model_id],
        )
        return len(cursor.fetchall())


# pgvector's type, per psycopg connection (its oid differs between databases).
_vector_types: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()


def _copy_imports(raw: Any, items: list[ImportItem], vectors: list[np.ndarray]) -> None:
    from pgvector.psycopg.vector import register_vector_info
    from psycopg.types import TypeInfo
    from psycopg.types.json import Jsonb

    # On this cursor only: elsewhere vectors travel as text literals. The
    # type's description is looked up once per connection.
    info = _vector_types.get(raw.connection)
    if info is None:
        info = _vector_types[raw.connection] = TypeInfo.fetch(raw.connection, "vector")
    register_vector_info(raw, info)
    types = ["uuid", "uuid", "text", "text", "text", "text", "text", "text", "text", "vector"]
    types += ["jsonb", "text", "timestamptz", "timestamptz"]
    with raw.copy("COPY recall_import_rows FROM STDIN (FORMAT BINARY)") as copy:
        copy.set_types(types)
        for item, vector in zip(items, vectors, strict=True):
            copy.write_row(
                (
                    uuid.uuid4(),
                    item.agent_id,
                    item.namespace,
                    item.kind,
                    item.author,
                    item.path,
                    item.thread_id,
                    item.content,
                    item.content_hash,
                    np.asarray(vector, dtype=np.float32),
                    Jsonb(item.metadata),
                    item.priority,
                    item.created_at,
                    item.updated_at or item.created_at,
                )
            )


class ImportJob(TypedDict):
    """An import job as the dashboard lists it: its state, the file's name and its report."""

    id: uuid.UUID
    status: str
    payload: Metadata | None
    result: Metadata | None
    error_message: str
    created_at: datetime
    finished_at: datetime | None


IMPORT_CHUNK_BYTES = 1024 * 1024


def enqueue_import(
    *,
    user_id: uuid.UUID | str,
    tier: str,
    filename: str,
    options: Mapping[str, object],
    chunks: Iterable[bytes],
) -> uuid.UUID:
    """Queue an import of an uploaded file for a worker, keeping the file with the job.

    The file is stored in pieces of ``IMPORT_CHUNK_BYTES`` in the same
    transaction as the job, so a job never waits for a file that is not there.
    """
    job_id = uuid.uuid4()
    who = context.actor.get()
    payload = {"filename": filename, "options": dict(options), "tier": tier}
    with tenancy.tenant(user_id):
        _room_for_an_upload(user_id)
        Job.objects.create(
            id=job_id,
            user_id=user_id,
            kind="import",
            status=JobStatus.QUEUED,
            request_hash=fingerprint(payload),
            payload=payload,
            items=0,  # the quota is checked batch by batch as it runs
            client=who.client if who else "",
            api_key_id=who.api_key_id if who else None,
        )
        seq = 0
        buffer = b""
        for chunk in chunks:
            buffer += chunk
            while len(buffer) >= IMPORT_CHUNK_BYTES:
                ImportChunk.objects.create(
                    job_id=job_id, user_id=user_id, seq=seq, data=buffer[:IMPORT_CHUNK_BYTES]
                )
                buffer = buffer[IMPORT_CHUNK_BYTES:]
                seq += 1
        if buffer or seq == 0:
            ImportChunk.objects.create(job_id=job_id, user_id=user_id, seq=seq, data=buffer)
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_notify(%s, '')", [CHANNEL])
    wake()
    return job_id


def _room_for_an_upload(user_id: uuid.UUID | str) -> None:
    """Refuse an upload while the user has ``IMPORT_UPLOADS_PENDING`` imports waiting or
    running: each keeps its file in the database until a worker gets to it, and
    nothing bounded how many one user could queue (review140). Two uploads at
    once are counted one after the other."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_advisory_xact_lock(hashtextextended(%s, 4))", [f"imports:{user_id}"]
        )
    pending = Job.objects.filter(
        user_id=user_id, kind="import", status__in=(JobStatus.QUEUED, JobStatus.RUNNING)
    ).count()
    if pending >= settings.IMPORT_UPLOADS_PENDING:
        raise Conflict(
            f"You have {pending} imports waiting or running; upload this file once one of"
            " them has finished."
        )


def import_file(*, user_id: uuid.UUID | str, job_id: uuid.UUID) -> Iterator[bytes]:
    """Yield an import job's uploaded file piece by piece, each read in its own transaction."""
    seq = 0
    while True:
        with tenancy.tenant(user_id):
            piece = (
                ImportChunk.objects.filter(job_id=job_id, seq=seq)
                .values_list("data", flat=True)
                .first()
            )
        if piece is None:
            return
        yield bytes(piece)
        seq += 1


# A place an import must store nothing more in: (namespace, agent id), the
# agent None when every writer's memories there were deleted.
Cleared = tuple[str, str | None]


def cleared_namespaces(
    *, user_id: uuid.UUID | str, job_id: uuid.UUID, attempts: int
) -> frozenset[Cleared]:
    """Where ``delete_all_memories`` emptied a namespace since this import was queued.

    In the caller's tenant transaction, locking the job's row, which the
    delete marks (``clear_imports``) before it deletes: a batch that reads
    this waits for a mark being made and then leaves that namespace out, and
    a mark that comes later waits for the batch, whose memories the delete
    then takes. Raise ``JobLost`` when the run is no longer the job's.
    """
    row = (
        Job.objects.held(job_id, attempts)
        .filter(user_id=user_id)
        .select_for_update()
        .values_list("payload")
        .first()
    )
    if row is None:
        raise JobLost
    payload = row[0] or {}
    return frozenset(
        (entry, None) if isinstance(entry, str) else (entry["namespace"], entry.get("agent"))
        for entry in payload.get("cleared") or ()
    )


def is_withdrawn(item: ImportItem, cleared: Collection[Cleared]) -> bool:
    """Whether ``item`` goes where a delete emptied since its import was queued."""
    return (item.namespace, None) in cleared or (
        item.agent_id is not None and (item.namespace, str(item.agent_id)) in cleared
    )


def clear_imports(
    *,
    user_id: uuid.UUID | str,
    agent_id: uuid.UUID | str | None,
    namespace: str,
    undo: bool = False,
) -> None:
    """Tell the user's queued and running imports that ``namespace`` is being emptied.

    Of every writer's memories, or with ``agent_id`` of that agent's only, as
    the delete that calls this (in a user-wide tenant transaction of its own,
    just before: an agent's path does not see the user's import jobs). A
    batch storing meanwhile is waited for, and the delete takes what it
    stored; every batch after leaves the namespace out (``cleared_namespaces``).
    With ``undo``, take the mark away again: the delete failed.
    """
    agent = None if agent_id is None else str(uuid.UUID(str(agent_id)))
    entry = json.dumps({"namespace": namespace, "agent": agent})
    with connection.cursor() as cursor:
        if undo:
            cursor.execute(
                "UPDATE memory_jobs SET payload = jsonb_set(payload, '{cleared}',"
                " (payload->'cleared') - (SELECT (i - 1)::int FROM"
                " jsonb_array_elements(payload->'cleared') WITH ORDINALITY AS e(v, i)"
                " WHERE v = %s::jsonb LIMIT 1))"
                " WHERE user_id = %s AND kind = 'import'"
                " AND payload->'cleared' @> jsonb_build_array(%s::jsonb)",
                [entry, str(user_id), entry],
            )
            return
        cursor.execute(
            "UPDATE memory_jobs SET payload = jsonb_set(payload, '{cleared}',"
            " coalesce(payload->'cleared', '[]'::jsonb) || jsonb_build_array(%s::jsonb))"
            " WHERE user_id = %s AND kind = 'import' AND status = ANY(%s)"
            " AND payload IS NOT NULL"
            " AND NOT coalesce(payload->'cleared', '[]'::jsonb) @> jsonb_build_array(%s::jsonb)",
            [entry, str(user_id), [JobStatus.QUEUED, JobStatus.RUNNING], entry],
        )


def save_import_progress(*, job_id: uuid.UUID, attempts: int, report: Mapping[str, object]) -> None:
    """Save a running import's report and extend its lease, in the caller's tenant transaction.

    Raise ``JobLost`` when the run is no longer the job's, so that the batch
    it was to count rolls back.
    """
    saved = Job.objects.held(job_id, attempts).update(
        result=dict(report),
        lease_until=Now() + timedelta(seconds=settings.JOB_LEASE_SECONDS),
        # Progress: the runs lost before it count no more (queue.LOST_RUNS).
        lost_runs=0,
    )
    if not saved:
        raise JobLost


def finish_import(
    *,
    user_id: uuid.UUID | str,
    job_id: uuid.UUID,
    attempts: int,
    report: Mapping[str, object] | None,
    error: RecallError | None = None,
) -> None:
    """Settle an import job, done or failed, keeping its report and deleting its file.

    Raise ``JobLost``, changing nothing, when the run is no longer the job's.
    """
    with tenancy.tenant(user_id):
        # The payload stays: a file's name and the options, no memory content.
        fields: dict[str, Any] = {
            "status": JobStatus.FAILED if error else JobStatus.DONE,
            "finished_at": Now(),
            "lease_until": None,
        }
        if report is not None:
            fields["result"] = dict(report)
        if error is not None:
            fields["error_code"] = error.code
            fields["error_message"] = error.message[:500]
        if not Job.objects.held(job_id, attempts).update(**fields):
            raise JobLost
        ImportChunk.objects.filter(job_id=job_id).delete()


def import_jobs(*, user_id: uuid.UUID | str, limit: int = 5) -> list[ImportJob]:
    """Return the user's import jobs still queued or running, and the latest ``limit`` that
    ended, newest first, with their reports. An import on its way never drops off the
    list behind newer uploads."""
    fields = ("id", "status", "payload", "result", "error_message", "created_at", "finished_at")
    with tenancy.tenant(user_id):
        mine = Job.objects.filter(user_id=user_id, kind="import").order_by("-created_at")
        going = list(mine.filter(status__in=PENDING_STATUSES).values(*fields))
        ended = list(mine.exclude(status__in=PENDING_STATUSES).values(*fields)[:limit])
    # The rows hold ImportJob's fields, and only those (``fields``).
    return cast(
        list[ImportJob], sorted(going + ended, key=lambda row: row["created_at"], reverse=True)
    )


PENDING_STATUSES = ("queued", "running")


def requeue_job(
    *, job_id: uuid.UUID, user_id: uuid.UUID | str, attempts: int, error: RecallError
) -> bool:
    """Queue a job again after a passing failure, with back-off; False when out of attempts.

    Raise ``JobLost``, changing nothing, when the run is no longer the job's.
    """
    delay = retry_in(job_id)
    if delay is None:
        return False
    with tenancy.operator():
        queued = Job.objects.retry_later(job_id, delay, attempts=attempts)
    if not queued:
        raise JobLost
    return True
