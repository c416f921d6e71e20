"""Memories: the five operations, and everything else other code needs of the table.

Every interface calls these and only these: the MCP tools, the dashboard,
the admin, management commands, and other apps (the admin's counts, the
usage page's quota). ``recall/tests/test_architecture.py`` keeps it so.

The five operations return plain data (dicts, lists, str, bool) shaped as
the RecallMCP specification describes, and raise only
``recall.errors.RecallError`` subclasses for anything a caller did or could
fix. Input is validated in full before anything is written, so bad input
writes nothing.

Functions that act for a user run inside ``tenancy.tenant(user_id,
agent_id=...)``: one transaction with row-level security bound to the
caller, and to its agent when it acts as one (an OAuth connection or an
agent-scoped key; ``agent_id=None`` is the user-wide view, as ``recall_app``).
The explicit ``user_id`` filters below are for the planner's benefit;
isolation does not depend on them, nor on any agent filter. The few that act
for an operator (re-embedding, counts across users) say "operator path" and
run in ``tenancy.operator()``. Embedding happens outside transactions so
that a slow embedding provider never holds a database connection.
"""

from __future__ import annotations

import hashlib
import json
import logging
import secrets
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Any

import numpy as np
from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.db.models import Count, Q
from django.db.models.functions import Coalesce
from django.utils import timezone

from accounts.tiers import Tier
from memories import embeddings, indexes, validation
from memories.indexes import vector_literal, vector_type
from memories.models import ForgetConfirmation, Memory, SourceKind
from recall import tenancy
from recall.admin_tools import count_per_user
from recall.errors import (
    ConfirmationExpired,
    ConfirmationInvalid,
    Conflict,
    EmbeddingUnavailable,
    NotFound,
    QuotaExceeded,
    RecallError,
    ValidationFailed,
)
from recall.timestamps import iso

logger = logging.getLogger(__name__)


# remember ---------------------------------------------------------------------


@dataclass(frozen=True)
class Source:
    """Where a memory came from and what it is filed under (seed 003's fields).

    ``remember`` stores notes with no source; ``memory_add`` fills these in.
    """

    kind: str = SourceKind.NOTE
    author: str = ""
    path: str = ""
    thread_id: str | None = None
    task_id: str | None = None


NO_SOURCE = Source()


def remember(
    *,
    user_id: uuid.UUID | str,
    tier: str,
    content: Any,
    namespace: Any = "default",
    metadata: Any = None,
    agent_id: uuid.UUID | str | None = None,
) -> dict[str, Any]:
    """Store a memory, or return the id of the identical one already stored.

    Identical means equal normalised content in the same namespace, written by
    the same agent (or both user-wide). The unique constraint
    ``memories_dedup`` decides it, so concurrent identical calls produce one
    row; the look-up first only saves an embedding.
    """
    text = validation.content(content)
    ns = validation.namespace(namespace)
    meta = validation.metadata(metadata)
    [stored] = store(
        user_id=user_id,
        tier=tier,
        agent_id=agent_id,
        items=[(text, meta)],
        namespace=ns,
        source=NO_SOURCE,
    )
    return stored


