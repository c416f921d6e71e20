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
for an operator (re-embedding, counts across users, workers and maintenance)
say "operator path" and run in ``tenancy.operator()``. Embedding happens
outside transactions so that a slow embedding provider never holds a
database connection.
"""

from __future__ import annotations

import hashlib
import json
import logging
import secrets
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import numpy as np
from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.db.models import Count, Max, Min, Q
from django.db.models.functions import Coalesce, Now
from django.utils import timezone

from accounts.tiers import Tier
from memories import embeddings, indexes, jobs, search, validation
from memories.embeddings import cache as query_cache
from memories.indexes import vector_literal
from memories.models import (
    ForgetConfirmation,
    Job,
    JobStatus,
    Memory,
    MemoryHistory,
    Priority,
    SourceKind,
)
from recall import context, errors, process, storable, tenancy
from recall.admin_tools import count_per_user
from recall.db import pooling
from recall.errors import (
    ConfirmationExpired,
    ConfirmationInvalid,
    Conflict,
    EmbeddingUnavailable,
    InternalError,
    NotFound,
    QuotaExceeded,
    RecallError,
    ValidationFailed,
)
from recall.logging import describe_exception
from recall.timestamps import iso

logger = logging.getLogger(__name__)


# remember ---------------------------------------------------------------------


@dataclass(frozen=True)
class Item:
    """One memory a call stores: its normalised content, full metadata and source.

    ``position`` is a conversation message's place in its thread (0 first),
    None for anything else. ``kind``, ``author`` and ``path`` say where it
    came from (seed 003): a note, a conversation turn (authored by the
    speaker's name, else their role) or a document's chunk (under its path).
    """

    content: str
    metadata: dict[str, Any]
    position: int | None = None
    kind: str = SourceKind.NOTE.value
    author: str = ""
    path: str = ""


@dataclass(frozen=True)
class Remembering:
    """A validated call that stores memories: what to store, and how.

    ``remember`` stores it at once or ``enqueue_remember`` queues it (as
    ``as_payload()``) for a worker to store later; seed 003's ``memory_add``
    builds one too, so every write goes through ``store``.
    """

    items: tuple[Item, ...]
    namespace: str
    priority: str
    expires_at: datetime | None
    thread_id: str | None
    # A hash of the arguments as given, to tell a retry from a different call.
    fingerprint: str
    conversation: bool = False
    # A task shared between the user's agents (seed 003), or None.
    task_id: str | None = None

    def as_payload(self) -> dict[str, Any]:
        return {
            "items": [
                [item.content, item.metadata, item.position, item.kind, item.author, item.path]
                for item in self.items
            ],
            "namespace": self.namespace,
            "priority": self.priority,
            "expires_at": self.expires_at.isoformat() if self.expires_at else None,
            "thread_id": self.thread_id,
            "task_id": self.task_id,
            "fingerprint": self.fingerprint,
            "conversation": self.conversation,
        }

    @classmethod
    def from_payload(cls, payload: dict[str, Any]) -> Remembering:
        expires = payload.get("expires_at")
        return cls(
            items=tuple(Item(*entry) for entry in payload["items"]),
            namespace=payload["namespace"],
            priority=payload["priority"],
            expires_at=datetime.fromisoformat(expires) if expires else None,
            thread_id=payload.get("thread_id"),
            task_id=payload.get("task_id"),
            fingerprint=payload["fingerprint"],
            conversation=bool(payload.get("conversation")),
        )

    def shape(self, stored: list[dict[str, Any]]) -> dict[str, Any]:
        """Return what remember answers: one memory's ``{id, deduped}``, or the thread's."""
        if not self.conversation:
            [one] = stored
            return one
        return {"thread_id": self.thread_id, "memories": stored, "count": len(stored)}


def _fingerprint(given: dict[str, Any]) -> str:
    canonical = json.dumps(given, sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.sha256(canonical.encode("utf-8", "surrogatepass")).hexdigest()


def _turns(messages: Any, metadata: dict[str, Any]) -> tuple[Item, ...]:
    """Return a conversation's messages as items: one turn each, in order, in one thread.

    A message's role, position, name and timestamp go into its metadata, on
    top of the call's; its author is its name, else its role.
    """
    return tuple(
        Item(
            text,
            validation.metadata({**metadata, **extra}),
            position,
            kind=SourceKind.CONVERSATION.value,
            author=extra.get("name") or extra["role"],
        )
        for position, (text, extra) in enumerate(validation.messages(messages))
    )


def remembering(
    *,
    content: Any = None,
    messages: Any = None,
    namespace: Any = "default",
    metadata: Any = None,
    priority: Any = None,
    expires_at: Any = None,
    ttl_seconds: Any = None,
    thread_id: Any = None,
) -> Remembering:
    """Validate a remember call in full, writing nothing.

    Either ``content`` (one memory) or ``messages`` (a conversation: one
    memory per message, in order, all in one thread).
    """
    if (content is None) == (messages is None):
        raise ValidationFailed("Pass content (one memory) or messages (a conversation), not both.")
    ns = validation.namespace(namespace)
    level = validation.priority(priority)
    expiry = validation.expiry(expires_at, ttl_seconds)
    thread = validation.label(thread_id, field="thread_id")
    meta = validation.metadata(metadata)
    if content is not None:
        items: tuple[Item, ...] = (Item(validation.content(content), meta),)
    else:
        items = _turns(messages, meta)
    given = {
        "items": [[item.content, item.metadata] for item in items],
        "namespace": ns,
        "priority": level,
        "expires_at": expires_at,
        "ttl_seconds": ttl_seconds,
        "thread_id": thread,
    }
    return Remembering(
        items=items,
        namespace=ns,
        priority=level,
        expires_at=expiry,
        # A conversation always has a thread: the caller's, or a new one.
        thread_id=thread or (uuid.uuid4().hex if messages is not None else None),
        fingerprint=_fingerprint(given),
        conversation=messages is not None,
    )


def remember(
    *,
    user_id: uuid.UUID | str,
    tier: str,
    content: Any = None,
    messages: Any = None,
    namespace: Any = "default",
    metadata: Any = None,
    priority: Any = None,
    expires_at: Any = None,
    ttl_seconds: Any = None,
    thread_id: Any = None,
    background: Any = False,
    idempotency_key: Any = None,
    agent_id: uuid.UUID | str | None = None,
) -> dict[str, Any]:
    """Store a memory (or a conversation), or return the identical one already stored.

    Identical means equal normalised content in the same namespace, written by
    the same agent (or both user-wide), and for a conversation's messages in
    the same thread and position. The unique constraint ``memories_dedup``
    decides it, so concurrent identical calls produce one row; the look-up
    first only saves an embedding. An identical memory that has expired does
    not count: it is replaced.

    With ``background``, the call is validated and queued, and returns at
    once: see ``enqueue_remember``.
    """
    call = remembering(
        content=content,
        messages=messages,
        namespace=namespace,
        metadata=metadata,
        priority=priority,
        expires_at=expires_at,
        ttl_seconds=ttl_seconds,
        thread_id=thread_id,
    )
    if validation.flag(background, field="async"):
        return enqueue_remember(
            user_id=user_id,
            agent_id=agent_id,
            tier=tier,
            call=call,
            idempotency_key=idempotency_key,
        )
    if idempotency_key is not None:
        raise ValidationFailed(
            "idempotency_key applies to async calls; a synchronous remember is already "
            "idempotent (identical content is stored once)."
        )
    return call.shape(store(user_id=user_id, agent_id=agent_id, tier=tier, call=call))


# Where a memory sits for deduplication, within its writer, namespace, thread
# and task (memories_dedup's other columns).
Place = tuple[int | None, str, str]  # position, path, content hash


def store(
    *,
    user_id: uuid.UUID | str,
    tier: str,
    call: Remembering,
    agent_id: uuid.UUID | str | None = None,
    ids: list[uuid.UUID] | None = None,
    finish: Callable[[list[dict[str, Any]]], None] | None = None,
) -> list[dict[str, Any]]:
    """Store a validated call's items in one transaction: all of them, or none.

    Returns ``{id, deduped}`` per item, in order. ``ids`` are the ids to give
    new memories (a queued job announced them); ``finish`` runs inside the
    writing transaction with the results, so a job is settled atomically with
    what it stored.
    """
    places: list[Place] = [
        (item.position, item.path, validation.content_hash(item.content)) for item in call.items
    ]
    with tenancy.tenant(user_id, agent_id=agent_id):
        existing = _ids_by_place(user_id, agent_id, call, places)
    fresh = sorted({i for i, place in enumerate(places) if place not in existing})
    embedder = embeddings.get_embedder()
    vectors = _embed_many(embedder, [call.items[i].content for i in fresh]) if fresh else []
    vector_for = dict(zip(fresh, vectors, strict=True))

    results: list[dict[str, Any]] = []
    with tenancy.tenant(user_id, agent_id=agent_id):
        if tier == Tier.FREE and fresh:
            _check_quota(user_id, adding=len(fresh))
        stored: dict[Place, uuid.UUID] = {}
        for i, item in enumerate(call.items):
            place = places[i]
            found = stored.get(place) or existing.get(place)
            if found is None and i in vector_for:
                new_id = ids[i] if ids else uuid.uuid4()
                found, inserted = _insert_or_find(
                    user_id, agent_id, call, item, place, new_id, vector_for[i]
                )
                if inserted:
                    stored[place] = found
                results.append({"id": str(found), "deduped": not inserted})
                continue
            results.append({"id": str(found), "deduped": True})
        if finish is not None:
            finish(results)
    return results


def _insert_or_find(
    user_id: uuid.UUID | str,
    agent_id: uuid.UUID | str | None,
    call: Remembering,
    item: Item,
    place: Place,
    memory_id: uuid.UUID,
    vector: np.ndarray,
) -> tuple[uuid.UUID, bool]:
    """Insert one memory; return its id and True, or the id already in its place and False."""
    row = _insert(user_id, agent_id, call, item, place, memory_id, vector)
    if row is not None:
        return row, True
    # A concurrent call stored the same content first, or an expired copy
    # still holds the place (live() skips it): that one is deleted, and this
    # memory takes its place.
    again = _ids_by_place(user_id, agent_id, call, [place]).get(place)
    if again is None:
        _drop_expired(user_id, agent_id, call, place)
        row = _insert(user_id, agent_id, call, item, place, memory_id, vector)
        if row is not None:
            return row, True
        again = _ids_by_place(user_id, agent_id, call, [place])[place]
    return again, False


def _insert(
    user_id: uuid.UUID | str,
    agent_id: uuid.UUID | str | None,
    call: Remembering,
    item: Item,
    place: Place,
    memory_id: uuid.UUID,
    vector: np.ndarray,
) -> uuid.UUID | None:
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO memories (id, user_id, agent_id, namespace, source_kind, author, path,"
            " thread_id, position, task_id, content, content_hash, embedding, embedding_model,"
            " metadata, priority, expires_at)"
            " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s::vector, %s, %s::jsonb,"
            " %s, %s)"
            " ON CONFLICT ON CONSTRAINT memories_dedup DO NOTHING RETURNING id",
            [
                memory_id,
                str(user_id),
                str(agent_id) if agent_id else None,
                call.namespace,
                item.kind,
                item.author,
                item.path,
                call.thread_id,
                item.position,
                call.task_id,
                item.content,
                place[2],
                vector_literal(vector),
                embeddings.get_embedder().model_id,
                json.dumps(item.metadata),
                call.priority,
                call.expires_at,
            ],
        )
        row = cursor.fetchone()
    return row[0] if row else None


def _ids_by_place(
    user_id: uuid.UUID | str,
    agent_id: uuid.UUID | str | None,
    call: Remembering,
    places: list[Place],
) -> dict[Place, uuid.UUID]:
    """Return the live memories already holding these places (memories_dedup's columns).

    A task-shared memory of another agent is visible to an agent, but it is
    not this writer's copy: ``_written_by`` leaves it out.
    """
    rows = (
        Memory.objects.live()
        .filter(
            _written_by(agent_id),
            user_id=user_id,
            namespace=call.namespace,
            thread_id=call.thread_id,
            task_id=call.task_id,
            content_hash__in={digest for _, _, digest in places},
        )
        .values_list("position", "path", "content_hash", "id")
    )
    wanted = set(places)
    return {
        (pos, path, digest): id for pos, path, digest, id in rows if (pos, path, digest) in wanted
    }


def _holder(current: Mapping[str, Any], digest: str) -> uuid.UUID | None:
    """Return the live memory holding ``current``'s place with other content, if any."""
    return (
        Memory.objects.live()
        .filter(
            _written_by(current["agent_id"]),
            user_id=current["user_id"],
            namespace=current["namespace"],
            thread_id=current["thread_id"],
            position=current["position"],
            task_id=current["task_id"],
            path=current["path"],
            content_hash=digest,
        )
        .values_list("id", flat=True)
        .first()
    )


def _drop_expired(
    user_id: uuid.UUID | str, agent_id: uuid.UUID | str | None, call: Remembering, place: Place
) -> None:
    Memory.objects.filter(
        _written_by(agent_id),
        user_id=user_id,
        namespace=call.namespace,
        thread_id=call.thread_id,
        task_id=call.task_id,
        position=place[0],
        path=place[1],
        content_hash=place[2],
        expires_at__lte=Now(),
    ).delete()


def _written_by(agent_id: uuid.UUID | str | None) -> Q:
    """Match the memories ``agent_id`` wrote itself, or with None the user-wide ones."""
    return Q(agent_id__isnull=True) if agent_id is None else Q(agent_id=agent_id)


def _check_quota(user_id: uuid.UUID | str, adding: int = 1, pending: bool = False) -> None:
    """Refuse ``adding`` memories that would take a free user past the quota.

    With ``pending``, adds already queued count too. The quota is the user's,
    whichever agent writes, and an agent's own view holds only part of the
    user's memories and jobs: database functions count them all, and return
    only numbers (migration 0005). The advisory lock serialises this user's
    free-tier writes so that two concurrent calls at 99 memories cannot both
    pass; the count runs as a statement of its own after it (with a snapshot
    taken once the lock is held), sent in the same round trip.
    """
    uid = str(user_id)
    counted = (
        "SELECT recall_tenant_memory_count() + recall_tenant_queued_items()"
        if pending
        else "SELECT recall_tenant_memory_count()"
    )
    with connection.cursor() as lock, connection.cursor() as count:
        with tenancy.pipeline(lock):
            lock.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", [uid])
            count.execute(counted)
        used = int(count.fetchone()[0])
    limit = settings.FREE_TIER_MAX_MEMORIES
    if used + adding > limit:
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
    mode: Any = None,
    metadata_filter: Any = None,
    priority: Any = None,
    created_after: Any = None,
    created_before: Any = None,
) -> list[dict[str, Any]]:
    """Return the namespace's memories that best match ``query``, best first.

    How they are ranked, filtered and cut by the threshold, and how priority
    breaks ties, is memories/search.py's.
    """
    found, _ = search_memories(
        user_id=user_id,
        agent_id=agent_id,
        query=query,
        namespace=namespace,
        limit=limit,
        threshold=threshold,
        mode=mode,
        metadata_filter=metadata_filter,
        priority=priority,
        created_after=created_after,
        created_before=created_before,
    )
    return found


def search_memories(
    *,
    user_id: uuid.UUID | str,
    agent_id: uuid.UUID | str | None = None,
    use_cache: bool = True,
    **arguments: Any,
) -> tuple[list[dict[str, Any]], str]:
    """``recall``, also saying where the query's vector came from (cache or model).

    ``use_cache=False`` embeds the query afresh whatever the cache holds.
    """
    wanted = search.prepare(
        cache_scope=query_cache.scope(user_id, agent_id), use_cache=use_cache, **arguments
    )
    opening = search.transaction_settings(wanted, agent=agent_id is not None)
    with tenancy.tenant(user_id, agent_id=agent_id, local_settings=opening):
        found = search.run(user_id, wanted, agent_id=agent_id)
    return [_found(hit) for hit in found], wanted.vector_source


def _found(hit: search.Found) -> dict[str, Any]:
    memory = hit.memory
    return {
        "id": str(memory.id),
        "content": memory.content,
        "similarity": hit.similarity,
        "score": hit.score,
        "metadata": memory.metadata,
        "namespace": memory.namespace,
        "priority": memory.priority,
        "created_at": iso(memory.created_at),
        "expires_at": iso(memory.expires_at) if memory.expires_at else None,
    }


default_threshold = search.default_threshold
SOURCE_FILTERS = search.SOURCE_FILTERS


# list_memories ----------------------------------------------------------------


def list_memories(
    *,
    user_id: uuid.UUID | str,
    agent_id: uuid.UUID | str | None = None,
    namespace: Any = "default",
    limit: Any = 20,
    offset: Any = 0,
    order: Any = "created_at",
    priority: Any = None,
    thread_id: Any = None,
) -> list[dict[str, Any]]:
    """Return a page of the namespace's memories, newest first by ``order``.

    With ``thread_id``, only that conversation's messages, in the order they
    were said (``order`` does not apply): read back in full, they are the
    conversation.
    """
    ns = validation.namespace(namespace)
    count = validation.integer(
        limit, field="limit", low=1, high=validation.LIST_LIMIT_MAX, default=20
    )
    skip = validation.integer(offset, field="offset", low=0, high=validation.OFFSET_MAX, default=0)
    column = validation.order(order)
    levels = validation.priorities(priority)
    thread = validation.label(thread_id, field="thread_id")
    with tenancy.tenant(user_id, agent_id=agent_id):
        rows = Memory.objects.live().filter(user_id=user_id, namespace=ns)
        if levels:
            rows = rows.filter(priority__in=levels)
        if thread is not None:
            rows = rows.filter(thread_id=thread).order_by("position", "created_at", "id")
        else:
            rows = rows.order_by(f"-{column}", "-id")
        page = list(rows.values(*_LISTED)[skip : skip + count])
    return [_listed(row) for row in page]


_LISTED = (
    "id",
    "content",
    "namespace",
    "thread_id",
    "position",
    "metadata",
    "priority",
    "content_hash",
    "version",
    "created_at",
    "updated_at",
    "expires_at",
)


def _listed(row: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": str(row["id"]),
        "content": row["content"],
        "namespace": row["namespace"],
        "thread_id": row["thread_id"],
        "position": row["position"],
        "metadata": row["metadata"],
        "priority": row["priority"],
        "hash": row["content_hash"],
        "version": row["version"],
        "created_at": iso(row["created_at"]),
        "updated_at": iso(row["updated_at"]),
        "expires_at": iso(row["expires_at"]) if row["expires_at"] else None,
    }


def memory_agents(*, user_id: uuid.UUID | str, ids: Iterable[str]) -> dict[str, str | None]:
    """Return which agent wrote each of the user's memories ``ids`` (None: no agent)."""
    wanted = [uuid.UUID(str(memory_id)) for memory_id in ids]
    with tenancy.tenant(user_id):
        rows = Memory.objects.filter(user_id=user_id, id__in=wanted).values_list("id", "agent_id")
        return {str(memory_id): str(agent) if agent else None for memory_id, agent in rows}


# update_memory ----------------------------------------------------------------


def update_memory(
    *,
    user_id: uuid.UUID | str,
    agent_id: uuid.UUID | str | None = None,
    id: Any,
    content: Any = None,
    metadata: Any = None,
    priority: Any = None,
) -> dict[str, Any]:
    """Replace a memory's content (re-embedding it), its metadata and/or its priority.

    Each change that alters any of them is a new version in the memory's history.
    """
    memory_id = validation.memory_id(id)
    if content is None and metadata is None and priority is None:
        raise ValidationFailed("Pass content, metadata or priority to update a memory.")
    text = validation.content(content) if content is not None else None
    meta = validation.metadata(metadata) if metadata is not None else None
    level = validation.priority(priority) if priority is not None else None

    with tenancy.tenant(user_id, agent_id=agent_id):
        current = (
            Memory.objects.live()
            .filter(id=memory_id, user_id=user_id)
            .values(
                "user_id",
                "agent_id",
                "namespace",
                "thread_id",
                "position",
                "task_id",
                "path",
                "content_hash",
            )
            .first()
        )
    if current is None:
        raise NotFound(f"No memory with id {memory_id}.")

    changes: dict[str, Any] = {}
    if meta is not None:
        changes["metadata"] = meta
    if level is not None:
        changes["priority"] = level
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
                updated = (
                    Memory.objects.live().filter(id=memory_id, user_id=user_id).update(**changes)
                )
        except IntegrityError:
            other = _holder(current, changes["content_hash"])
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
    *,
    user_id: uuid.UUID | str,
    agent_id: uuid.UUID | str | None = None,
    id: Any,
    purge: Any = False,
) -> dict[str, Any]:
    """Delete one memory. Its history stays for HISTORY_RETENTION_DAYS, unless ``purge``."""
    memory_id = validation.memory_id(id)
    wipe = validation.flag(purge, field="purge")
    with tenancy.tenant(user_id, agent_id=agent_id):
        deleted, _ = Memory.objects.filter(id=memory_id, user_id=user_id).delete()
        if deleted and wipe:
            _purge_history([memory_id])
    if not deleted:
        raise NotFound(f"No memory with id {memory_id}.")
    return {"success": True, "purged": True} if wipe else {"success": True}


