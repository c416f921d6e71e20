"""Export and import: a user's memories with their history, as records (memories/transfer.py
writes them as JSON Lines)."""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import numpy as np
from django.db import IntegrityError, connection
from django.db.models import Q
from django.utils import timezone

from core import context, tenancy
from core.errors import (
    ValidationFailed,
)
from core.timestamps import iso
from memories import embeddings, validation
from memories.embeddings.failures import embed_texts
from memories.indexes import vector_literal
from memories.models import (
    Memory,
    MemoryHistory,
)
from memories.services.incoming import Incoming, read_record
from memories.services.storing import drop_expired_copies, holder

logger = logging.getLogger("memories.services")


EXPORT_BATCH = 500


IMPORT_BATCH = 100
# The index that keeps one memory per content and place (migration 0005).
DEDUP = "memories_dedup"
# How often a batch is stored again after a live write took one of its places.
IMPORT_ATTEMPTS = 3


def export_memories(
    *,
    user_id: uuid.UUID | str,
    namespace: object = None,
    with_embeddings: bool = False,
) -> Iterator[dict[str, object]]:
    """Yield the user's memories (one namespace, or all), oldest first, each with its history.

    Expired memories are left out, as from every read. Embeddings come only
    when asked for, with the model that made them, so that an import into a
    server running the same model need not embed again.
    """
    ns = validation.namespace(namespace) if namespace is not None else None
    columns = [
        "id",
        "agent__name",
        "namespace",
        "source_kind",
        "author",
        "path",
        "thread_id",
        "position",
        "task_id",
        "content",
        "metadata",
        "priority",
        "version",
        "embedding_model",
        "created_at",
        "updated_at",
        "expires_at",
        "superseded_by",
        "superseded_at",
    ]
    if with_embeddings:
        columns.append("embedding")
    after: tuple[datetime, uuid.UUID] | None = None
    while True:
        with tenancy.tenant(user_id):
            rows = Memory.objects.live().filter(user_id=user_id)
            if ns is not None:
                rows = rows.filter(namespace=ns)
            if after is not None:
                rows = rows.filter(
                    Q(created_at__gt=after[0]) | Q(created_at=after[0], id__gt=after[1])
                )
            batch = list(rows.order_by("created_at", "id").values(*columns)[:EXPORT_BATCH])
            versions: dict[uuid.UUID, list[dict[str, object]]] = {}
            for row in (
                MemoryHistory.objects.filter(
                    user_id=user_id, memory_id__in=[m["id"] for m in batch]
                )
                .order_by("memory_id", "version")
                .values("memory_id", *_HISTORY_FIELDS)
            ):
                versions.setdefault(row["memory_id"], []).append(_exported_version(row))
        for row in batch:
            record = {
                "id": str(row["id"]),
                "agent": row["agent__name"],
                "namespace": row["namespace"],
                "source_kind": row["source_kind"],
                "author": row["author"],
                "path": row["path"],
                "thread_id": row["thread_id"],
                "position": row["position"],
                "task_id": row["task_id"],
                "content": row["content"],
                "metadata": row["metadata"],
                "priority": row["priority"],
                "version": row["version"],
                "created_at": iso(row["created_at"]),
                "updated_at": iso(row["updated_at"]),
                "expires_at": iso(row["expires_at"]) if row["expires_at"] else None,
                "history": versions.get(row["id"], []),
            }
            if row["superseded_by"] is not None:
                # Issue 22: the later memory that replaced this one.
                record["superseded_by"] = str(row["superseded_by"])
                record["superseded_at"] = iso(row["superseded_at"])
            if with_embeddings:
                record["embedding_model"] = row["embedding_model"]
                record["embedding"] = [float(v) for v in row["embedding"]]
            yield record
        if len(batch) < EXPORT_BATCH:
            return
        after = (batch[-1]["created_at"], batch[-1]["id"])


_HISTORY_FIELDS = (
    "version",
    "action",
    "namespace",
    "content",
    "metadata",
    "priority",
    "expires_at",
    "client",
    "recorded_at",
    "superseded_by",
    "replaces",
    "decision",
)


def _exported_version(row: dict[str, Any]) -> dict[str, object]:
    return {
        "version": row["version"],
        "action": row["action"],
        "content": row["content"],
        "metadata": row["metadata"],
        "namespace": row["namespace"],
        "priority": row["priority"],
        "expires_at": iso(row["expires_at"]) if row["expires_at"] else None,
        "client": row["client"],
        "timestamp": iso(row["recorded_at"]),
        **_link_fields(row),
    }