def store(
    *,
    user_id: uuid.UUID | str,
    tier: str,
    agent_id: uuid.UUID | str | None,
    items: list[tuple[str, dict[str, Any]]],
    namespace: str,
    source: Source | list[Source],
) -> list[dict[str, Any]]:
    """Store validated, normalised ``(content, metadata)`` items in one transaction.

    All or nothing: either every item is stored (or found already stored) or
    an error is raised and nothing is written. ``source`` is one for all
    items, or one per item. Returns ``{id, deduped}`` per item, in order.
    Callers validate; this only writes.
    """
    sources = source if isinstance(source, list) else [source] * len(items)
    keys = [
        (src, validation.content_hash(text)) for src, (text, _) in zip(sources, items, strict=True)
    ]
    with tenancy.tenant(user_id, agent_id=agent_id):
        existing = _existing(user_id, agent_id, namespace, keys)
    fresh = sorted({i for i, key in enumerate(keys) if key not in existing})
    embedder = embeddings.get_embedder()
    vectors = _embed_many(embedder, [items[i][0] for i in fresh]) if fresh else []
    vector_for = dict(zip(fresh, vectors, strict=True))

    results: list[dict[str, Any]] = []
    with tenancy.tenant(user_id, agent_id=agent_id):
        if tier == Tier.FREE and fresh:
            _check_quota(user_id, adding=len(fresh))
        stored: dict[tuple[Source, str], uuid.UUID] = {}
        for i, (text, meta) in enumerate(items):
            src, digest = keys[i]
            if keys[i] in existing or keys[i] in stored or i not in vector_for:
                found = existing.get(keys[i]) or stored.get(keys[i])
                results.append({"id": str(found), "deduped": True})
                continue
            with connection.cursor() as cursor:
                cursor.execute(
                    "INSERT INTO memories (id, user_id, agent_id, namespace, source_kind, author,"
                    " path, thread_id, task_id, content, content_hash, embedding, embedding_model,"
                    " metadata)"
                    " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s::vector, %s,"
                    " %s::jsonb)"
                    " ON CONFLICT ON CONSTRAINT memories_dedup DO NOTHING RETURNING id",
                    [
                        uuid.uuid4(),
                        str(user_id),
                        str(agent_id) if agent_id else None,
                        namespace,
                        src.kind,
                        src.author,
                        src.path,
                        src.thread_id,
                        src.task_id,
                        text,
                        digest,
                        vector_literal(vector_for[i]),
                        embedder.model_id,
                        json.dumps(meta),
                    ],
                )
                row = cursor.fetchone()
            if row:
                stored[keys[i]] = row[0]
                results.append({"id": str(row[0]), "deduped": False})
            else:
                # A concurrent call stored the same content first.
                again = _existing(user_id, agent_id, namespace, [keys[i]])
                results.append({"id": str(again[keys[i]]), "deduped": True})
    return results


def _existing(
    user_id: uuid.UUID | str,
    agent_id: uuid.UUID | str | None,
    namespace: str,
    keys: list[tuple[Source, str]],
) -> dict[tuple[Source, str], uuid.UUID]:
    by_source: dict[Source, list[str]] = {}
    for src, digest in keys:
        by_source.setdefault(src, []).append(digest)
    found: dict[tuple[Source, str], uuid.UUID] = {}
    for src, digests in by_source.items():
        for digest, memory_id in _ids_by_hash(user_id, agent_id, namespace, src, digests).items():
            found[(src, digest)] = memory_id
    return found


def _ids_by_hash(
    user_id: uuid.UUID | str,
    agent_id: uuid.UUID | str | None,
    namespace: str,
    source: Source,
    digests: list[str],
) -> dict[str, uuid.UUID]:
    # The same columns as memories_dedup: a task-shared memory of another
    # agent is visible here, but it is not this writer's copy.
    rows = Memory.objects.filter(
        _written_by(agent_id),
        user_id=user_id,
        namespace=namespace,
        thread_id=source.thread_id,
        task_id=source.task_id,
        path=source.path,
        content_hash__in=digests,
    ).values_list("content_hash", "id")
    return dict(rows)


def _written_by(agent_id: uuid.UUID | str | None) -> Q:
    """Match the memories ``agent_id`` wrote itself, or with None the user-wide ones."""
    return Q(agent_id__isnull=True) if agent_id is None else Q(agent_id=agent_id)


def _check_quota(user_id: uuid.UUID | str, adding: int = 1) -> None:
    # Serialise this user's free-tier inserts so two concurrent calls at 99
    # memories cannot both pass the count.
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", [str(user_id)])
    limit = settings.FREE_TIER_MAX_MEMORIES
    # The quota is the user's, whichever agent writes, and an agent's own view
    # holds only part of the user's memories: a database function counts them all.
    with connection.cursor() as cursor:
        cursor.execute("SELECT recall_tenant_memory_count()")
        count = cursor.fetchone()[0]
    if count + adding > limit:
        raise QuotaExceeded(
            f"The free tier holds at most {limit} memories. Forget some memories, "
            "or upgrade to a paid tier for unlimited storage."
        )


# recall -----------------------------------------------------------------------


