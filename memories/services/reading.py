"""Reading memories: recall (the one search, shaped), listing, namespaces and counts."""

from __future__ import annotations

import dataclasses
import logging
import uuid
from collections.abc import Iterable
from typing import Any, Unpack

from django.db.models import Count, F, Q

from core import tenancy
from core.errors import ValidationFailed
from core.timestamps import iso
from memories import search, validation
from memories.models import (
    Memory,
)
from memories.services import past
from memories.services.shapes import Listed, NamespaceCount, Recalled

logger = logging.getLogger("memories.services")

# How many results an ``as_of`` search may ask for beyond ``limit`` to make up
# for those its history leaves out (each left out costs a search again).
REFILL_MAX = 50


def recall(
    *,
    user_id: uuid.UUID | str,
    agent_id: uuid.UUID | str | None = None,
    **arguments: Unpack[search.SearchArguments],
) -> list[Recalled]:
    """Return the namespace's memories that best match ``query``, best first.

    How they are ranked, filtered and cut by the threshold, and how priority
    breaks ties, is memories/search.py's.
    """
    found, _ = search_memories(user_id=user_id, agent_id=agent_id, **arguments)
    return found


def search_memories(
    *,
    user_id: uuid.UUID | str,
    agent_id: uuid.UUID | str | None = None,
    **arguments: Unpack[search.SearchArguments],
) -> tuple[list[Recalled], str]:
    """``recall``, also saying where the answer came from: ``cache`` when the result
    cache answered, else where the query's vector came from (``cache``,
    ``shared-cache`` or ``model``).

    ``use_cache=False`` embeds the query afresh and ranks afresh, whatever the
    caches hold.
    """
    args = search.SearchArgs.parse(**arguments)
    until = args.filters.until
    if until is None:
        searched = search.search(user_id=user_id, agent_id=agent_id, args=args)
        source = "cache" if searched.cached else searched.vector_source
        return [_found(hit) for hit in searched.found], source
    # as_of: each result as it was then, read from the history in the
    # search's own transaction, one statement for all of them (so never
    # from the result cache: the history changes without a memory's write).
    # A result the history says was replaced then is left out after the
    # ranking; the search then asks again for as many more, so the answer
    # still holds ``limit`` results when that many were held true.
    # The metadata and priority filters apply to each result's version then,
    # too: one that does not meet them is left out with the rest (the search
    # applies them to the memories now, which keeps it as selective as any).
    wanted = args.filters
    asked = args
    while True:
        then: dict[str, past.Then] = {}

        def read(found: list[search.Found], then: dict[str, past.Then] = then) -> None:
            ids = [hit.memory.id for hit in found]
            then.update(past.versions_at(user_id, ids, until, wanted))

        searched = search.search(user_id=user_id, agent_id=agent_id, args=asked, within=read)
        shown = [
            past.shown(_found(hit), then.get(str(hit.memory.id)), hit.memory.version)
            for hit in searched.found
        ]
        kept = [found for found in shown if found is not None]
        left_out = len(shown) - len(kept)
        if not left_out or len(shown) < asked.limit or asked.limit >= args.limit + REFILL_MAX:
            return kept[: args.limit], searched.vector_source
        asked = dataclasses.replace(asked, limit=asked.limit + left_out)