def forget_preview(
    *,
    user_id: uuid.UUID | str,
    agent_id: uuid.UUID | str | None = None,
    query: Any,
    namespace: Any = "default",
    limit: Any = 10,
    threshold: Any = None,
    metadata_filter: Any = None,
    created_after: Any = None,
    created_before: Any = None,
    purge: Any = False,
) -> dict[str, Any]:
    """Find what a query would delete and return a token that deletes exactly that.

    The matches are what recall would return for the same arguments, in the
    server's search mode. Nothing is deleted here. With no matches there is
    nothing to confirm, so no token is issued. ``purge`` makes the
    confirmation remove the deleted memories' history too.
    """
    prepared = search.prepare(
        cache_scope=query_cache.scope(user_id, agent_id),
        query=query,
        namespace=namespace,
        limit=limit,
        threshold=threshold,
        metadata_filter=metadata_filter,
        created_after=created_after,
        created_before=created_before,
    )
    wipe = validation.flag(purge, field="purge")
    token = secrets.token_urlsafe(32)
    expires_at = timezone.now() + timedelta(seconds=settings.FORGET_TOKEN_TTL_SECONDS)
    opening = search.transaction_settings(prepared, agent=agent_id is not None)
    with tenancy.tenant(user_id, agent_id=agent_id, local_settings=opening):
        found = search.run(user_id, prepared, agent_id=agent_id)
        ForgetConfirmation.objects.filter(user_id=user_id, expires_at__lt=timezone.now()).delete()
        if found:
            ForgetConfirmation.objects.create(
                token_hash=_token_hash(token),
                user_id=user_id,
                agent_id=agent_id,
                memory_ids=[hit.memory.id for hit in found],
                purge=wipe,
                expires_at=expires_at,
            )
    matches = [
        {
            "id": str(hit.memory.id),
            "content": hit.memory.content,
            "similarity": hit.similarity,
            "score": hit.score,
        }
        for hit in found
    ]
    return {
        "preview": True,
        "matches": matches,
        "total_matches": len(matches),
        "confirmation_token": token if found else None,
        "expires_at": iso(expires_at) if found else None,
    }