def recall(
    *,
    user_id: uuid.UUID | str,
    agent_id: uuid.UUID | str | None = None,
    query: Any,
    namespace: Any = "default",
    limit: Any = 10,
    threshold: Any = None,
    metadata_filter: Any = None,
) -> list[dict[str, Any]]:
    """Return the namespace's memories most similar to ``query``, most similar first."""
    search = _search(query, namespace, limit, threshold, metadata_filter)
    with tenancy.tenant(user_id, agent_id=agent_id, local_settings=SEARCH_SETTINGS):
        found = _nearest(user_id, search)
    return [
        {
            "id": str(memory.id),
            "content": memory.content,
            "similarity": similarity,
            "metadata": memory.metadata,
            "namespace": memory.namespace,
            "created_at": iso(memory.created_at),
        }
        for memory, similarity in found
    ]


def default_threshold(embedder: embeddings.Embedder | None = None) -> float:
    if settings.RECALL_DEFAULT_THRESHOLD is not None:
        return settings.RECALL_DEFAULT_THRESHOLD
    return (embedder or embeddings.get_embedder()).default_threshold


# The columns memory_search may filter on, all indexed (see Memory.Meta).
SOURCE_FILTERS = ("source_kind", "author", "path", "thread_id", "task_id")

# A search transaction's planner settings. The nearest-neighbour statement
# counts the namespace through its b-tree; at some table shapes the planner
# would rather read the whole table (and sort it) to count a few thousand
# rows. Every path a search needs has an index, so table scans are off.
SEARCH_SETTINGS = {"enable_seqscan": "off"}


@dataclass(frozen=True)
class _Search:
    embedder: embeddings.Embedder
    vector: np.ndarray
    namespace: str
    limit: int
    minimum: float
    metadata_filter: dict[str, Any]
    # Where the query's vector came from: "cache", "shared-cache" or "model".
    vector_source: str = "model"
    sources: dict[str, str] = field(default_factory=dict)


def _search(
    query: Any,
    namespace: Any,
    limit: Any,
    threshold: Any,
    metadata_filter: Any,
    *,
    use_cache: bool = True,
) -> _Search:
    """Validate a search's arguments (recall and forget's preview share them), then embed."""
    text = validation.query(query)
    ns = validation.namespace(namespace)
    count = validation.integer(
        limit, field="limit", low=1, high=validation.RECALL_LIMIT_MAX, default=10
    )
    embedder = embeddings.get_embedder()
    minimum = validation.threshold(threshold, default_threshold(embedder))
    where = validation.metadata_filter(metadata_filter)
    vector, source = _embed_query(embedder, text, use_cache=use_cache)
    return _Search(embedder, vector, ns, count, minimum, where, source)


def _nearest(user_id: uuid.UUID | str, search: _Search) -> list[tuple[Memory, float]]:
    sql, params = nearest_sql(
        user_id=user_id,
        model_id=search.embedder.model_id,
        dimensions=search.embedder.dimensions,
        vector=search.vector,
        namespace=search.namespace,
        limit=search.limit,
        minimum=search.minimum,
        metadata_filter=search.metadata_filter,
        sources=search.sources,
    )
    rows = Memory.objects.raw(sql, params)
    # A raw query sets its extra columns, here distance, on each row; the
    # stub's RawQuerySet knows only the model's fields.
    return [(row, round(1.0 - float(row.distance), 4)) for row in rows]  # type: ignore[attr-defined]


