"""One record of Recall's own export, read for ``import_memories`` (transfer.py), and checked.

A record is validated as ``remember``'s input is, and against itself: its
history is the memory's own, so each version is in the memory's namespace
(one left out is taken to be), none is later than the memory's version, the
version the memory is at holds the memory's content, and none was recorded
before the memory was created. Its times are times a memory can have
(``validation.imported_time``), and it was not updated before it was created.
A record that breaks one of these stops the import at its line: a file
edited by hand, or not ours.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import numpy as np

from core.errors import ValidationFailed
from memories import embeddings, validation
from memories.models import SourceKind


@dataclass(frozen=True)
class Incoming:
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
    metadata: dict[str, object]
    priority: str
    version: int
    created_at: datetime
    updated_at: datetime
    expires_at: datetime | None
    history: list[dict[str, Any]]
    vector: np.ndarray | None
    superseded_by: uuid.UUID | None = None
    superseded_at: datetime | None = None


def read_record(record: Any, embedder: embeddings.Embedder) -> Incoming:
    """Return ``record`` validated, or raise ValidationFailed saying what is wrong with it."""
    if not isinstance(record, dict):
        raise ValidationFailed("each line must be a JSON object.")
    text = validation.stored_content(record.get("content"))
    namespace = validation.namespace(record.get("namespace"))
    created, updated = _times(record)
    history = _history(record, namespace)
    version = _version(record, history, text, created)
    expires = record.get("expires_at")
    kind = record.get("source_kind") or SourceKind.NOTE.value
    if kind not in SourceKind.values:
        raise ValidationFailed("source_kind must be conversation, document or note.")
    return Incoming(
        id=_record_id(record.get("id")),
        agent=validation.label(record.get("agent"), field="agent", shown=True),
        namespace=namespace,
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
        version=version,
        created_at=created,
        updated_at=updated,
        expires_at=validation.timestamp(expires, field="expires_at") if expires else None,
        history=history,
        vector=_vector(record, embedder),
        superseded_by=_record_id(record["superseded_by"]) if record.get("superseded_by") else None,
        superseded_at=_time(record, "superseded_at") if record.get("superseded_at") else None,
    )


def _time(record: dict[str, Any], field: str, name: str | None = None) -> datetime:
    """A time of Recall's own file: any Recall may have stored (an export made before
    imported times were held to 1970 and later must still restore), but not far ahead."""
    moment = validation.timestamp(record.get(field), field=name or field)
    return validation.imported_time(moment, name or field, earliest=False)


def _times(record: dict[str, Any]) -> tuple[datetime, datetime]:
    created = _time(record, "created_at")
    updated = _time(record, "updated_at") if record.get("updated_at") else created
    # Recall stored such pairs (an import from a file that gave only updated_at), and
    # its export must restore: the later of the two is when it was last changed.
    return created, max(updated, created)


def _history(record: dict[str, Any], namespace: str) -> list[dict[str, Any]]:
    history = record.get("history") or []
    if not isinstance(history, list) or len(history) > 10_000:
        raise ValidationFailed("history must be a list of versions.")
    versions = [_incoming_version(entry, namespace) for entry in history]
    if len({v["version"] for v in versions}) < len(versions):
        raise ValidationFailed("history has two entries of one version.")
    return versions


def _version(
    record: dict[str, Any], history: list[dict[str, Any]], text: str, created: datetime
) -> int:
    """Return the memory's version, refusing a history that is not the memory's own."""
    latest = max([v["version"] for v in history] or [1])
    given = record.get("version")
    version = (
        latest
        if given is None
        else validation.integer(given, field="version", low=1, high=1_000_000, default=1)
    )
    for entry in history:
        if entry["version"] > version:
            raise ValidationFailed(
                f"history version {entry['version']} is later than the memory's version {version}."
            )
        if entry["version"] == version and entry["content"] != text:
            raise ValidationFailed(
                f"history version {version} holds other content than the memory at that version."
            )
    return version


def _vector(record: dict[str, Any], embedder: embeddings.Embedder) -> np.ndarray | None:
    raw = record.get("embedding")
    if raw is None or record.get("embedding_model") != embedder.model_id:
        return None
    if not isinstance(raw, list) or not all(
        isinstance(x, int | float) and not isinstance(x, bool) for x in raw
    ):
        raise ValidationFailed("embedding must be a list of numbers.")
    with np.errstate(over="ignore"):  # past float32 is inf, refused below, not a warning
        candidate = np.asarray(raw, dtype=np.float32)
    # One of another size, not finite or all zeros (no direction, which
    # cosine cannot rank) is not reused: the content is embedded again.
    if (
        candidate.shape == (embedder.dimensions,)
        and np.all(np.isfinite(candidate))
        and np.any(candidate)
    ):
        return candidate
    return None


def _record_id(value: Any) -> uuid.UUID:
    try:
        return uuid.UUID(str(value))
    except ValueError:
        return uuid.uuid4()


def _incoming_version(entry: Any, namespace: str) -> dict[str, Any]:
    if not isinstance(entry, dict):
        raise ValidationFailed("each history entry must be an object.")
    action = entry.get("action")
    if action not in ACTIONS:
        raise ValidationFailed(
            "a history entry's action must be created, updated, deleted, superseded or restored."
        )
    expires = entry.get("expires_at")
    client = entry.get("client") or "import"
    # A memory never moves: each of its versions is in its namespace.
    held = validation.namespace(entry.get("namespace") or namespace)
    if held != namespace:
        raise ValidationFailed(
            f"a history entry is in namespace {held!r}, the memory in {namespace!r}."
        )
    return {
        "version": validation.integer(
            entry.get("version"), field="version", low=1, high=1_000_000, default=1
        ),
        "action": action,
        "content": validation.stored_content(entry.get("content")),
        "metadata": validation.metadata(entry.get("metadata")),
        "namespace": held,
        "priority": validation.priority(entry.get("priority")),
        "expires_at": validation.timestamp(expires, field="expires_at") if expires else None,
        "client": validation.label(client, field="client", maximum=32),
        "recorded_at": _time(entry, "timestamp", "a history entry's timestamp"),
        "superseded_by": _optional_id(entry.get("superseded_by")),
        "replaces": _replaces(entry.get("replaces")),
        "decision": validation.metadata(entry["decision"])
        if isinstance(entry.get("decision"), dict)
        else None,
    }


def _replaces(value: Any) -> list[uuid.UUID] | None:
    if value is None:
        return None
    if not isinstance(value, list) or len(value) > 1_000:
        raise ValidationFailed("a history entry's replaces must be a list of memory ids.")
    return [r for r in map(_optional_id, value) if r] or None


ACTIONS = ("created", "updated", "deleted", "superseded", "restored")


def _optional_id(value: Any) -> uuid.UUID | None:
    try:
        return uuid.UUID(str(value)) if value else None
    except ValueError:
        return None