def forget_all_preview(
    *,
    user_id: uuid.UUID | str,
    agent_id: uuid.UUID | str | None = None,
    namespace: Any,
    purge: Any = False,
) -> dict[str, Any]:
    """Count a namespace's memories and return a token that deletes them, and only them.

    The namespace must be named: there is no default for deleting everything.
    Confirming deletes the memories the namespace held at this preview;
    memories stored after it are kept.
    """
    if namespace is None:
        raise ValidationFailed('mode "all" needs the namespace to empty; it has no default.')
    ns = validation.namespace(namespace)
    wipe = validation.flag(purge, field="purge")
    token = secrets.token_urlsafe(32)
    expires_at = timezone.now() + timedelta(seconds=settings.FORGET_TOKEN_TTL_SECONDS)
    with tenancy.tenant(user_id, agent_id=agent_id):
        cutoff = _now()
        total = Memory.objects.live().filter(user_id=user_id, namespace=ns).count()
        ForgetConfirmation.objects.filter(user_id=user_id, expires_at__lt=timezone.now()).delete()
        if total:
            ForgetConfirmation.objects.create(
                token_hash=_token_hash(token),
                user_id=user_id,
                agent_id=agent_id,
                memory_ids=[],
                namespace=ns,
                cutoff=cutoff,
                purge=wipe,
                expires_at=expires_at,
            )
    return {
        "preview": True,
        "namespace": ns,
        "total_matches": total,
        "confirmation_token": token if total else None,
        "expires_at": iso(expires_at) if total else None,
    }