def nearest_sql(
    *,
    user_id: uuid.UUID | str,
    model_id: str,
    dimensions: int,
    vector: np.ndarray,
    namespace: str,
    limit: int,
    minimum: float,
    metadata_filter: dict[str, Any],
    sources: dict[str, str] | None = None,
) -> tuple[str, list[Any]]:
    """Return the nearest-neighbour query and its parameters.

    Two branches, one of which runs, chosen inside the statement:

    * A namespace holding at most ``RECALL_EXACT_SEARCH_MAX`` memories is
      ranked exactly: every row is compared with the query. That costs a
      millisecond or two at these sizes and is always right. HNSW is not,
      and it is at its weakest exactly here: a young graph, or one holding
      many identical vectors (common phrases stored by many tenants), can
      leave freshly inserted elements unreachable from the entry point, so an
      index scan would silently miss them. The branch orders by
      ``cosine_distance()``, a function call the index cannot serve, so the
      planner never picks the index for it whatever its statistics say.
    * A larger namespace is searched through the per-model HNSW index: ORDER
      BY the distance operator on the same cast expression the index was
      built on, LIMIT k, with the model in the WHERE clause to match the
      partial index. Iterative index scans (set on every connection, see
      settings) keep the scan going past rows the namespace, metadata or
      tenant filters reject, so a selective filter still fills ``limit``.

    The size test counts entries of the (user, namespace, updated_at) index up
    to the cut-off and no further, so it stays cheap for a namespace of any
    size; its ORDER BY is what steers the planner to that index. Source
    filters (memory_search's) count too, through their own indexes: a filter
    that leaves few candidates in a big namespace is ranked exactly, where an
    index scan could give up (``hnsw.max_scan_tuples``) before reaching them.
    Row-level security applies to the count as to the search, so an agent's
    own memories are what is counted. The threshold is applied outside, to
    the k nearest, so it can never make the index scan run long.
    """
    cast = vector_type(dimensions)
    exact_max = settings.RECALL_EXACT_SEARCH_MAX
    query = vector_literal(vector)
    clauses = ["user_id = %s", "namespace = %s", "embedding_model = %s"]
    filters: list[Any] = [str(user_id), namespace, model_id]
    if metadata_filter:
        clauses.append("metadata @> %s::jsonb")
        filters.append(json.dumps(metadata_filter))
    # Source filters (memory_search's), ANDed, inside the ranking statement:
    # they narrow the candidates before the nearest are chosen, never after.
    narrowing: list[str] = []
    narrowed: list[Any] = []
    for column, value in (sources or {}).items():
        if column not in SOURCE_FILTERS:
            raise ValueError(f"not a source filter: {column}")
        narrowing.append(f"{column} = %s")
        narrowed.append(value)
    clauses += narrowing
    filters += narrowed
    where = " AND ".join(clauses)
    sized = " AND ".join(["user_id = %s", "namespace = %s", *narrowing])
    # Without source filters, the ORDER BY steers the planner to the
    # namespace's b-tree; with them, the planner picks the filter's index.
    size_order = "" if narrowing else "ORDER BY updated_at DESC"
    columns = (
        "id, user_id, agent_id, namespace, source_kind, author, path, thread_id, task_id,"
        " content, metadata, created_at, updated_at"
    )
    # S608: interpolated are only the vector type (from an int width), the
    # constant column list and clauses built above from constants; every value
    # is a parameter.
    sql = f"""
        WITH query AS MATERIALIZED (SELECT %s::{cast} AS vector),
        small AS MATERIALIZED (
            SELECT count(*) <= %s AS yes FROM (
                SELECT 1 FROM memories WHERE {sized}
                {size_order} LIMIT %s
            ) AS capped
        ),
        nearest AS MATERIALIZED (
            (
                SELECT {columns},
                       cosine_distance(embedding::{cast}, (SELECT vector FROM query)) AS distance
                FROM memories
                WHERE {where} AND (SELECT yes FROM small)
                ORDER BY distance
                LIMIT %s
            )
            UNION ALL
            (
                SELECT {columns},
                       (embedding::{cast}) <=> (SELECT vector FROM query) AS distance
                FROM memories
                WHERE {where} AND NOT (SELECT yes FROM small)
                ORDER BY distance
                LIMIT %s
            )
        )
        SELECT * FROM nearest WHERE distance <= %s ORDER BY distance, id
    """  # noqa: S608
    params: list[Any] = [query, exact_max, str(user_id), namespace, *narrowed, exact_max + 1]
    params += [*filters, limit, *filters, limit, 1.0 - minimum]
    return sql, params


# list_memories ----------------------------------------------------------------


def list_memories(
    *,
    user_id: uuid.UUID | str,
    agent_id: uuid.UUID | str | None = None,
    namespace: Any = "default",
    limit: Any = 20,
    offset: Any = 0,
    order: Any = "created_at",
) -> list[dict[str, Any]]:
    """Return a page of the namespace's memories, newest first by ``order``."""
    ns = validation.namespace(namespace)
    count = validation.integer(
        limit, field="limit", low=1, high=validation.LIST_LIMIT_MAX, default=20
    )
    skip = validation.integer(offset, field="offset", low=0, high=validation.OFFSET_MAX, default=0)
    column = validation.order(order)
    with tenancy.tenant(user_id, agent_id=agent_id):
        rows = list(
            Memory.objects.filter(user_id=user_id, namespace=ns)
            .order_by(f"-{column}", "-id")
            .values("id", "content", "namespace", "metadata", "created_at", "updated_at")[
                skip : skip + count
            ]
        )
    return [
        {
            "id": str(row["id"]),
            "content": row["content"],
            "namespace": row["namespace"],
            "metadata": row["metadata"],
            "created_at": iso(row["created_at"]),
            "updated_at": iso(row["updated_at"]),
        }
        for row in rows
    ]