def _link_fields(row: dict[str, Any]) -> dict[str, object]:
    """A version's supersession fields, when it has any."""
    out: dict[str, object] = {}
    if row.get("superseded_by"):
        out["superseded_by"] = str(row["superseded_by"])
    if row.get("replaces"):
        out["replaces"] = [str(x) for x in row["replaces"]]
    if row.get("decision"):
        out["decision"] = row["decision"]
    return out


@dataclass
class Imported:
    read: int = 0
    imported: int = 0
    deduplicated: int = 0  # identical content was already in the namespace
    embedded: int = 0  # re-embedded: no vector, or one from another model
    expired: int = 0  # expired since the export: left out
    linked: int = 0  # linked by this import to the imported memory that replaced it
    already_linked: int = 0  # so linked before this import (the same file imported again)
    unlinked: int = 0  # replaced by a memory not in the import: current here
    refused: int = 0  # not kept: to itself, a loop, across a namespace or task, or replaced already


def import_memories(
    *,
    user_id: uuid.UUID | str,
    records: Iterable[dict[str, object]],
    progress: Callable[[Imported], None] | None = None,
) -> Imported:
    """Store exported memories for a user, with their history and timestamps.

    Each record is validated like ``remember``'s input; a bad record stops
    the import with its position, and the batch it is in is not stored (the
    batches before it are). Identical content already in the namespace is
    skipped, as ``remember`` would. A memory keeps its id unless that id is
    taken on this server. A memory an agent wrote goes to the user's agent of
    the same name, created if the user has none. Vectors are reused when
    they come from the configured model, otherwise the content is embedded
    again. The free tier's quota does not apply: this is an operator's
    command.
    """
    embedder = embeddings.get_embedder()
    report = Imported()
    agents: dict[str, uuid.UUID] = {}
    batch: list[Incoming] = []
    # Each record's id to the memory that holds it here, and the links to
    # restore once every memory is in (a link may name a later record).
    stored: dict[uuid.UUID, uuid.UUID] = {}
    # The memories this import inserted, whose history came from the file.
    inserted: set[uuid.UUID] = set()
    naming = False  # whether any imported history names another memory
    links: list[Incoming] = []
    # Every id the file named: an export names each memory once, and a link or a
    # history naming an id named twice could not say which memory it meant.
    named: set[uuid.UUID] = set()
    try:
        for record in records:
            report.read += 1
            incoming = _read_once(record, embedder, named, report.read)
            if incoming.expires_at is not None and incoming.expires_at <= timezone.now():
                report.expired += 1
                continue
            batch.append(incoming)
            naming = naming or any(v["superseded_by"] or v["replaces"] for v in incoming.history)
            if incoming.superseded_by is not None:
                links.append(incoming)
            if len(batch) >= IMPORT_BATCH:
                _import_batch(user_id, batch, embedder, report, agents, stored, inserted)
                batch = []
                if progress is not None:
                    progress(report)
        if batch:
            _import_batch(user_id, batch, embedder, report, agents, stored, inserted)
    except KeyboardInterrupt:
        # Ctrl-C at the command: what is in keeps its links, as below.
        if stored:
            _restore_links(user_id, links, stored, inserted, report, naming=naming)
        raise
    except ValidationFailed as error:
        if not stored:
            raise
        # The batches before the bad record are in: their links and history
        # are restored as for a whole file, so that no fact the file marks
        # replaced is left current beside what replaced it.
        _restore_links(user_id, links, stored, inserted, report, naming=naming)
        raise ValidationFailed(
            f"{error.message} The {report.imported:,} memories before it were imported"
            f" ({report.linked:,} replacements linked among them); mend the file and import"
            " it again: what is here already is skipped."
        ) from None
    _restore_links(user_id, links, stored, inserted, report, naming=naming)
    if progress is not None:
        progress(report)
    return report


def _read_once(
    record: dict[str, object], embedder: embeddings.Embedder, named: set[uuid.UUID], place: int
) -> Incoming:
    """Read the ``place``-th record, refusing one whose id an earlier record named."""
    try:
        incoming = read_record(record, embedder)
        if incoming.id in named:
            raise ValidationFailed(f"id {incoming.id} is named by an earlier record too.")
        named.add(incoming.id)
    except ValidationFailed as error:
        # A file's line when the record came from one (blank lines are skipped).
        line = getattr(record, "line", None)
        where = f"line {line}" if line is not None else f"record {place}"
        raise ValidationFailed(f"{where}: {error.message}") from None
    return incoming


