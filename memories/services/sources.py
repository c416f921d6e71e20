"""Seed 003's memory: add turns, documents and notes; search and recall with source filters.

Seed 003's memories live in one namespace: an agent's memory is the agent's.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping

from core import tenancy
from core.errors import (
    ValidationFailed,
)
from core.timestamps import iso
from memories import embeddings, search, validation
from memories.models import (
    Memory,
    Priority,
    SourceKind,
)
from memories.services import naming
from memories.services.shapes import Answer, Sourced, Stored
from memories.services.storing import Item, Remembering, fingerprint, store, turn_items, written_by

logger = logging.getLogger("memories.services")


# Seed 003's memories live in one namespace: an agent's memory is the agent's.
SOURCES_NAMESPACE = "default"


DOCUMENT_MAX = 200_000


LABEL_MAX = 200


PATH_MAX = 1024


def _label(value: object, field: str, maximum: int = LABEL_MAX) -> str | None:
    return validation.label(value, field=field, maximum=maximum, blank_is_none=True)


def _sourced(
    items: tuple[Item, ...],
    *,
    thread_id: str | None,
    task_id: str | None,
    conversation: bool,
    replaces: uuid.UUID | None = None,
) -> Remembering:
    """A seed 003 add as a call ``store`` writes: default namespace and priority, no expiry."""
    given = {
        "items": [
            [item.content, item.metadata, item.kind, item.author, item.path] for item in items
        ],
        "thread_id": thread_id,
        "task_id": task_id,
        "replaces": str(replaces) if replaces else None,
    }
    return Remembering(
        items=items,
        namespace=SOURCES_NAMESPACE,
        priority=Priority.MEDIUM.value,
        expires_at=None,
        thread_id=thread_id,
        task_id=task_id,
        fingerprint=fingerprint(given),
        conversation=conversation,
        replaces=replaces,
    )


def add(
    *,
    user_id: uuid.UUID | str,
    tier: str,
    agent_id: uuid.UUID | str | None,
    messages: object = None,
    document: Mapping[str, object] | None = None,
    content: object = None,
    author: object = None,
    thread_id: object = None,
    task_id: object = None,
    replaces: object = None,
) -> list[Stored]:
    """Store exactly one of: conversation ``messages``, a ``document`` (content, path), a note.

    What ``memory_add`` does: turns as ``add_turns``, a document as
    ``add_document``, a note as ``add_note``; a ``thread_id`` groups any of
    them with the session's other memories (seed 003).
    """
    given = [x is not None for x in (messages, document, content)]
    if sum(given) != 1:
        raise ValidationFailed("Pass exactly one of messages, document or content.")
    if replaces is not None and content is None:
        raise ValidationFailed("replaces applies to a note (content), not to turns or documents.")
    if author is not None and messages is not None:
        # Each turn's author is its role (or name): refused rather than dropped.
        raise ValidationFailed(
            "author applies to a note or a document; a turn's author is its role."
        )
    if messages is not None:
        return add_turns(
            user_id=user_id,
            tier=tier,
            agent_id=agent_id,
            turns=messages,
            thread_id=thread_id,
            task_id=task_id,
        )
    if document is not None:
        return add_document(
            user_id=user_id,
            tier=tier,
            agent_id=agent_id,
            content=document.get("content"),
            path=document.get("path"),
            within="document.",
            author=author,
            thread_id=thread_id,
            task_id=task_id,
        )
    return add_note(
        user_id=user_id,
        tier=tier,
        agent_id=agent_id,
        content=content,
        author=author,
        thread_id=thread_id,
        task_id=task_id,
        replaces=replaces,
    )


def add_turns(
    *,
    user_id: uuid.UUID | str,
    tier: str,
    agent_id: uuid.UUID | str | None,
    turns: object,
    thread_id: object = None,
    task_id: object = None,
) -> list[Stored]:
    """Store conversation turns, one memory each, in order, all or none.

    The same conversation ingestion as ``remember(messages=...)``: a turn is
    ``{"role", "content", "name"?, "timestamp"?}``, its author is the name,
    else the role, and each turn keeps its position (in the ``position``
    column and in metadata) and the thread, so that the conversation can be
    read back in order.
    """
    call = _sourced(
        turn_items(turns, {}),
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
    content: object,
    path: object,
    within: str = "",
    author: object = None,
    thread_id: object = None,
    task_id: object = None,
) -> list[Stored]:
    """Store a document as chunks cut by its structure and size, all under ``path``.

    With ``thread_id``, the chunks belong to that session, as its notes and
    turns do; the same document in another thread is that thread's copy.
    ``within`` prefixes the fields' names in refusals (``document.``).
    """
    from memories import chunking

    where = _label(path, f"{within}path", PATH_MAX)
    if not where:
        raise ValidationFailed(
            f"{within}path is required: where the document lives, such as 'docs/handbook.md'."
        )
    text = validation.text(content, field=f"{within}content", maximum=DOCUMENT_MAX)
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
    call = _sourced(
        items,
        thread_id=_label(thread_id, "thread_id"),
        task_id=_label(task_id, "task_id"),
        conversation=False,
    )
    return store(user_id=user_id, tier=tier, agent_id=agent_id, call=call)


def add_note(
    *,
    user_id: uuid.UUID | str,
    tier: str,
    agent_id: uuid.UUID | str | None,
    content: object,
    author: object = None,
    thread_id: object = None,
    task_id: object = None,
    replaces: object = None,
) -> list[Stored]:
    """Store one note; ``replaces`` names an older memory it replaces (issue 22)."""
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
        replaces=naming.parse_replaces(replaces),
    )
    return store(user_id=user_id, tier=tier, agent_id=agent_id, call=call)


def source_filters(**values: object) -> dict[str, str]:
    """Validate memory_search's filters; unset ones are dropped."""
    chosen: dict[str, str] = {}
    for name in search.SOURCE_FILTERS:
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
    query: object,
    limit: object = 10,
    threshold: object = None,
    **filters: object,
) -> list[Sourced]:
    """Rank the agent's memories by meaning, with source filters applied before ranking.

    Naming ``task_id`` also searches what the user's other agents filed under
    that task (and only that, as the filter says).
    """
    args = _source_search(query, limit, threshold, filters)
    return [_sourced_hit(hit) for hit in _search(user_id, agent_id, args)]