# update_memory ----------------------------------------------------------------


def update_memory(
    *,
    user_id: uuid.UUID | str,
    agent_id: uuid.UUID | str | None = None,
    id: Any,
    content: Any = None,
    metadata: Any = None,
) -> dict[str, Any]:
    """Replace a memory's content (re-embedding it) and/or its metadata."""
    memory_id = validation.memory_id(id)
    if content is None and metadata is None:
        raise ValidationFailed("Pass content, metadata or both to update a memory.")
    text = validation.content(content) if content is not None else None
    meta = validation.metadata(metadata) if metadata is not None else None

    with tenancy.tenant(user_id, agent_id=agent_id):
        current = (
            Memory.objects.filter(id=memory_id, user_id=user_id)
            .values(
                "namespace",
                "content_hash",
                "agent_id",
                "source_kind",
                "path",
                "thread_id",
                "task_id",
            )
            .first()
        )
    if current is None:
        raise NotFound(f"No memory with id {memory_id}.")

    changes: dict[str, Any] = {}
    if meta is not None:
        changes["metadata"] = meta
    if text is not None:
        digest = validation.content_hash(text)
        if digest != current["content_hash"]:
            embedder = embeddings.get_embedder()
            changes.update(
                content=text,
                content_hash=digest,
                embedding=_embed(embedder, text),
                embedding_model=embedder.model_id,
            )
    if not changes:
        return {"success": True}

    with tenancy.tenant(user_id, agent_id=agent_id):
        try:
            with transaction.atomic():
                updated = Memory.objects.filter(id=memory_id, user_id=user_id).update(**changes)
        except IntegrityError:
            place = Source(
                kind=current["source_kind"],
                path=current["path"],
                thread_id=current["thread_id"],
                task_id=current["task_id"],
            )
            found = _ids_by_hash(
                user_id, current["agent_id"], current["namespace"], place, [changes["content_hash"]]
            )
            other = found.get(changes["content_hash"])
            raise Conflict(
                f"Another memory in namespace '{current['namespace']}' already has this "
                f"content (id {other}). Update or forget that one instead.",
                conflicting_id=str(other),
            ) from None
    if not updated:
        raise NotFound(f"No memory with id {memory_id}.")
    return {"success": True}


# forget -----------------------------------------------------------------------


def forget_by_id(
    *, user_id: uuid.UUID | str, agent_id: uuid.UUID | str | None = None, id: Any
) -> dict[str, Any]:
    memory_id = validation.memory_id(id)
    with tenancy.tenant(user_id, agent_id=agent_id):
        deleted, _ = Memory.objects.filter(id=memory_id, user_id=user_id).delete()
    if not deleted:
        raise NotFound(f"No memory with id {memory_id}.")
    return {"success": True}


def forget_preview(
    *,
    user_id: uuid.UUID | str,
    agent_id: uuid.UUID | str | None = None,
    query: Any,
    namespace: Any = "default",
    limit: Any = 10,
    threshold: Any = None,
    metadata_filter: Any = None,
) -> dict[str, Any]:
    """Find what a query would delete and return a token that deletes exactly that.

    Nothing is deleted here. With no matches there is nothing to confirm, so
    no token is issued.
    """
    search = _search(query, namespace, limit, threshold, metadata_filter)
    token = secrets.token_urlsafe(32)
    expires_at = timezone.now() + timedelta(seconds=settings.FORGET_TOKEN_TTL_SECONDS)
    with tenancy.tenant(user_id, agent_id=agent_id, local_settings=SEARCH_SETTINGS):
        found = _nearest(user_id, search)
        ForgetConfirmation.objects.filter(user_id=user_id, expires_at__lt=timezone.now()).delete()
        if found:
            ForgetConfirmation.objects.create(
                token_hash=_token_hash(token),
                user_id=user_id,
                agent_id=agent_id,
                memory_ids=[memory.id for memory, _ in found],
                expires_at=expires_at,
            )
    matches = [
        {"id": str(memory.id), "content": memory.content, "similarity": similarity}
        for memory, similarity in found
    ]
    return {
        "preview": True,
        "matches": matches,
        "total_matches": len(matches),
        "confirmation_token": token if found else None,
        "expires_at": iso(expires_at) if found else None,
    }


