"""OpenMemory: the zip its backup export writes (``POST /api/v1/backup/export``).

The archive holds ``memories.json`` (the relational export: user, apps,
categories, memories, their categories and status history) and
``memories.jsonl.gz`` (one memory per line: ``id``, ``content``,
``metadata``, ``created_at``, ``updated_at``, ``state``, ``app``,
``categories``). The gzip lines are read as a stream; an archive without
them falls back to ``memories.json``, whose memories array is streamed too.

A memory whose state is ``deleted`` is refused; ``archived`` and ``paused``
ones are imported with their state under ``imported_from``. The app's name
goes where the mapping says (by default: metadata only).
"""

from __future__ import annotations

import gzip
import io
import zipfile
import zlib
from typing import Any

from core.errors import ValidationFailed
from memories.importers import jsonstream, unpacking
from memories.importers.base import Record, Refused, Stream, identities, place
from memories.importers.sources import Source, lines_of, missing

FORMAT = "openmemory"
IDENTITIES = {"app": "metadata"}


def read(source: Source, *, ids: str | None = None, **_: Any) -> Stream:
    mapping = identities(ids, IDENTITIES, flag="--ids")
    try:
        archive = zipfile.ZipFile(source.path)
    except (zipfile.BadZipFile, OSError):
        raise ValidationFailed(
            f"{source.label}: not a zip archive (OpenMemory's export is one)."
        ) from None
    budget = unpacking.Budget(source.path, source.label)
    with archive:
        lines = _member(archive, "memories.jsonl.gz")
        whole = _member(archive, "memories.json")
        if lines is not None:
            yield from _from_lines(archive, lines, f"{source.label}:{lines}", mapping, budget)
        elif whole is not None:
            yield from _from_json(archive, whole, f"{source.label}:{whole}", mapping, budget)
        else:
            raise ValidationFailed(
                f"{source.label}: neither memories.jsonl.gz nor memories.json is in the archive."
            )


def _member(archive: zipfile.ZipFile, name: str) -> str | None:
    for member in archive.namelist():
        if not member.endswith("/") and member.rsplit("/", 1)[-1] == name:
            return member
    return None


def _from_lines(
    archive: zipfile.ZipFile,
    member: str,
    label: str,
    mapping: dict[str, str],
    budget: unpacking.Budget,
) -> Stream:
    # The zip member is read through its own check, so that damage to it is
    # told apart from damage to the gzip stream inside it.
    raw = unpacking.member(archive, member, budget, count=False)
    with raw, gzip.GzipFile(fileobj=raw) as unzipped:
        text = io.TextIOWrapper(unpacking.metered(unzipped, budget), encoding="utf-8")
        try:
            for line, value in lines_of(text, label):
                yield _memory(
                    value, f"line {line}", mapping, value.get("app"), value.get("categories")
                )
        except (OSError, EOFError, zlib.error, zipfile.BadZipFile):
            raise ValidationFailed(f"{label}: the gzip stream is damaged.") from None
        except UnicodeDecodeError:
            raise ValidationFailed(f"{label}: not UTF-8 text.") from None


def _from_json(
    archive: zipfile.ZipFile,
    member: str,
    label: str,
    mapping: dict[str, str],
    budget: unpacking.Budget,
) -> Stream:
    with unpacking.member(archive, member, budget) as raw:
        text = io.TextIOWrapper(raw, encoding="utf-8")
        events = jsonstream.Events(text, label)
        try:
            yield from _json_memories(events, mapping)
        except UnicodeDecodeError:
            raise ValidationFailed(f"{label}: not UTF-8 text.") from None
        if "memories" not in events.found:
            raise ValidationFailed(missing(label, ("memories",), "OpenMemory's export"))


def _json_memories(events: jsonstream.Events, mapping: dict[str, str]) -> Stream:
    apps: dict[str, str] = {}
    categories: dict[str, str] = {}
    for key, index, value, line in events.items(frozenset({"memories"})):
        if key == "apps" and isinstance(value, list):
            apps = {str(a.get("id")): str(a.get("name")) for a in value if isinstance(a, dict)}
        elif key == "categories" and isinstance(value, list):
            categories = {
                str(c.get("id")): str(c.get("name")) for c in value if isinstance(c, dict)
            }
        elif key == "memories" and index is not None:
            where = f"memory {index + 1} (line {line})"
            if not isinstance(value, dict):
                yield Refused(where, "not a JSON object")
                continue
            names = [categories.get(str(c), str(c)) for c in value.get("category_ids") or []]
            yield _memory(value, where, mapping, apps.get(str(value.get("app_id"))), names)


def _memory(
    value: dict[str, Any], where: str, mapping: dict[str, str], app: Any, cats: Any
) -> Record | Refused:
    state = value.get("state") or "active"
    if state == "deleted":
        return Refused(where, "deleted in OpenMemory")
    record = Record(
        content=value.get("content"),
        where=where,
        source_id=str(value["id"]) if value.get("id") is not None else None,
        created_at=value.get("created_at"),
        updated_at=value.get("updated_at"),
        metadata=value.get("metadata"),
    )
    try:
        place(record, {"app": app}, mapping)
    except ValueError as error:
        return Refused(where, str(error))
    if state != "active":
        record.extra["state"] = state
    if cats:
        record.extra["categories"] = list(cats)
    for key in ("archived_at",):
        if value.get(key):
            record.extra[key] = value[key]
    return record