def forget_confirm(
    *,
    user_id: uuid.UUID | str,
    agent_id: uuid.UUID | str | None = None,
    confirmation_token: Any,
    purge: Any = False,
) -> dict[str, Any]:
    """Delete exactly what a preview listed. The token works once, for 5 minutes.

    A token that is unknown, already used or another user's is the same
    ``confirmation_invalid``: row-level security hides other users' tokens.
    History is purged if the preview or this call asks for it.
    """
    if not isinstance(confirmation_token, str) or not 0 < len(confirmation_token) <= 256:
        raise ValidationFailed("confirmation_token must be the token a preview returned.")
    wipe = validation.flag(purge, field="purge")
    with tenancy.tenant(user_id, agent_id=agent_id):
        # Deleting the confirmation first claims it: of two concurrent
        # confirmations, the second finds nothing.
        with connection.cursor() as cursor:
            # The user as well as the policy: a distributed database routes
            # on the statement's own user_id (docs/scale-out.md).
            cursor.execute(
                "DELETE FROM forget_confirmations WHERE token_hash = %s AND user_id = %s"
                " RETURNING memory_ids, namespace, cutoff, purge,"
                " expires_at <= statement_timestamp()",
                [_token_hash(confirmation_token), str(user_id)],
            )
            claimed = cursor.fetchone()
        if claimed is None:
            raise ConfirmationInvalid(
                "This confirmation token is not valid: it may have been used already. "
                "Run the forget preview again to get a new one."
            )
        memory_ids, namespace, cutoff, preview_purge, expired = claimed
        deleted = 0
        if not expired:
            if namespace is not None:
                deleted = _delete_namespace(user_id, namespace, cutoff, wipe or preview_purge)
            else:
                deleted = _delete_ids(user_id, memory_ids, wipe or preview_purge)
    if expired:
        raise ConfirmationExpired(
            "This confirmation token has expired. Run the preview again to get a new one."
        )
    done = {"success": True, "deleted_count": deleted}
    return {**done, "purged": True} if wipe or preview_purge else done


def forget_namespace(
    *,
    user_id: uuid.UUID | str,
    agent_id: uuid.UUID | str | None = None,
    namespace: Any = "default",
    purge: Any = False,
) -> dict[str, Any]:
    """Delete every memory in one namespace of one user, in one call.

    Only seed 001's ``delete_all_memories`` uses this, because that tool's
    contract is one call; ``forget(mode="all")`` previews and confirms.
    """
    ns = validation.namespace(namespace)
    wipe = validation.flag(purge, field="purge")
    with tenancy.tenant(user_id, agent_id=agent_id):
        deleted = _delete_namespace(user_id, ns, None, wipe)
    return {"deleted_count": deleted, "namespace": ns, "purged": wipe}


def _delete_ids(user_id: uuid.UUID | str, memory_ids: list[uuid.UUID], purge: bool) -> int:
    # RETURNING rather than Django's delete(), to purge exactly what went.
    with connection.cursor() as cursor:
        cursor.execute(
            "DELETE FROM memories WHERE user_id = %s AND id = ANY(%s) RETURNING id",
            [str(user_id), list(memory_ids)],
        )
        gone = [row[0] for row in cursor.fetchall()]
    if purge and gone:
        _purge_history(gone)
    return len(gone)


def _delete_namespace(
    user_id: uuid.UUID | str, namespace: str, cutoff: datetime | None, purge: bool
) -> int:
    """Delete one user's memories in one namespace (created up to ``cutoff``)."""
    # Both conditions are spelled out here, and row-level security adds the
    # user's own on top: nothing outside this user and namespace can match.
    sql = "DELETE FROM memories WHERE user_id = %s AND namespace = %s"
    params: list[Any] = [str(user_id), namespace]
    if cutoff is not None:
        sql += " AND created_at <= %s"
        params.append(cutoff)
    with connection.cursor() as cursor:
        cursor.execute(sql + " RETURNING id", params)
        gone = [row[0] for row in cursor.fetchall()]
    if purge and gone:
        _purge_history(gone)
    return len(gone)


def _purge_history(memory_ids: list[uuid.UUID]) -> int:
    """Remove the history of memories deleted in this transaction (tenant path)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT recall_purge_history(%s::uuid[])", [list(memory_ids)])
        (purged,) = cursor.fetchone()
    return int(purged)


def _now() -> datetime:
    """Return the transaction's own clock, the one created_at and expiry use."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement_timestamp()")
        (moment,) = cursor.fetchone()
    return moment