def forget_confirm(
    *, user_id: uuid.UUID | str, agent_id: uuid.UUID | str | None = None, confirmation_token: Any
) -> dict[str, Any]:
    """Delete exactly the memories a preview listed. The token works once, for 5 minutes.

    A token that is unknown, already used or another user's is the same
    ``confirmation_invalid``: row-level security hides other users' tokens.
    """
    if not isinstance(confirmation_token, str) or not 0 < len(confirmation_token) <= 256:
        raise ValidationFailed("confirmation_token must be the token a preview returned.")
    with tenancy.tenant(user_id, agent_id=agent_id):
        # Deleting the confirmation first claims it: of two concurrent
        # confirmations, the second finds nothing.
        with connection.cursor() as cursor:
            cursor.execute(
                "DELETE FROM forget_confirmations WHERE token_hash = %s"
                " RETURNING memory_ids, expires_at <= statement_timestamp()",
                [_token_hash(confirmation_token)],
            )
            claimed = cursor.fetchone()
        if claimed is None:
            raise ConfirmationInvalid(
                "This confirmation token is not valid: it may have been used already. "
                "Run forget with mode by_query and a query to get a new one."
            )
        memory_ids, expired = claimed
        deleted = 0
        if not expired:
            deleted, _ = Memory.objects.filter(user_id=user_id, id__in=memory_ids).delete()
    if expired:
        raise ConfirmationExpired(
            "This confirmation token has expired. Run the by_query preview again to get a new one."
        )
    return {"success": True, "deleted_count": deleted}