def _restore_links(
    user_id: uuid.UUID | str,
    links: list[Incoming],
    stored: dict[uuid.UUID, uuid.UUID],
    inserted: set[uuid.UUID],
    report: Imported,
    *,
    naming: bool,
) -> None:
    """Link what the file marks replaced, and point its history at the ids memories got here."""
    if links:
        _import_links(user_id, links, stored, inserted, report)
    if naming:
        _map_history_ids(user_id, stored, inserted)


def _import_links(
    user_id: uuid.UUID | str,
    links: list[Incoming],
    stored: dict[uuid.UUID, uuid.UUID],
    inserted: set[uuid.UUID],
    report: Imported,
) -> None:
    """Link each imported memory to the imported memory that replaced it, as exported.

    In one transaction, after every memory is in. The history came with the
    memories, so the links are restored without a version or history row of
    their own (app.importing, migration 0014). A link to a memory outside
    the import is dropped: that memory is current here. So is one whose
    memory was forgotten since it was imported (a live writer's ``forget``).

    Every row the links touch is locked first, in one statement, before any
    is written. A write takes its memory rows, then the namespace's search
    generation and statistics (its statement triggers, migrations 0006 and
    0017); linking one row at a time would take the generation after the
    first link and a later row after it, the other way round, and deadlock
    with a live ``update_memory`` or ``forget`` of that later memory.
    """
    # Each older memory to what replaced it.
    pairs: dict[uuid.UUID, tuple[uuid.UUID, datetime | None]] = {}
    for item in links:
        old, new = stored.get(item.id), stored.get(item.superseded_by)  # type: ignore[arg-type]
        if old is None or new is None:
            report.unlinked += 1
            continue
        if old == new or old in pairs:  # one memory here for both, or two records of one
            report.refused += 1
            continue
        pairs[old] = (new, item.superseded_at)
    if not pairs:
        return
    touched = sorted({str(i) for i in pairs} | {str(new) for new, _ in pairs.values()})
    with context.acting_as("import"), tenancy.tenant(user_id), connection.cursor() as cursor:
        cursor.execute("SELECT set_config('app.importing', 'on', true)")
        cursor.execute(
            "SELECT id FROM memories WHERE user_id = %s AND id = ANY(%s::uuid[])"
            " ORDER BY id FOR NO KEY UPDATE",
            [str(user_id), touched],
        )
        present = {row[0] for row in cursor.fetchall()}
        for old in _chain_order(pairs):
            new, at = pairs[old]
            if old not in present or new not in present:
                report.unlinked += 1
                continue
            # The database refuses a link to a memory that is replaced
            # already; a file whose links loop (edited by hand) would ask
            # for one. That link is dropped, not the import.
            # So is one across a namespace or a writer, which the database
            # refuses too (a hand-edited file): it used to stop every link.
            # And one across a task, which ``supersede`` refuses: a task's
            # notes are lent to every agent naming it (superseding.py).
            # A memory that was here before the import (the record's content
            # found stored) has no history from the file: its link is a
            # version of its own, recorded as the import's decision.
            before = old not in inserted
            if before:
                cursor.execute(
                    "SELECT set_config('app.importing', '', true),"
                    " set_config('app.supersession', %s, true)",
                    [json.dumps(IMPORTED_LINK)],
                )
            cursor.execute(
                "UPDATE memories SET superseded_by = %s,"
                " superseded_at = coalesce(%s, statement_timestamp())"
                " WHERE id = %s AND user_id = %s AND superseded_by IS NULL"
                " AND EXISTS (SELECT 1 FROM memories r WHERE r.id = %s AND r.user_id = %s"
                " AND r.superseded_by IS NULL AND r.namespace = memories.namespace"
                " AND r.agent_id IS NOT DISTINCT FROM memories.agent_id"
                " AND r.task_id IS NOT DISTINCT FROM memories.task_id)",
                [new, at, old, str(user_id), new, str(user_id)],
            )
            done = cursor.rowcount
            if before:
                cursor.execute(
                    "SELECT set_config('app.importing', 'on', true),"
                    " set_config('app.supersession', '', true)"
                )
            if done:
                report.linked += 1
                continue
            # Linked so already (the same file imported again): counted apart,
            # since this import made no link.
            cursor.execute(
                "SELECT count(*) FROM memories WHERE id = %s AND superseded_by = %s",
                [old, new],
            )
            if cursor.fetchone()[0]:
                report.already_linked += 1
            else:
                report.refused += 1
        cursor.execute("SELECT set_config('app.importing', '', true)")


# Who linked a memory that was here before an import, in its history.
IMPORTED_LINK = {"decided_by": "import", "reason": "replaced as in the imported file"}