def _token_hash(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


# history ----------------------------------------------------------------------


def memory_history(
    *, user_id: uuid.UUID | str, agent_id: uuid.UUID | str | None = None, id: Any
) -> list[dict[str, Any]]:
    """Return every recorded version of a memory, oldest first.

    A deleted memory's history stays readable until the retention purge (or
    ``forget(purge=true)``) removes it; its last version is the deletion. An
    agent reads only its own memories' history, as it reads only its own
    memories (row-level security).
    """
    memory_id = validation.memory_id(id)
    with tenancy.tenant(user_id, agent_id=agent_id):
        rows = list(
            MemoryHistory.objects.filter(user_id=user_id, memory_id=memory_id)
            .order_by("version")
            .values(
                "version",
                "action",
                "namespace",
                "content",
                "metadata",
                "priority",
                "expires_at",
                "client",
                "api_key_id",
                "recorded_at",
            )
        )
    if not rows:
        raise NotFound(f"No memory with id {memory_id}, and no history of one.")
    return [_version(row) for row in rows]


def _version(row: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "version": row["version"],
        "action": row["action"],
        "content": row["content"],
        "metadata": row["metadata"],
        "namespace": row["namespace"],
        "priority": row["priority"],
        "expires_at": iso(row["expires_at"]) if row["expires_at"] else None,
        "timestamp": iso(row["recorded_at"]),
        "client": row["client"],
        "api_key_id": str(row["api_key_id"]) if row["api_key_id"] else None,
    }


def erase_history(*, user_id: uuid.UUID | str, id: Any) -> int:
    """Erase a deleted memory's history now, rather than at the end of its retention.

    A live memory's history cannot be erased (delete it with purge instead).
    """
    memory_id = validation.memory_id(id)
    with tenancy.tenant(user_id):
        if Memory.objects.filter(id=memory_id, user_id=user_id).exists():
            raise Conflict(
                "This memory still exists; forget it with purge to erase it and its history."
            )
        erased = _purge_history([memory_id])
    if not erased:
        raise NotFound(f"No history of a memory with id {memory_id}.")
    return erased


def recent_changes(*, user_id: uuid.UUID | str, limit: int = 50) -> list[dict[str, Any]]:
    """Return the user's latest changes to any memory, newest first (the dashboard's feed)."""
    with tenancy.tenant(user_id):
        rows = list(
            MemoryHistory.objects.filter(user_id=user_id)
            .order_by("-recorded_at", "-id")
            .values(
                "memory_id",
                "version",
                "action",
                "namespace",
                "content",
                "metadata",
                "priority",
                "expires_at",
                "client",
                "api_key_id",
                "recorded_at",
            )[:limit]
        )
    return [{"memory_id": str(row["memory_id"]), **_version(row)} for row in rows]


# background adds --------------------------------------------------------------

PENDING = (JobStatus.QUEUED, JobStatus.RUNNING)


def enqueue_remember(
    *,
    user_id: uuid.UUID | str,
    agent_id: uuid.UUID | str | None = None,
    tier: str,
    call: Remembering,
    idempotency_key: Any = None,
) -> dict[str, Any]:
    """Queue a validated remember call for a worker and return at once.

    The quota is checked now, counting adds already queued, so a caller over
    it hears so at once. The ids the new memories will get are chosen now and
    returned; a memory that turns out to be stored already keeps its own id,
    which ``job_status`` reports. The same ``idempotency_key`` returns the
    first job, whatever became of it; with another request it is a conflict.
    """
    key = validation.idempotency_key(idempotency_key)
    fingerprint = call.fingerprint
    who = context.actor.get()
    job_id = uuid.uuid4()
    ids = [uuid.uuid4() for _ in call.items]
    # The tier travels with the job: the quota was judged by it here.
    payload = {**call.as_payload(), "ids": [str(i) for i in ids], "tier": tier}
    with tenancy.tenant(user_id, agent_id=agent_id):
        if key is not None:
            first = _job_by_key(user_id, agent_id, key)
            if first is not None:
                return _replay(first, fingerprint)
        if tier == Tier.FREE:
            _check_quota(user_id, adding=len(call.items), pending=True)
        with connection.cursor() as cursor:
            # One statement: the job, and a wake-up for every process's workers
            # (delivered when the transaction commits).
            cursor.execute(
                "WITH job AS ("
                " INSERT INTO memory_jobs (id, user_id, agent_id, kind, status, idempotency_key,"
                " request_hash, payload, items, attempts, client, api_key_id, error_message)"
                " VALUES (%s, %s, %s, 'remember', 'queued', %s, %s, %s::jsonb, %s, 0, %s, %s, '')"
                " ON CONFLICT (user_id, agent_id, idempotency_key)"
                " WHERE idempotency_key IS NOT NULL DO NOTHING RETURNING id)"
                " SELECT id, pg_notify(%s, '') FROM job",
                [
                    job_id,
                    str(user_id),
                    str(agent_id) if agent_id else None,
                    key,
                    fingerprint,
                    json.dumps(payload),
                    len(call.items),
                    who.client if who else "",
                    who.api_key_id if who else None,
                    jobs.CHANNEL,
                ],
            )
            inserted = cursor.fetchone()
        if inserted is None:  # a concurrent retry with the same key got there first
            first = _job_by_key(user_id, agent_id, key or "")
            if first is None:
                raise InternalError("The queued job could not be found. Try again.")
            return _replay(first, fingerprint)
    jobs.wake()
    return {
        "job_id": str(job_id),
        "status": JobStatus.QUEUED.value,
        "memory_ids": [str(i) for i in ids],
    }


def _job_by_key(user_id: uuid.UUID | str, agent_id: uuid.UUID | str | None, key: str) -> Job | None:
    return Job.objects.filter(_written_by(agent_id), user_id=user_id, idempotency_key=key).first()


def _replay(job: Job, fingerprint: str) -> dict[str, Any]:
    if job.request_hash != fingerprint:
        raise Conflict(
            "This idempotency_key was already used for a different request. "
            "Use a new key for a new request.",
            job_id=str(job.id),
        )
    return {"job_id": str(job.id), "status": job.status, "memory_ids": _announced(job)}


def _announced(job: Job) -> list[str]:
    if job.result:
        return [item["id"] for item in job.result.get("memories", [])]
    return list((job.payload or {}).get("ids", []))


def job_status(
    *, user_id: uuid.UUID | str, agent_id: uuid.UUID | str | None = None, job_id: Any
) -> dict[str, Any]:
    """Report a background add: queued, running, done (with ids) or failed (with the code)."""
    try:
        wanted = uuid.UUID(job_id) if isinstance(job_id, str) else None
    except ValueError:
        wanted = None
    if wanted is None:
        raise ValidationFailed("job_id must be the job id remember returned (a UUID string).")
    with tenancy.tenant(user_id, agent_id=agent_id):
        job = Job.objects.filter(user_id=user_id, id=wanted).first()
    if job is None:
        raise NotFound(f"No job with id {wanted}.")
    report: dict[str, Any] = {
        "job_id": str(job.id),
        "status": job.status,
        "created_at": iso(job.created_at),
        "attempts": job.attempts,
    }
    if job.started_at:
        report["started_at"] = iso(job.started_at)
    if job.finished_at:
        report["finished_at"] = iso(job.finished_at)
    if job.status == JobStatus.DONE and job.result:
        report.update(job.result)
    elif job.status == JobStatus.FAILED:
        report["error"] = {"code": job.error_code, "message": job.error_message}
    else:
        report["memory_ids"] = _announced(job)
    return report


def run_next_job() -> bool:
    """Take the next due job, run it, and settle it. Return False when none is due.

    Taking a job is one statement on the operator path (workers serve every
    tenant): the oldest due job, or a running one whose worker's lease ran
    out, locked with SKIP LOCKED so concurrent workers each take another.
    The job then runs as its owner (and agent), through ``store``, which settles it in
    the same transaction that writes the memories. A job that fails for a
    reason a retry cannot fix fails at once; one that hits a passing problem
    (the embedder, the database) is retried with back-off, up to
    ``JOB_MAX_ATTEMPTS`` times.
    """
    with context.acting_as("worker"), tenancy.operator(), connection.cursor() as cursor:
        cursor.execute(
            "UPDATE memory_jobs SET status = 'running', attempts = attempts + 1,"
            " started_at = statement_timestamp(),"
            " lease_until = statement_timestamp() + make_interval(secs => %s)"
            " WHERE id = (SELECT id FROM memory_jobs"
            "   WHERE (status = 'queued' AND run_after <= statement_timestamp())"
            "      OR (status = 'running' AND lease_until < statement_timestamp())"
            "   ORDER BY run_after LIMIT 1 FOR UPDATE SKIP LOCKED)"
            " RETURNING id, user_id, agent_id, payload, attempts, client, api_key_id",
            [settings.JOB_LEASE_SECONDS],
        )
        taken = cursor.fetchone()
    if taken is None:
        return False
    job_id, user_id, agent_id, payload, attempts, client, api_key_id = taken
    if isinstance(payload, str):  # Django has psycopg hand jsonb over as text
        payload = json.loads(payload)
    with context.acting_as(client or "worker", api_key_id):
        _run_job(job_id, user_id, agent_id, payload, attempts)
    return True


def _run_job(
    job_id: uuid.UUID,
    user_id: uuid.UUID,
    agent_id: uuid.UUID | None,
    payload: dict[str, Any],
    attempts: int,
) -> None:
    def settle(results: list[dict[str, Any]]) -> None:
        Job.objects.filter(id=job_id, user_id=user_id).update(
            status=JobStatus.DONE,
            payload=None,
            result={"memories": results, "memory_ids": [r["id"] for r in results]},
            finished_at=Now(),
            lease_until=None,
        )

    try:
        call = Remembering.from_payload(payload)
        ids = [uuid.UUID(i) for i in payload.get("ids", [])] or None
        store(
            user_id=user_id,
            agent_id=agent_id,
            tier=payload["tier"],
            call=call,
            ids=ids,
            finish=settle,
        )
    except (EmbeddingUnavailable, InternalError) as error:
        _retry_or_fail(job_id, user_id, attempts, error)
    except RecallError as error:
        _fail(job_id, user_id, error)
    except Exception as exc:
        if errors.from_exception(exc).code == errors.Unavailable.code:
            # The database is away: the worker backs off, and the job, still
            # running under its lease, is taken again when that runs out.
            raise
        logger.error("job failed", extra={"job_id": str(job_id), **describe_exception(exc)})
        _retry_or_fail(
            job_id, user_id, attempts, InternalError("Storing this memory failed on our side.")
        )


def _retry_or_fail(
    job_id: uuid.UUID, user_id: uuid.UUID, attempts: int, error: RecallError
) -> None:
    if attempts >= settings.JOB_MAX_ATTEMPTS:
        _fail(job_id, user_id, error)
        return
    backoff = settings.JOB_POLL_SECONDS * 2**attempts
    with tenancy.operator():
        Job.objects.filter(id=job_id).update(
            status=JobStatus.QUEUED,
            run_after=Now() + timedelta(seconds=backoff),
            lease_until=None,
        )


def _fail(job_id: uuid.UUID, user_id: uuid.UUID, error: RecallError) -> None:
    # The payload goes: a failed job keeps its outcome, never the content.
    with tenancy.operator():
        Job.objects.filter(id=job_id).update(
            status=JobStatus.FAILED,
            payload=None,
            error_code=error.code,
            error_message=error.message[:500],
            finished_at=Now(),
            lease_until=None,
        )


def queue_depth() -> dict[str, Any]:
    """Return how many jobs wait and how long the oldest has waited (operator path)."""
    with tenancy.operator():
        waiting = Job.objects.filter(status__in=PENDING)
        depth = waiting.count()
        oldest = waiting.order_by("created_at").values_list("created_at", flat=True).first()
    age = (timezone.now() - oldest).total_seconds() if oldest else 0.0
    return {"depth": depth, "oldest_seconds": round(age, 1)}


# maintenance ------------------------------------------------------------------


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
            expired = _in_batches(
                "DELETE FROM memories WHERE id IN (SELECT id FROM memories"
                " WHERE expires_at <= %s LIMIT %s)",
                [moment],
            )
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
                [moment],
            )
    return CleanUp(expired, history, finished, confirmations)