def _token_hash(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


# sources: seed 003's add, search, filters and recall ---------------------------

# Seed 003's memories live in one namespace: an agent's memory is the agent's.
SOURCES_NAMESPACE = "default"
TURNS_MAX = 100
DOCUMENT_MAX = 200_000
LABEL_MAX = 200
PATH_MAX = 1024


def _label(value: Any, field: str, maximum: int = LABEL_MAX) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise ValidationFailed(f"{field} must be a string.")
    text = validation.normalize(value)
    if "\x00" in text:
        raise ValidationFailed(f"{field} must not contain NUL characters.")
    if len(text) > maximum:
        raise ValidationFailed(f"{field} is at most {maximum} characters.")
    return text or None


def add_turns(
    *,
    user_id: uuid.UUID | str,
    tier: str,
    agent_id: uuid.UUID | str | None,
    turns: Any,
    thread_id: Any = None,
    task_id: Any = None,
) -> list[dict[str, Any]]:
    """Store conversation turns, one memory each, in order, all or none.

    A turn is ``{"role", "content", "name"?}``; its author is the name, else
    the role. Turns carry their position and role in metadata, and the
    thread, so that the conversation can be read back in order.
    """
    if not isinstance(turns, list) or not turns:
        raise ValidationFailed("messages must be a non-empty list of {role, content} turns.")
    if len(turns) > TURNS_MAX:
        raise ValidationFailed(f"At most {TURNS_MAX} messages per call; got {len(turns)}.")
    thread = _label(thread_id, "thread_id")
    task = _label(task_id, "task_id")
    items: list[tuple[str, dict[str, Any], str]] = []
    for position, turn in enumerate(turns):
        if not isinstance(turn, dict):
            raise ValidationFailed(f"messages[{position}] must be an object with role and content.")
        role = _label(turn.get("role"), f"messages[{position}].role", 32)
        if not role:
            raise ValidationFailed(f"messages[{position}] needs a role, such as user or assistant.")
        text = validation.text(
            turn.get("content"),
            field=f"messages[{position}].content",
            maximum=validation.CONTENT_MAX,
        )
        author = _label(turn.get("name"), f"messages[{position}].name") or role
        items.append((text, {"role": role, "position": position}, author))
    return store(
        user_id=user_id,
        tier=tier,
        agent_id=agent_id,
        items=[(text, meta) for text, meta, _ in items],
        namespace=SOURCES_NAMESPACE,
        source=[
            Source(kind=SourceKind.CONVERSATION, author=author, thread_id=thread, task_id=task)
            for _, _, author in items
        ],
    )


def add_document(
    *,
    user_id: uuid.UUID | str,
    tier: str,
    agent_id: uuid.UUID | str | None,
    content: Any,
    path: Any,
    author: Any = None,
    task_id: Any = None,
) -> list[dict[str, Any]]:
    """Store a document as chunks cut by its structure and size, all under ``path``."""
    from memories import chunking

    where = _label(path, "path", PATH_MAX)
    if not where:
        raise ValidationFailed("A document needs a path, such as 'docs/handbook.md'.")
    text = validation.text(content, field="content", maximum=DOCUMENT_MAX)
    chunks = chunking.chunk(text)
    source = Source(
        kind=SourceKind.DOCUMENT,
        author=_label(author, "author") or "",
        path=where,
        task_id=_label(task_id, "task_id"),
    )
    return store(
        user_id=user_id,
        tier=tier,
        agent_id=agent_id,
        items=[
            (
                c.text,
                {"heading": c.heading, "chunk": c.position} if c.heading else {"chunk": c.position},
            )
            for c in chunks
        ],
        namespace=SOURCES_NAMESPACE,
        source=source,
    )


def add_note(
    *,
    user_id: uuid.UUID | str,
    tier: str,
    agent_id: uuid.UUID | str | None,
    content: Any,
    author: Any = None,
    thread_id: Any = None,
    task_id: Any = None,
) -> list[dict[str, Any]]:
    text = validation.content(content)
    source = Source(
        kind=SourceKind.NOTE,
        author=_label(author, "author") or "",
        thread_id=_label(thread_id, "thread_id"),
        task_id=_label(task_id, "task_id"),
    )
    return store(
        user_id=user_id,
        tier=tier,
        agent_id=agent_id,
        items=[(text, {})],
        namespace=SOURCES_NAMESPACE,
        source=source,
    )


def source_filters(**values: Any) -> dict[str, str]:
    """Validate memory_search's filters; unset ones are dropped."""
    chosen: dict[str, str] = {}
    for name in SOURCE_FILTERS:
        value = values.get(name)
        if value is None:
            continue
        maximum = PATH_MAX if name == "path" else LABEL_MAX
        clean = _label(value, name, maximum)
        if clean is None:
            raise ValidationFailed(f"{name} must not be empty; leave it out to not filter.")
        if name == "source_kind" and clean not in SourceKind.values:
            raise ValidationFailed("source_kind must be conversation, document or note.")
        chosen[name] = clean
    return chosen


def search_sources(
    *,
    user_id: uuid.UUID | str,
    agent_id: uuid.UUID | str | None,
    query: Any,
    limit: Any = 10,
    threshold: Any = None,
    **filters: Any,
) -> list[dict[str, Any]]:
    """Rank the agent's memories by meaning, with source filters applied before ranking.

    Naming ``task_id`` also searches what the user's other agents filed under
    that task (and only that, as the filter says).
    """
    wanted = source_filters(**filters)
    search = replace(_search(query, SOURCES_NAMESPACE, limit, threshold, None), sources=wanted)
    with tenancy.tenant(
        user_id, agent_id=agent_id, task_id=wanted.get("task_id"), local_settings=SEARCH_SETTINGS
    ):
        found = _nearest(user_id, search)
    return [
        {
            "id": str(memory.id),
            "content": memory.content,
            "similarity": similarity,
            "source_kind": memory.source_kind,
            "author": memory.author,
            "path": memory.path,
            "thread_id": memory.thread_id,
            "task_id": memory.task_id,
            "metadata": memory.metadata,
            "created_at": iso(memory.created_at),
        }
        for memory, similarity in found
    ]


FILTER_VALUES_MAX = 200


def list_source_filters(
    *, user_id: uuid.UUID | str, agent_id: uuid.UUID | str | None
) -> dict[str, list[str]]:
    """Return the source kinds, authors and paths the caller's own memories hold."""
    with tenancy.tenant(user_id, agent_id=agent_id):
        own = Memory.objects.filter(_written_by(agent_id), user_id=user_id)

        def values(column: str) -> list[str]:
            rows = (
                own.exclude(**{column: ""})
                .values_list(column, flat=True)
                .distinct()
                .order_by(column)[:FILTER_VALUES_MAX]
            )
            return list(rows)

        return {
            "source_kinds": values("source_kind"),
            "authors": values("author"),
            "paths": values("path"),
        }


def recall_answer(
    *,
    user_id: uuid.UUID | str,
    agent_id: uuid.UUID | str | None,
    query: Any,
    limit: Any = 10,
    threshold: Any = None,
    **filters: Any,
) -> dict[str, Any]:
    """Answer a question from the agent's memory: a short answer and the ids it rests on."""
    from memories import chat

    found = search_sources(
        user_id=user_id,
        agent_id=agent_id,
        query=query,
        limit=limit,
        threshold=threshold,
        **filters,
    )
    minimum = validation.threshold(threshold, default_threshold())
    return chat.answer(validation.query(query), found, minimum).as_dict()


# shared -----------------------------------------------------------------------


def _embed(embedder: embeddings.Embedder, text: str) -> np.ndarray:
    try:
        return embedder.embed_one(text)
    except RecallError:
        raise
    except Exception:
        logger.exception("embedding failed", extra={"model": embedder.model_id})
        raise EmbeddingUnavailable(
            "The embedding model could not process this request. Try again shortly."
        ) from None


def _embed_query(
    embedder: embeddings.Embedder, text: str, *, use_cache: bool
) -> tuple[np.ndarray, str]:
    """Embed a query through the query cache (memories/embeddings/cache.py)."""
    try:
        return embeddings.get_query_cache().embed(embedder, text, use_cache=use_cache)
    except RecallError:
        raise
    except Exception:
        logger.exception("embedding failed", extra={"model": embedder.model_id})
        raise EmbeddingUnavailable(
            "The embedding model could not process this request. Try again shortly."
        ) from None


def _embed_many(embedder: embeddings.Embedder, texts: list[str]) -> list[np.ndarray]:
    if len(texts) == 1:  # one text goes through the batcher, with concurrent calls
        return [_embed(embedder, texts[0])]
    try:
        return list(embedder.embed(texts))
    except RecallError:
        raise
    except Exception:
        logger.exception("embedding failed", extra={"model": embedder.model_id})
        raise EmbeddingUnavailable(
            "The embedding model could not process this request. Try again shortly."
        ) from None


# namespaces and counts ----------------------------------------------------------


def list_namespaces(*, user_id: uuid.UUID | str) -> list[dict[str, Any]]:
    """Return the user's namespaces with how many memories each holds, by name."""
    with tenancy.tenant(user_id):
        return list(
            Memory.objects.filter(user_id=user_id)
            .values("namespace")
            .annotate(count=Count("id"))
            .order_by("namespace")
        )


@dataclass(frozen=True)
class Quota:
    used: int
    limit: int | None  # None: unlimited

    @property
    def fraction(self) -> float | None:
        return min(1.0, self.used / self.limit) if self.limit else None


def memory_limit(tier: str) -> int | None:
    """Return how many memories a tier may hold, or None for no limit."""
    return settings.FREE_TIER_MAX_MEMORIES if tier == Tier.FREE else None


def memory_quota(*, user_id: uuid.UUID | str, tier: str) -> Quota:
    """Return how many memories the user holds against their tier's limit (tenant path)."""
    with tenancy.tenant(user_id):
        used = Memory.objects.filter(user_id=user_id).count()
    return Quota(used=used, limit=memory_limit(tier))


def count_memories(*, user_ids: Iterable[uuid.UUID | str]) -> int:
    """Return how many memories these users hold together (operator path)."""
    with tenancy.operator():
        return Memory.objects.filter(user_id__in=list(user_ids)).count()


def memories_per_user() -> Coalesce:
    """Return an annotation counting each user's memories, for a queryset of users.

    A correlated subquery, not a JOIN + GROUP BY, so it can sit beside other
    per-user counts without multiplying rows; PostgreSQL evaluates it after
    the page's LIMIT, one index count per row shown.
    """
    return count_per_user(Memory.objects.all())


# re-embedding --------------------------------------------------------------------


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