def _source_search(
    query: object, limit: object, threshold: object, filters: dict[str, object]
) -> search.SearchArgs:
    replaced = filters.pop("include_superseded", False)
    sources = source_filters(**filters)
    return search.SearchArgs.parse(
        query=query,  # type: ignore[arg-type]  # validated here
        namespace=SOURCES_NAMESPACE,
        limit=limit,  # type: ignore[arg-type]
        threshold=threshold,  # type: ignore[arg-type]
        sources=sources,
        include_superseded=replaced,  # type: ignore[arg-type]  # validated by parse
    )


def _search(
    user_id: uuid.UUID | str, agent_id: uuid.UUID | str | None, args: search.SearchArgs
) -> list[search.Found]:
    task = args.filters.sources.get("task_id")
    return search.search(user_id=user_id, agent_id=agent_id, task_id=task, args=args).found


def _sourced_hit(hit: search.Found) -> Sourced:
    return {
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
        **_marked(hit),  # type: ignore[typeddict-item]
    }


def _marked(hit: search.Found) -> dict[str, str]:
    """A replaced memory's mark (returned only when asked for: include_superseded), or the
    newer result that likely restates it (``ordering.newer_first``)."""
    memory = hit.memory
    if hit.may_be_replaced_by is not None:
        return {"may_be_replaced_by": hit.may_be_replaced_by}
    if memory.superseded_by is None or memory.superseded_at is None:
        return {}
    return {"superseded_by": str(memory.superseded_by), "superseded_at": iso(memory.superseded_at)}


FILTER_VALUES_MAX = 200


def list_source_filters(
    *, user_id: uuid.UUID | str, agent_id: uuid.UUID | str | None
) -> dict[str, list[str]]:
    """Return the source kinds, authors and paths the caller's own memories hold.

    Only what a search can find with them (seed 003: "call it first, then
    pass one back"): the namespace seed 003's tools search, current memories.
    """
    with tenancy.tenant(user_id, agent_id=agent_id):
        own = Memory.objects.live().filter(
            written_by(agent_id),
            user_id=user_id,
            namespace=SOURCES_NAMESPACE,
            superseded_by__isnull=True,
        )

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
    query: object,
    limit: object = 10,
    threshold: object = None,
    **filters: object,
) -> Answer:
    """Answer a question from the agent's memory: a short answer and the ids it rests on."""
    from memories import chat

    args = _source_search(query, limit, threshold, filters)
    found = [_sourced_hit(hit) for hit in _search(user_id, agent_id, args)]
    # The threshold chose the memories (on score); the extractive answer's
    # sentence cut is a cosine, half the model's similarity threshold.
    said = chat.answer(args.query, found, embeddings.get_embedder().default_threshold)
    answer: Answer = {"answer": said.answer, "memory_ids": said.memory_ids, "mode": said.mode}
    if said.model:
        answer["model"] = said.model
    if said.note:
        answer["note"] = said.note
    return answer