def _in_batches(sql: str, params: list[Any]) -> int:
    total = 0
    while True:
        with tenancy.operator(), connection.cursor() as cursor:
            cursor.execute(sql, [*params, CLEAN_UP_BATCH])
            done = cursor.rowcount
        total += done
        if done < CLEAN_UP_BATCH:
            return total


# stats and health -------------------------------------------------------------


def memory_stats(
    *,
    user_id: uuid.UUID | str,
    agent_id: uuid.UUID | str | None = None,
    api_key_id: uuid.UUID | str | None = None,
) -> dict[str, Any]:
    """Return what the caller holds and how the server serves them.

    Memories per namespace with the oldest and newest, history rows, the
    caller's background adds by status, the query cache's counters (this
    process's), and the caller's own p50/p95 over its latest 1,000 calls
    (from usage events, which land a moment after each call).
    """
    from billing import services as billing_services

    with tenancy.tenant(user_id, agent_id=agent_id):
        namespaces = list(
            Memory.objects.live()
            .filter(user_id=user_id)
            .values("namespace")
            .annotate(count=Count("id"), oldest=Min("created_at"), newest=Max("created_at"))
            .order_by("namespace")
        )
        history_rows = MemoryHistory.objects.filter(user_id=user_id).count()
        by_status = dict(
            Job.objects.filter(user_id=user_id)
            .values_list("status")
            .annotate(n=Count("id"))
            .values_list("status", "n")
        )
    latency = billing_services.recent_latency(
        user_id=user_id, agent_id=agent_id, api_key_id=api_key_id
    )
    return {
        "memories": sum(row["count"] for row in namespaces),
        "namespaces": [
            {
                "namespace": row["namespace"],
                "count": row["count"],
                "oldest": iso(row["oldest"]),
                "newest": iso(row["newest"]),
            }
            for row in namespaces
        ],
        "history_rows": history_rows,
        "jobs": {status.value: by_status.get(status.value, 0) for status in JobStatus},
        "cache": cache_stats(user_id=user_id, agent_id=agent_id),
        "latency": {
            "calls": latency.calls,
            "p50_ms": latency.p50_ms,
            "p95_ms": latency.p95_ms,
        },
    }


def cache_stats(
    *, user_id: uuid.UUID | str, agent_id: uuid.UUID | str | None = None
) -> dict[str, Any]:
    """Return the caller's share of the query cache in this process: its entries, its lookups."""
    stats = embeddings.get_query_cache().stats(query_cache.scope(user_id, agent_id))
    return {
        "hits": stats.hits,
        "shared_hits": stats.shared_hits,
        "misses": stats.misses,
        "hit_rate": round(stats.hit_rate, 4) if stats.hit_rate is not None else None,
        "size": stats.size,
        "max_size": stats.max_size,
        "ttl_seconds": stats.ttl_seconds,
        "bytes": stats.bytes,
        "evictions": stats.evictions,
        "expirations": stats.expirations,
        "avg_hit_ms": _ms(stats.avg_hit_ms),
        "avg_miss_ms": _ms(stats.avg_miss_ms),
        "avg_ms": _ms(stats.avg_ms),
        "shared": stats.shared,
        "shared_available": stats.shared_available,
    }


def optimize_cache(
    *,
    user_id: uuid.UUID | str,
    agent_id: uuid.UUID | str | None = None,
    force_refresh: Any = False,
    max_entries: Any = None,
) -> dict[str, Any]:
    """Expire, demote and share the caller's query cache entries, and report what was done.

    Only the caller's own entries are touched. ``force_refresh`` drops them
    here, in Redis, and in every other server process listening on the
    database (``jobs.broadcast_cache_clear``).
    """
    refresh = validation.flag(force_refresh, field="force_refresh")
    size = settings.QUERY_CACHE_SIZE
    keep = validation.integer(
        max_entries, field="max_memories", low=0, high=max(size, 0), default=size
    )
    scope = query_cache.scope(user_id, agent_id)
    done = embeddings.get_query_cache().optimize(
        scope=scope,
        model_id=embeddings.get_embedder().model_id,
        max_entries=keep,
        force_refresh=refresh,
    )
    if refresh:
        jobs.broadcast_cache_clear(scope, exact=True)
    return {
        "expired": done.expired,
        "demoted": done.demoted,
        "promoted": done.promoted,
        "refreshed": done.refreshed,
        "kept": done.kept,
        "bytes_freed": done.bytes_freed,
        "seconds": round(done.seconds, 4),
    }