def _map_history_ids(
    user_id: uuid.UUID | str, stored: Mapping[uuid.UUID, uuid.UUID], inserted: set[uuid.UUID]
) -> None:
    """Rewrite the ids the imported history names (``superseded_by``, ``replaces``) from the
    file's to the memories that hold them here. A ``superseded_by`` of no imported memory
    (a replacement deleted before the export) becomes an id of this user's that names no
    memory, the same for each: the version was replaced, and ``as_of`` reads it so. Left
    empty, it made the version current, an outdated value answered as held true then.

    A memory keeps its id unless the id is taken here, and a record whose content was here
    already is that memory: the file's id then named another user's memory, or none, and a
    purge, which finds the rows that quote a purged memory by its id, missed them. History
    is append-only to the tenant; this runs on the operator path, on this import's memories.
    """
    if not inserted:
        return
    files, here = list(stored), [stored[file] for file in stored]
    with tenancy.operator(), connection.cursor() as cursor:
        cursor.execute(
            "WITH map(file, here) AS (SELECT * FROM unnest(%s::uuid[], %s::uuid[]))"
            " UPDATE memory_history h SET"
            " superseded_by = coalesce((SELECT map.here FROM map WHERE map.file = h.superseded_by),"
            "   md5(h.user_id::text || h.superseded_by::text)::uuid),"
            " replaces = (SELECT array_agg(map.here ORDER BY r.n)"
            "   FROM unnest(h.replaces) WITH ORDINALITY AS r(id, n)"
            "   JOIN map ON map.file = r.id)"
            " WHERE h.user_id = %s AND h.memory_id = ANY(%s::uuid[])"
            " AND (h.superseded_by IS NOT NULL OR h.replaces IS NOT NULL)",
            [files, here, str(user_id), list(inserted)],
        )


def _chain_order(pairs: Mapping[uuid.UUID, tuple[uuid.UUID, Any]]) -> list[uuid.UUID]:
    """The older memories of ``pairs`` in the order their links can be written.

    A link to a memory that is replaced already is refused, so X -> Y goes in
    before Y -> Z: the farther a memory stands from its chain's end, the
    earlier. The file's order is creation order, which is not chain order
    once a fact changed back (an older memory then replaces a newer one).
    """

    # Each memory's steps to its chain's end, each worked out once: walking
    # every chain afresh from each of its memories took the square of its length.
    known: dict[uuid.UUID, int] = {}
    for start in pairs:
        path: list[uuid.UUID] = []
        on_path: set[uuid.UUID] = set()
        at = start
        while at in pairs and at not in known and at not in on_path:
            path.append(at)
            on_path.add(at)
            at = pairs[at][0]
        # The end, a memory already measured, or a loop (no end: counted from here).
        steps = known.get(at, 0)
        for memory in reversed(path):
            steps += 1
            known[memory] = steps
    return sorted(pairs, key=lambda memory: known[memory], reverse=True)


def _import_agents(user_id: uuid.UUID | str, names: set[str], agents: dict[str, uuid.UUID]) -> None:
    """Find (or create) the user's agents named in an import, into ``agents`` by name."""
    from accounts import services as account_services

    missing = {name for name in names if name.lower() not in agents}
    if not missing:
        return
    for agent in account_services.list_agents(user_id=user_id):
        agents[agent.name.lower()] = agent.id
    for name in sorted(missing):
        if name.lower() not in agents:
            agent, _ = account_services.agent_called(user_id=user_id, name=name)
            agents[name.lower()] = agent.id


def _import_batch(
    user_id: uuid.UUID | str,
    batch: list[Incoming],
    embedder: embeddings.Embedder,
    report: Imported,
    agents: dict[str, uuid.UUID],
    stored: dict[uuid.UUID, uuid.UUID],
    inserted: set[uuid.UUID],
) -> None:
    # Which ids are free on this server, whoever holds them (operator path).
    ids = [item.id for item in batch]
    with tenancy.operator():
        taken = set(Memory.objects.filter(id__in=ids).values_list("id", flat=True))
        taken |= set(
            MemoryHistory.objects.filter(memory_id__in=ids).values_list("memory_id", flat=True)
        )
    _import_agents(user_id, {item.agent for item in batch if item.agent}, agents)
    # By place in the batch: one vector for each record, whatever its id.
    need = [(place, item) for place, item in enumerate(batch) if item.vector is None]
    vectors = dict(
        zip(
            [place for place, _ in need],
            embed_texts(embedder, [item.content for _, item in need]) if need else [],
            strict=True,
        )
    )
    # A live write of the same content may hold a place uncommitted when the
    # import looks: the import's insert waits on the dedup index and
    # conflicts once that write commits. The batch is then stored again, and
    # finds the place held, as a repeat would.
    for attempt in range(1, IMPORT_ATTEMPTS + 1):
        try:
            with context.acting_as("import"), tenancy.tenant(user_id):
                # An expired copy not yet purged still holds its place in the
                # dedup index. It goes in a transaction of its own, as the
                # purge would: in the batch's, the delete wrote (the
                # namespace's generation) before the batch's insert could
                # wait on a place a live write held.
                drop_expired_copies(user_id, sorted({item.content_hash for item in batch}))
            with context.acting_as("import"), tenancy.tenant(user_id):
                counts, held, fresh = _store_batch(
                    user_id, batch, agents, set(taken), vectors, embedder
                )
        except IntegrityError as error:
            constraint = getattr(getattr(error.__cause__, "diag", None), "constraint_name", None)
            if constraint != DEDUP or attempt == IMPORT_ATTEMPTS:
                raise
            continue
        break
    report.imported += counts.imported
    report.deduplicated += counts.deduplicated
    report.embedded += counts.embedded
    stored.update(held)
    inserted.update(fresh)