def _found(hit: search.Found) -> Recalled:
    memory = hit.memory
    found: Recalled = {
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
    if memory.superseded_by is not None and memory.superseded_at is not None:
        # Only when asked for (include_superseded, as_of): marked as replaced.
        found["superseded_by"] = str(memory.superseded_by)
        found["superseded_at"] = iso(memory.superseded_at)
    if hit.may_be_replaced_by is not None:
        # A newer result that likely restates this one, not linked (ordering.newer_first).
        found["may_be_replaced_by"] = hit.may_be_replaced_by
    return found


default_threshold = search.default_threshold


SOURCE_FILTERS = search.SOURCE_FILTERS


def list_memories(
    *,
    user_id: uuid.UUID | str,
    agent_id: uuid.UUID | str | None = None,
    namespace: object = "default",
    limit: object = 20,
    offset: object = 0,
    order: object = "created_at",
    priority: object = None,
    thread_id: object = None,
    superseded: object = "exclude",
) -> list[Listed]:
    """Return a page of the namespace's memories, newest first by ``order``.

    With ``thread_id``, only that conversation's messages, in the order they
    were said (``order`` does not apply): read back in full, they are the
    conversation. ``superseded``: replaced memories are left out
    (``exclude``, the default), listed too (``include``) or alone (``only``).
    """
    ns = validation.namespace(namespace)
    count = validation.integer(
        limit, field="limit", low=1, high=validation.LIST_LIMIT_MAX, default=20
    )
    skip = validation.integer(offset, field="offset", low=0, high=validation.OFFSET_MAX, default=0)
    column = validation.order(order)
    levels = validation.priorities(priority)
    thread = validation.label(thread_id, field="thread_id")
    which = superseded_choice(superseded)
    with tenancy.tenant(user_id, agent_id=agent_id):
        rows = Memory.objects.live().filter(user_id=user_id, namespace=ns)
        if which != "include":
            rows = rows.filter(superseded_by__isnull=which == "exclude")
        if levels:
            rows = rows.filter(priority__in=levels)
        if thread is not None:
            rows = rows.filter(thread_id=thread).order_by("position", "created_at", "id")
        else:
            # Newest first; a conversation stored at one moment, its last turn first.
            rows = rows.order_by(f"-{column}", F("position").desc(nulls_last=True), "-id")
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
    "superseded_by",
    "superseded_at",
)


SUPERSEDED = ("exclude", "include", "only")


def superseded_choice(value: object) -> str:
    if value is None:
        return "exclude"
    if value not in SUPERSEDED:
        raise ValidationFailed("superseded must be exclude (the default), include or only.")
    return str(value)


def _listed(row: dict[str, Any]) -> Listed:
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
        "superseded_by": str(row["superseded_by"]) if row["superseded_by"] else None,
        "superseded_at": iso(row["superseded_at"]) if row["superseded_at"] else None,
    }


def memory_agents(*, user_id: uuid.UUID | str, ids: Iterable[str]) -> dict[str, str | None]:
    """Return which agent wrote each of the user's memories ``ids`` (None: no agent)."""
    wanted = [uuid.UUID(str(memory_id)) for memory_id in ids]
    with tenancy.tenant(user_id):
        rows = Memory.objects.filter(user_id=user_id, id__in=wanted).values_list("id", "agent_id")
        return {str(memory_id): str(agent) if agent else None for memory_id, agent in rows}


def list_namespaces(*, user_id: uuid.UUID | str) -> list[NamespaceCount]:
    """Return the user's namespaces by name, with how many current memories each holds and
    how many replaced ones; expired memories, gone to every tool, count in neither."""
    with tenancy.tenant(user_id):
        rows = (
            Memory.objects.live()
            .filter(user_id=user_id)
            .values("namespace")
            .annotate(
                count=Count("id", filter=Q(superseded_by__isnull=True)),
                replaced=Count("id", filter=Q(superseded_by__isnull=False)),
            )
            .order_by("namespace")
        )
        return [
            {"namespace": row["namespace"], "count": row["count"], "replaced": row["replaced"]}
            for row in rows
        ]


def count_namespace(
    *,
    user_id: uuid.UUID | str,
    agent_id: uuid.UUID | str | None = None,
    namespace: object = "default",
    superseded: object = "include",
) -> int:
    """Return how many live memories one namespace of the user's (or agent's) holds.

    ``superseded`` as list_memories' (all of them by default).
    """
    ns = validation.namespace(namespace)
    which = superseded_choice(superseded)
    with tenancy.tenant(user_id, agent_id=agent_id):
        rows = Memory.objects.live().filter(user_id=user_id, namespace=ns)
        if which != "include":
            rows = rows.filter(superseded_by__isnull=which == "exclude")
        return rows.count()
