"""Maintenance across users (operator path): the periodic clean-up and re-embedding."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection
from django.utils import timezone

from core import context, pooling, tenancy
from memories import embeddings, indexes
from memories.models import (
    Memory,
)
from memories.services import naming, superseding
from memories.services.changes import EXPIRED_KEPT

logger = logging.getLogger("memories.services")


@dataclass(frozen=True)
class CleanUp:
    expired_memories: int = 0
    history_rows: int = 0
    finished_jobs: int = 0
    confirmations: int = 0

    def as_dict(self) -> dict[str, int]:
        return {
            "expired_memories": self.expired_memories,
            "history_rows": self.history_rows,
            "finished_jobs": self.finished_jobs,
            "confirmations": self.confirmations,
        }


_MAINTENANCE_LOCK = 0x7265_6361_6D61


CLEAN_UP_BATCH = 1000

# The expiry purge, a batch at a time, each its own transaction. Every row it
# will change is locked with SKIP LOCKED before anything is written: a memory
# a live write holds is left for the next run, with whatever depends on it.
# So the purge never waits on a memory, and never sits in a lock order of its
# own; taking the replaced rows in the cascade, after the expired one, waited
# on a live write that holds the pair in id order (a restatement) and could
# deadlock with it. The rows are:
# * the expired memories (``doomed``);
# * the memories each replaced, whose link the delete would clear (the key's
#   ON DELETE SET NULL): ``held``;
# * the next step that stays in each held memory's chain, which it passes on
#   to when expired ones stood between them (A -> B -> C, B expired: A is C's
#   older value, not a current fact again), as a delete by a tool does
#   (``superseding.delete_freeing``).
# Each statement that writes memories also writes their namespace's search
# generation (a statement trigger, migration 0017), in (user, namespace)
# order within the statement. The batch's statements go namespace by
# namespace in that order too: passing a chain on in one namespace, then
# deleting in an earlier one, took two generations the other way round from a
# live writer of both, and deadlocked with it.
# In (user, namespace) order by the database's own collation, the order the
# generation trigger takes them in: Python's would differ from en_US's.
_LOCK_EXPIRED = (
    "SELECT id, user_id, namespace FROM memories WHERE expires_at <= %s"
    " ORDER BY user_id, namespace LIMIT %s FOR UPDATE SKIP LOCKED"
)
# Through memories_replaced_by_idx (superseded_by), migration 0029.
_LOCK_HELD = (
    "SELECT id FROM memories WHERE superseded_by = ANY(%s) AND NOT id = ANY(%s)"
    " FOR NO KEY UPDATE SKIP LOCKED"
)
# Each held memory's walk through the expired steps after it, and the step it
# reaches that stays (``stays``): the memory it passes on to.
_CHAINS = (
    "WITH RECURSIVE walk AS ("
    " SELECT a.id AS start, a.superseded_by AS at FROM memories a WHERE a.id = ANY(%s)"
    # UNION, not UNION ALL: were links ever to loop, the walk would still end.
    " UNION SELECT walk.start, m.superseded_by FROM walk JOIN memories m ON m.id = walk.at"
    " WHERE m.id = ANY(%s) AND m.superseded_by IS NOT NULL)"
    " SELECT walk.start, walk.at, e.user_id, e.namespace, NOT e.id = ANY(%s)"
    " FROM walk JOIN memories e ON e.id = walk.at"
)
_LOCK_STEPS = "SELECT id FROM memories WHERE id = ANY(%s) FOR NO KEY UPDATE SKIP LOCKED"
# An expired memory some memory not locked here still names stays for the next run.
_DELETE_EXPIRED = (
    "DELETE FROM memories gone WHERE gone.id = ANY(%s) AND NOT EXISTS ("
    " SELECT 1 FROM memories m WHERE m.user_id = gone.user_id AND m.superseded_by = gone.id"
    " AND NOT m.id = ANY(%s))"
)


def _purge_expired(moment: datetime) -> int:
    """Delete the expired memories, a batch per transaction, and say how many went.

    What an expired memory replaced is current again (``FREED_BY_EXPIRY``), unless
    a later memory that stays replaced the expired one: then it passes on to it.
    """
    total = 0
    while True:
        with tenancy.operator(), connection.cursor() as cursor:
            cursor.execute(_LOCK_EXPIRED, [moment, CLEAN_UP_BATCH])
            doomed = {row[0]: (row[1], row[2]) for row in cursor.fetchall()}
            done = _purge_batch(cursor, doomed) if doomed else 0
        total += done
        if len(doomed) < CLEAN_UP_BATCH or not done:
            return total


def _purge_batch(cursor: Any, doomed: dict[Any, tuple[Any, str]]) -> int:
    """Delete what of ``doomed`` (locked; each id's user and namespace) can go now,
    passing chains on; how many went."""
    ids = list(doomed)
    cursor.execute(_LOCK_HELD, [ids, ids])
    held = [row[0] for row in cursor.fetchall()]
    steps: dict[Any, list[Any]] = {}
    stays: dict[Any, tuple[Any, Any, str]] = {}
    if held:
        cursor.execute(_CHAINS, [held, ids, ids])
        for start, at, user, namespace, stays_here in cursor.fetchall():
            steps.setdefault(start, []).append(at)
            if stays_here:
                stays[start] = (at, user, namespace)
    locked: set[Any] = set()
    if stays:
        cursor.execute(_LOCK_STEPS, [sorted({step for step, _, _ in stays.values()})])
        locked = {row[0] for row in cursor.fetchall()}
    # A chain whose next step a live write holds keeps its expired steps for the
    # next run: deleted now, they would free the memory that was to pass on.
    waiting = {
        at for start, (step, _, _) in stays.items() if step not in locked for at in steps[start]
    }
    going = [memory for memory in ids if memory not in waiting]
    passing = {start: place for start, place in stays.items() if place[0] in locked}
    allowed = [*held, *going]
    gone = 0
    # ``doomed`` keeps the statement's order; a chain's namespace is its doomed's.
    needed = {doomed[m] for m in going} | {(u, n) for _, u, n in passing.values()}
    for group in [g for g in dict.fromkeys(doomed.values()) if g in needed]:
        superseding.pass_on(
            cursor,
            [(start, step, u) for start, (step, u, n) in passing.items() if (u, n) == group],
            naming.FREED_BY_EXPIRY,
        )
        here = [memory for memory in going if doomed[memory] == group]
        if here:
            superseding.freeing(cursor, naming.FREED_BY_EXPIRY)
            cursor.execute(_DELETE_EXPIRED, [here, allowed])
            gone += int(cursor.rowcount)
            superseding.freeing(cursor, None)
    return gone


# Whether a memory that replaced another has expired: what it replaced is
# hidden until the purge frees it, so the purge should not wait for the
# minute's clean-up. Through the partial index on expires_at, then one probe of
# (user_id, superseded_by) for each expired memory.
_REPLACER_EXPIRED = (
    "SELECT EXISTS (SELECT 1 FROM memories e WHERE e.expires_at <= %s AND EXISTS"
    " (SELECT 1 FROM memories m WHERE m.user_id = e.user_id AND m.superseded_by = e.id))"
)


def free_expired_replacements(*, now: datetime | None = None) -> int | None:
    """Purge the expired memories at once if one of them replaced another (operator path).

    ``clean_up`` runs every minute; a fact whose newer value expired would be
    missing from every search until then (its older value still replaced, by a
    memory no tool returns), so the workers ask this every few seconds.
    Returns how many expired memories went (0 when none had replaced
    anything), or None while another process is cleaning up.
    """
    moment = now or timezone.now()
    with tenancy.operator(), connection.cursor() as cursor:
        cursor.execute(_REPLACER_EXPIRED, [moment])
        (due,) = cursor.fetchone()
    if not due:
        return 0
    with pooling.advisory_lock(_MAINTENANCE_LOCK, wait=False) as locked:
        if not locked:
            return None
        with context.acting_as("maintenance"):
            return _purge_expired(moment)


def clean_up(*, now: datetime | None = None) -> CleanUp | None:
    """Purge what has outlived its time, across users (operator path).

    * Expired memories are deleted, as any delete: each leaves a "deleted"
      version (by "maintenance") that the history retention then ages out.
    * History of memories deleted more than ``HISTORY_RETENTION_DAYS`` ago.
    * Jobs finished more than ``JOB_RETENTION_DAYS`` ago.
    * Forget confirmations past their expiry.

    Returns None, doing nothing, while another process is cleaning up.
    Works in batches, each its own transaction, so a big purge never holds
    long locks.
    """
    moment = now or timezone.now()
    # The lock is held by a transaction behind a transaction pooler (pooling.py).
    with pooling.advisory_lock(_MAINTENANCE_LOCK, wait=False) as locked:
        if not locked:
            return None
        with context.acting_as("maintenance"):
            expired = _purge_expired(moment)
            horizon = moment - timedelta(days=settings.HISTORY_RETENTION_DAYS)
            history = _in_batches(
                "DELETE FROM memory_history WHERE memory_id IN ("
                " SELECT h.memory_id FROM memory_history h"
                " WHERE h.action = 'deleted' AND h.recorded_at < %s"
                " AND NOT EXISTS (SELECT 1 FROM memories m WHERE m.id = h.memory_id)"
                " LIMIT %s)",
                [horizon],
            )
            finished = _in_batches(
                "DELETE FROM memory_jobs WHERE id IN (SELECT id FROM memory_jobs"
                " WHERE finished_at < %s LIMIT %s)",
                [moment - timedelta(days=settings.JOB_RETENTION_DAYS)],
            )
            confirmations = _in_batches(
                "DELETE FROM forget_confirmations WHERE token_hash IN ("
                " SELECT token_hash FROM forget_confirmations WHERE expires_at < %s LIMIT %s)",
                [moment - EXPIRED_KEPT],
            )
    return CleanUp(expired, history, finished, confirmations)


def _in_batches(sql: str, params: list[Any]) -> int:
    """Run a delete of at most ``CLEAN_UP_BATCH`` rows until it deletes fewer, each batch
    its own transaction."""
    total = 0
    while True:
        with tenancy.operator(), connection.cursor() as cursor:
            cursor.execute(sql, [*params, CLEAN_UP_BATCH])
            done = cursor.rowcount
        total += done
        if done < CLEAN_UP_BATCH:
            return total


def has_stale_embeddings(*, model_id: str) -> bool:
    """Say whether any memory was embedded by a model other than ``model_id`` (operator path)."""
    with tenancy.operator():
        return Memory.objects.exclude(embedding_model=model_id).exists()


@dataclass(frozen=True)
class Reembedding:
    model: str
    total: int  # memories embedded by another model when it started
    done: int = 0
    # Memories whose content changed meanwhile: their update already embedded
    # them with the current model.
    skipped: int = 0
    dropped: tuple[str, ...] = ()  # models whose HNSW index was dropped
    seconds: float = 0.0


def reembed(
    *,
    batch_size: int = 64,
    dry_run: bool = False,
    drop_old_indexes: bool = False,
    progress: Callable[[int, int, float], None] | None = None,
) -> Reembedding:
    """Re-embed every memory whose vector came from another model (operator path).

    Builds the configured model's HNSW index first. ``progress`` is called
    after each batch with the memories seen so far, the total and the seconds
    elapsed. With ``drop_old_indexes``, afterwards drops the HNSW indexes of
    models no memory uses any more.
    """
    embedder = embeddings.get_embedder()
    embedder.load()
    model = embedder.model_id
    # DDL runs as the connecting (owner) role, not on the operator path.
    indexes.ensure_vector_index(model, embedder.dimensions)
    with tenancy.operator():
        total = Memory.objects.exclude(embedding_model=model).count()
    if dry_run or total == 0:
        return Reembedding(model=model, total=total)

    done = skipped = 0
    last_id = None
    started = time.monotonic()
    while True:
        with tenancy.operator():
            batch = Memory.objects.exclude(embedding_model=model).order_by("id")
            if last_id is not None:
                batch = batch.filter(id__gt=last_id)
            rows = list(batch.values("id", "content", "content_hash")[:batch_size])
        if not rows:
            break
        vectors = embedder.embed([row["content"] for row in rows])
        with tenancy.operator():
            # The batch's rows first, in one statement in id order, as every
            # writer of several memories takes them: each update below also
            # writes its namespace's generation, and a row asked for after
            # that could be held by an edit waiting for the generation.
            list(
                Memory.objects.filter(id__in=[row["id"] for row in rows])
                .order_by("id")
                .select_for_update(no_key=True)
                .values_list("id", flat=True)
            )
            for row, vector in zip(rows, vectors, strict=True):
                # The hash guard skips a memory whose content changed meanwhile;
                # its update already embedded it with the current model.
                changed = (
                    Memory.objects.filter(id=row["id"], content_hash=row["content_hash"])
                    .exclude(embedding_model=model)
                    .update(embedding=vector, embedding_model=model)
                )
                done += changed
                skipped += 1 - changed
        last_id = rows[-1]["id"]
        if progress is not None:
            progress(done + skipped, total, time.monotonic() - started)

    dropped: list[str] = []
    if drop_old_indexes:
        with tenancy.operator():
            in_use = set(Memory.objects.values_list("embedding_model", flat=True).distinct())
        for old in indexes.existing_models():
            if old not in in_use and old != model:
                indexes.drop_vector_index(old)
                dropped.append(old)
    return Reembedding(
        model=model,
        total=total,
        done=done,
        skipped=skipped,
        dropped=tuple(dropped),
        seconds=time.monotonic() - started,
    )