def clear_query_cache(*, user_id: uuid.UUID | str | None = None) -> int:
    """Drop cached query vectors of one user and its agents, or of everyone (operators only).

    Clears this process and Redis, and tells every server process listening
    on the database to clear its own; returns what this process and Redis
    held.
    """
    scope = None if user_id is None else query_cache.scope(user_id)
    removed = embeddings.get_query_cache().clear(scope, shared=True)
    jobs.broadcast_cache_clear(scope, exact=False)
    return removed


def worker_pool() -> dict[str, int]:
    """Return how busy the threads that run tool calls (each with its connection) are."""
    return process.worker_pool()


def _ms(value: float | None) -> float | None:
    return round(value, 3) if value is not None else None


def health(*, user_id: uuid.UUID | str, agent_id: uuid.UUID | str | None = None) -> dict[str, Any]:
    """Check the database, the embedder, the queue and Redis; report no secrets.

    The query cache's figures are the caller's own entries and lookups.
    """
    started = time.perf_counter()
    database: dict[str, Any] = {"ok": True}
    queue: dict[str, Any] | None = None
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        database["latency_ms"] = round((time.perf_counter() - started) * 1000, 2)
        queue = queue_depth()
    except Exception as exc:
        logger.warning("health: database unavailable", extra=describe_exception(exc))
        database = {"ok": False, "error": "the database did not answer"}
    embedder = embeddings.get_embedder()
    cached = embeddings.get_query_cache()
    scope = query_cache.scope(user_id, agent_id)
    stats = cached.stats(scope)
    redis = _redis_health()
    ok = database["ok"] and embedder.is_loaded and redis is not False
    return {
        "status": "ok" if ok else "degraded",
        "database": database,
        "embedder": {"ok": embedder.is_loaded, "model": embedder.model_id},
        "queue": queue,
        "redis": redis,
        "cache": {
            "size": stats.size,
            "shared_size": cached.shared_size(scope) if redis else None,
            "hit_rate": round(stats.hit_rate, 4) if stats.hit_rate is not None else None,
            "bytes": stats.bytes,
        },
        "version": process.version(),
        "uptime_seconds": round(process.uptime_seconds(), 1),
        "rss_bytes": process.rss_bytes(),
    }


def _redis_health() -> bool | None:
    """True or False when Redis is configured (whether it answers), None when it is not."""
    if not settings.REDIS_URL:
        return None
    import redis

    try:
        with redis.Redis.from_url(
            settings.REDIS_URL, socket_timeout=0.25, socket_connect_timeout=0.25
        ) as client:
            return bool(client.ping())
    except Exception:
        return False


# export and import ------------------------------------------------------------

EXPORT_BATCH = 500
IMPORT_BATCH = 100


def export_memories(
    *,
    user_id: uuid.UUID | str,
    namespace: Any = None,
    with_embeddings: bool = False,
) -> Iterator[dict[str, Any]]:
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
            versions: dict[uuid.UUID, list[dict[str, Any]]] = {}
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
)


def _exported_version(row: dict[str, Any]) -> dict[str, Any]:
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
    }


@dataclass
class Imported:
    read: int = 0
    imported: int = 0
    deduplicated: int = 0  # identical content was already in the namespace
    embedded: int = 0  # re-embedded: no vector, or one from another model
    expired: int = 0  # expired since the export: left out


@dataclass(frozen=True)
class _Incoming:
    id: uuid.UUID
    agent: str | None
    namespace: str
    source_kind: str
    author: str
    path: str
    thread_id: str | None
    position: int | None
    task_id: str | None
    content: str
    content_hash: str
    metadata: dict[str, Any]
    priority: str
    version: int
    created_at: datetime
    updated_at: datetime
    expires_at: datetime | None
    history: list[dict[str, Any]]
    vector: np.ndarray | None


def import_memories(
    *,
    user_id: uuid.UUID | str,
    records: Iterable[dict[str, Any]],
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
    batch: list[_Incoming] = []
    for record in records:
        report.read += 1
        try:
            incoming = _incoming(record, embedder)
        except ValidationFailed as error:
            raise ValidationFailed(f"record {report.read}: {error.message}") from None
        if incoming.expires_at is not None and incoming.expires_at <= timezone.now():
            report.expired += 1
            continue
        batch.append(incoming)
        if len(batch) >= IMPORT_BATCH:
            _import_batch(user_id, batch, embedder, report, agents)
            batch = []
            if progress is not None:
                progress(report)
    if batch:
        _import_batch(user_id, batch, embedder, report, agents)
    if progress is not None:
        progress(report)
    return report


def _incoming(record: Any, embedder: embeddings.Embedder) -> _Incoming:
    if not isinstance(record, dict):
        raise ValidationFailed("each line must be a JSON object.")
    text = validation.content(record.get("content"))
    history = record.get("history") or []
    if not isinstance(history, list) or len(history) > 10_000:
        raise ValidationFailed("history must be a list of versions.")
    versions = [_incoming_version(entry) for entry in history]
    vector = None
    raw = record.get("embedding")
    if raw is not None and record.get("embedding_model") == embedder.model_id:
        candidate = np.asarray(raw, dtype=np.float32)
        if candidate.shape == (embedder.dimensions,) and np.all(np.isfinite(candidate)):
            vector = candidate
    created = validation.timestamp(record.get("created_at"), field="created_at")
    updated = (
        validation.timestamp(record["updated_at"], field="updated_at")
        if record.get("updated_at")
        else created
    )
    expires = record.get("expires_at")
    kind = record.get("source_kind") or SourceKind.NOTE.value
    if kind not in SourceKind.values:
        raise ValidationFailed("source_kind must be conversation, document or note.")
    return _Incoming(
        id=_record_id(record.get("id")),
        agent=validation.label(record.get("agent"), field="agent"),
        namespace=validation.namespace(record.get("namespace")),
        source_kind=kind,
        author=validation.label(record.get("author") or None, field="author") or "",
        path=validation.label(record.get("path") or None, field="path", maximum=1024) or "",
        thread_id=validation.label(record.get("thread_id"), field="thread_id"),
        task_id=validation.label(record.get("task_id"), field="task_id"),
        position=(
            validation.integer(
                record["position"], field="position", low=0, high=1_000_000, default=0
            )
            if record.get("position") is not None
            else None
        ),
        content=text,
        content_hash=validation.content_hash(text),
        metadata=validation.metadata(record.get("metadata")),
        priority=validation.priority(record.get("priority")),
        version=max([v["version"] for v in versions] or [1]) if versions else 1,
        created_at=created,
        updated_at=updated,
        expires_at=validation.timestamp(expires, field="expires_at") if expires else None,
        history=versions,
        vector=vector,
    )


def _record_id(value: Any) -> uuid.UUID:
    try:
        return uuid.UUID(str(value))
    except ValueError:
        return uuid.uuid4()


def _incoming_version(entry: Any) -> dict[str, Any]:
    if not isinstance(entry, dict):
        raise ValidationFailed("each history entry must be an object.")
    action = entry.get("action")
    if action not in ("created", "updated", "deleted"):
        raise ValidationFailed("a history entry's action must be created, updated or deleted.")
    expires = entry.get("expires_at")
    client = entry.get("client") or "import"
    return {
        "version": validation.integer(
            entry.get("version"), field="version", low=1, high=1_000_000, default=1
        ),
        "action": action,
        "content": validation.content(entry.get("content")),
        "metadata": validation.metadata(entry.get("metadata")),
        "namespace": validation.namespace(entry.get("namespace")),
        "priority": validation.priority(entry.get("priority")),
        "expires_at": validation.timestamp(expires, field="expires_at") if expires else None,
        "client": validation.label(client, field="client", maximum=32),
        "recorded_at": validation.timestamp(entry.get("timestamp"), field="timestamp"),
    }


def _import_agents(user_id: uuid.UUID | str, names: set[str], agents: dict[str, uuid.UUID]) -> None:
    """Find (or create) the user's agents named in an import, into ``agents`` by name."""
    from accounts import services as account_services

    missing = {name for name in names if name.casefold() not in agents}
    if not missing:
        return
    for agent in account_services.list_agents(user_id=user_id):
        agents[agent.name.casefold()] = agent.id
    for name in sorted(missing):
        if name.casefold() not in agents:
            created = account_services.create_agent(user_id=user_id, name=name)
            agents[created.name.casefold()] = created.id


def _import_batch(
    user_id: uuid.UUID | str,
    batch: list[_Incoming],
    embedder: embeddings.Embedder,
    report: Imported,
    agents: dict[str, uuid.UUID],
) -> None:
    # Which ids are free on this server, whoever holds them (operator path).
    ids = [item.id for item in batch]
    with tenancy.operator():
        taken = set(Memory.objects.filter(id__in=ids).values_list("id", flat=True))
        taken |= set(
            MemoryHistory.objects.filter(memory_id__in=ids).values_list("memory_id", flat=True)
        )
    _import_agents(user_id, {item.agent for item in batch if item.agent}, agents)
    need = [item for item in batch if item.vector is None]
    vectors = dict(
        zip(
            [item.id for item in need],
            _embed_many(embedder, [item.content for item in need]) if need else [],
            strict=True,
        )
    )
    with context.acting_as("import"), tenancy.tenant(user_id):
        for item in batch:
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
            existing = _holder(place, item.content_hash)
            if existing:
                report.deduplicated += 1
                continue
            memory_id = uuid.uuid4() if item.id in taken else item.id
            taken.add(memory_id)
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
            MemoryHistory.objects.bulk_create(
                MemoryHistory(memory_id=memory_id, user_id=user_id, agent_id=agent_id, **version)
                for version in history
            )
            vector = item.vector if item.vector is not None else vectors[item.id]
            with connection.cursor() as cursor:
                # The history just written covers this version, so the
                # history trigger adds no row of its own.
                cursor.execute(
                    "INSERT INTO memories (id, user_id, agent_id, namespace, source_kind, author,"
                    " path, thread_id, position, task_id, content, content_hash, embedding,"
                    " embedding_model, metadata, priority, expires_at, version, created_at,"
                    " updated_at) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s,"
                    " %s::vector, %s, %s::jsonb, %s, %s, %s, %s, %s)",
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
                    ],
                )
            report.imported += 1
            report.embedded += item.vector is None


