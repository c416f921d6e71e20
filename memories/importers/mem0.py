"""mem0: the JSON that ``Memory.get_all()`` and the platform's export give.

Accepted shapes: ``{"results": [...]}`` (get_all since v1.1, and the
platform's paginated lists), a bare array of memories (older get_all), or
JSON Lines with one memory per line (``.jsonl``). Each memory is
``{"id", "memory", "hash", "metadata", "created_at", "updated_at",
"user_id", "agent_id", "run_id", ...}``.

``memory`` becomes the content and ``metadata`` the memory's metadata;
``user_id``, ``agent_id`` and ``run_id`` go where the mapping says (by
default: a namespace, the user's agent of that name, and the thread; ``app_id``
to metadata only), and
everything else the memory carried (``hash``, ``categories``, ...) is kept
under ``imported_from``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from memories.importers.base import Record, Refused, Stream, identities, place
from memories.importers.sources import Source, documents, lines_of

FORMAT = "mem0"
IDENTITIES = {"user_id": "namespace", "agent_id": "agent", "run_id": "thread", "app_id": "metadata"}
ARRAYS = frozenset({"results", "memories"})
KNOWN = {"id", "memory", "text", "content", "metadata", "created_at", "updated_at", *IDENTITIES}


def read(source: Source, *, ids: str | None = None, **_: Any) -> Stream:
    mapping = identities(ids, IDENTITIES, flag="--ids")
    if source.suffix in (".jsonl", ".ndjson"):
        for line, value in lines_of_source(source):
            yield memory(value, f"line {line}", mapping)
        return
    for _key, index, value, line in documents(
        source, ARRAYS, needs=("results", "memories"), what="a mem0 export"
    ):
        if index is None:
            continue  # "count", "next", "previous" of a paginated list
        where = f"record {index + 1} (line {line})"
        if not isinstance(value, dict):
            yield Refused(where, "not a JSON object")
            continue
        yield memory(value, where, mapping)


def lines_of_source(source: Source) -> Iterator[tuple[int, dict[str, Any]]]:
    with source.text() as stream:
        yield from lines_of(stream, source.label)


def memory(value: dict[str, Any], where: str, mapping: dict[str, str]) -> Record | Refused:
    content = value.get("memory", value.get("text", value.get("content")))
    record = Record(
        content=content,
        where=where,
        source_id=str(value["id"]) if value.get("id") is not None else None,
        created_at=value.get("created_at"),
        updated_at=value.get("updated_at"),
        metadata=value.get("metadata"),
    )
    try:
        place(record, value, mapping)
    except ValueError as error:
        return Refused(where, str(error))
    for key, item in value.items():
        if key not in KNOWN and item is not None:
            record.extra[key] = item
    return record