_INSERT_IMPORTED = (
    "INSERT INTO memories (id, user_id, agent_id, namespace, source_kind, author,"
    " path, thread_id, position, task_id, content, content_hash, embedding,"
    " embedding_model, metadata, priority, expires_at, version, created_at,"
    " updated_at) VALUES "
)
_IMPORTED_ROW = (
    "(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s::vector, %s, %s::jsonb,"
    " %s, %s, %s, %s, %s)"
)


def _store_batch(
    user_id: uuid.UUID | str,
    batch: list[Incoming],
    agents: dict[str, uuid.UUID],
    taken: set[uuid.UUID],
    vectors: dict[int, np.ndarray],
    embedder: embeddings.Embedder,
) -> tuple[Imported, dict[uuid.UUID, uuid.UUID], set[uuid.UUID]]:
    """Store a batch in the open transaction: what it counted, each record's memory here,
    and the memories it inserted."""
    counts = Imported()
    stored: dict[uuid.UUID, uuid.UUID] = {}
    fresh: set[uuid.UUID] = set()
    # The batch's memories go in one statement, after every record is read.
    # Inserted one statement each, the first took the namespace's generation
    # (its trigger) and a later one could wait on a place a live write held
    # while that write waited for the generation: a deadlock.
    placed: dict[tuple[Any, ...], uuid.UUID] = {}
    versions: list[MemoryHistory] = []
    rows: list[list[Any]] = []
    for position, item in enumerate(batch):
        agent_id = agents[item.agent.casefold()] if item.agent else None
        place = {
            "user_id": user_id,
            "agent_id": agent_id,
            "namespace": item.namespace,
            "thread_id": item.thread_id,
            "position": item.position,
            "task_id": item.task_id,
            "path": item.path,
        }
        key = (*place.values(), item.content_hash)
        existing = placed.get(key) or holder(place, item.content_hash)
        if existing:
            counts.deduplicated += 1
            stored[item.id] = existing
            continue
        memory_id = uuid.uuid4() if item.id in taken else item.id
        taken.add(memory_id)
        stored[item.id] = placed[key] = memory_id
        history = item.history or [
            {
                "version": 1,
                "action": "created",
                "content": item.content,
                "metadata": item.metadata,
                "namespace": item.namespace,
                "priority": item.priority,
                "expires_at": item.expires_at,
                "client": "import",
                "recorded_at": item.created_at,
            }
        ]
        versions.extend(
            MemoryHistory(memory_id=memory_id, user_id=user_id, agent_id=agent_id, **version)
            for version in history
        )
        vector = item.vector if item.vector is not None else vectors[position]
        rows.append(
            [
                memory_id,
                str(user_id),
                agent_id,
                item.namespace,
                item.source_kind,
                item.author,
                item.path,
                item.thread_id,
                item.position,
                item.task_id,
                item.content,
                item.content_hash,
                vector_literal(vector),
                embedder.model_id,
                json.dumps(item.metadata),
                item.priority,
                item.expires_at,
                max(item.version, max(v["version"] for v in history)),
                item.created_at,
                item.updated_at,
            ]
        )
        fresh.add(memory_id)
        counts.imported += 1
        counts.embedded += item.vector is None
    if rows:
        MemoryHistory.objects.bulk_create(versions)
        with connection.cursor() as cursor:
            # The history just written covers each version, so the history
            # trigger adds no row of its own.
            cursor.execute(
                _INSERT_IMPORTED + ", ".join([_IMPORTED_ROW] * len(rows)),
                [value for row in rows for value in row],
            )
    return counts, stored, fresh