# sources: seed 003's add, search, filters and recall ---------------------------

# Seed 003's memories live in one namespace: an agent's memory is the agent's.
SOURCES_NAMESPACE = "default"
DOCUMENT_MAX = 200_000
LABEL_MAX = 200
PATH_MAX = 1024


def _label(value: Any, field: str, maximum: int = LABEL_MAX) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise ValidationFailed(f"{field} must be a string.")
    text = storable.text(validation.normalize(value), field=field)
    if len(text) > maximum:
        raise ValidationFailed(f"{field} is at most {maximum} characters.")
    return text or None


def _sourced(
    items: tuple[Item, ...], *, thread_id: str | None, task_id: str | None, conversation: bool
) -> Remembering:
    """A seed 003 add as a call ``store`` writes: default namespace and priority, no expiry."""
    given = {
        "items": [
            [item.content, item.metadata, item.kind, item.author, item.path] for item in items
        ],
        "thread_id": thread_id,
        "task_id": task_id,
    }
    return Remembering(
        items=items,
        namespace=SOURCES_NAMESPACE,
        priority=Priority.MEDIUM.value,
        expires_at=None,
        thread_id=thread_id,
        task_id=task_id,
        fingerprint=_fingerprint(given),
        conversation=conversation,
    )


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

    The same conversation ingestion as ``remember(messages=...)``: a turn is
    ``{"role", "content", "name"?, "timestamp"?}``, its author is the name,
    else the role, and each turn keeps its position (in the ``position``
    column and in metadata) and the thread, so that the conversation can be
    read back in order.
    """
    call = _sourced(
        _turns(turns, {}),
        thread_id=_label(thread_id, "thread_id"),
        task_id=_label(task_id, "task_id"),
        conversation=True,
    )
    return store(user_id=user_id, tier=tier, agent_id=agent_id, call=call)


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
    writer = _label(author, "author") or ""
    items = tuple(
        Item(
            c.text,
            {"heading": c.heading, "chunk": c.position} if c.heading else {"chunk": c.position},
            kind=SourceKind.DOCUMENT.value,
            author=writer,
            path=where,
        )
        for c in chunking.chunk(text)
    )
    call = _sourced(items, thread_id=None, task_id=_label(task_id, "task_id"), conversation=False)
    return store(user_id=user_id, tier=tier, agent_id=agent_id, call=call)


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
    item = Item(
        validation.content(content),
        {},
        kind=SourceKind.NOTE.value,
        author=_label(author, "author") or "",
    )
    call = _sourced(
        (item,),
        thread_id=_label(thread_id, "thread_id"),
        task_id=_label(task_id, "task_id"),
        conversation=False,
    )
    return store(user_id=user_id, tier=tier, agent_id=agent_id, call=call)


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
    prepared = search.prepare(
        cache_scope=query_cache.scope(user_id, agent_id),
        query=query,
        namespace=SOURCES_NAMESPACE,
        limit=limit,
        threshold=threshold,
        sources=wanted,
    )
    with tenancy.tenant(
        user_id,
        agent_id=agent_id,
        task_id=wanted.get("task_id"),
        local_settings=search.transaction_settings(prepared, agent=agent_id is not None),
    ):
        found = search.run(user_id, prepared, agent_id=agent_id)
    return [
        {
            "id": str(hit.memory.id),
            "content": hit.memory.content,
            "similarity": hit.similarity,
            "score": hit.score,
            "source_kind": hit.memory.source_kind,
            "author": hit.memory.author,
            "path": hit.memory.path,
            "thread_id": hit.memory.thread_id,
            "task_id": hit.memory.task_id,
            "metadata": hit.memory.metadata,
            "created_at": iso(hit.memory.created_at),
        }
        for hit in found
    ]


FILTER_VALUES_MAX = 200


def list_source_filters(
    *, user_id: uuid.UUID | str, agent_id: uuid.UUID | str | None
) -> dict[str, list[str]]:
    """Return the source kinds, authors and paths the caller's own memories hold."""
    with tenancy.tenant(user_id, agent_id=agent_id):
        own = Memory.objects.live().filter(_written_by(agent_id), user_id=user_id)

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


def count_namespace(
    *,
    user_id: uuid.UUID | str,
    agent_id: uuid.UUID | str | None = None,
    namespace: Any = "default",
) -> int:
    """Return how many live memories one namespace of the user's (or agent's) holds."""
    ns = validation.namespace(namespace)
    with tenancy.tenant(user_id, agent_id=agent_id):
        return Memory.objects.live().filter(user_id=user_id, namespace=ns).count()


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
