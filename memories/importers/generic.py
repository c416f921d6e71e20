"""Any other server's data as JSON Lines or CSV, with a mapping from its fields to ours.

``--map content=text,created_at=ts,namespace=project,metadata.source=origin``
says which source field fills which of Recall's: ``content`` (required),
``created_at``, ``updated_at``, ``namespace``, ``agent``, ``thread``,
``priority``, ``id`` (the source's id, kept in ``imported_from``),
``metadata`` (a JSON object, or a JSON string in CSV), ``tags`` (a list, or a
comma-separated string) and ``metadata.KEY`` (one field into one metadata
key). In JSON Lines a source field may be a dotted path into nested objects
(``data.text``). A target left out of the mapping is filled from the source
field of the same name when there is one (``content`` also from ``text`` or
``memory``). Other fields whose values are strings, numbers or booleans are
kept under ``imported_from.fields``.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Sequence
from typing import Any

from core.errors import ValidationFailed
from memories.importers import jsonstream
from memories.importers.base import (
    Record,
    Refused,
    Stream,
    is_text,
    kind_of,
    namespace_for,
    parse_mapping,
    tags,
)
from memories.importers.sources import Source, lines_of
from memories.transfer import not_utf8_near

TARGETS = (
    "content",
    "created_at",
    "updated_at",
    "namespace",
    "agent",
    "thread",
    "priority",
    "id",
    "metadata",
    "tags",
)
# The bound on one field: the same as on one JSON value or line.
FIELD_MAX_CHARS = jsonstream.MAX_VALUE_CHARS
FALLBACKS = {"content": ("content", "text", "memory"), "thread": ("thread", "thread_id")}


def mapping(spec: str | None) -> dict[str, str]:
    """Return target -> source field, from ``--map``; ``metadata.KEY`` targets are allowed."""
    given = parse_mapping(spec or "", (), flag="--map")
    for target in given:
        if target not in TARGETS and not (target.startswith("metadata.") and len(target) > 9):
            raise ValidationFailed(
                f"--map: {target!r} is not one of {', '.join(TARGETS)} or metadata.KEY."
            )
    return given


def read_jsonl(source: Source, *, columns: str | None = None, **_: Any) -> Stream:
    """Read JSON Lines; a file in which no record has content stops, naming where it looked.

    Every record refused "no content" was the report of a file whose content
    field has another name: nothing was stored, and saying so is the fix.
    """
    chosen = mapping(columns)
    seen = read = False
    with source.text() as stream:
        for line, value in lines_of(stream, source.label):
            seen = seen or _field(value, chosen, "content", nested=True) is not None
            yield _record(value, f"line {line}", chosen, nested=True)
            read = True
    if not seen and read:
        raise ValidationFailed(no_content(source.label, chosen))


def read_csv(source: Source, *, columns: str | None = None, **_: Any) -> Stream:
    chosen = mapping(columns)
    # The csv module's own limit (128 KB) stopped the whole import at one
    # long field; a JSON Lines record that long is refused alone. Fields up
    # to the bound on one record are read, and validation refuses the row.
    # (The limit is the process's; nothing else here reads CSV.)
    csv.field_size_limit(FIELD_MAX_CHARS)
    with source.text() as stream:
        # strict: a quote left open to the end of the file is an error, not one long field.
        reader = csv.DictReader(stream, strict=True)
        try:
            header = reader.fieldnames
            if not header:
                raise ValidationFailed(f"{source.label}: empty, or no header row.")
            wanted = set(chosen.values())
            missing = sorted(wanted - set(header))
            if missing:
                raise ValidationFailed(
                    f"{source.label}: --map names columns the header lacks: {', '.join(missing)}."
                )
            if "content" not in chosen and not set(FALLBACKS["content"]) & set(header):
                raise ValidationFailed(no_content(source.label, chosen, header))
            for row in reader:
                where = f"line {reader.line_num}"
                if None in row:
                    yield Refused(where, "more fields than the header has columns")
                    continue
                yield _record(row, where, chosen, nested=False)
        except csv.Error as error:
            # line_num counts the lines of records already read; the failing one starts after them.
            raise ValidationFailed(
                f"{source.label}, line {reader.line_num + 1}: {error}."
            ) from None
        except UnicodeDecodeError:
            raise ValidationFailed(
                f"{source.label}: {not_utf8_near(reader.line_num + 1)}."
            ) from None


def no_content(label: str, chosen: dict[str, str], header: Sequence[str] | None = None) -> str:
    """Say that a file (a CSV's ``header``, else JSON Lines) has no content, and how to name it.

    The header's own names are not repeated: given a JSON Lines file, the
    "columns" are pieces of its first memory.
    """
    if "content" in chosen:
        return f"{label}: no record has content in {chosen['content']!r}, the field --map names."
    names = FALLBACKS["content"]
    looked = f"looked for {', '.join(names[:-1])} or {names[-1]}"
    if header is None:
        name = "name yours with --map content=FIELD"
        return f"{label}: no record has content ({looked}); {name}."
    hint = ""
    if header[0].lstrip().startswith(("{", "[")):
        hint = " It looks like JSON Lines: import it with --from jsonl."
    elif len(header) == 1 and ";" in header[0]:
        hint = " Its header has no commas: is it separated by ';'? Only ',' separates columns."
    return f"{label}: no content column ({looked}); name yours with --map content=COLUMN.{hint}"


def _get(row: dict[str, Any], name: str, nested: bool) -> Any:
    if name in row or not nested:
        return row.get(name)
    value: Any = row
    for part in name.split("."):
        if not isinstance(value, dict):
            return None
        value = value.get(part)
    return value


def _field(row: dict[str, Any], chosen: dict[str, str], target: str, nested: bool) -> Any:
    if target in chosen:
        return _get(row, chosen[target], nested)
    for name in FALLBACKS.get(target, (target,)):
        if name in row:
            return row[name]
    return None


def _record(
    row: dict[str, Any], where: str, chosen: dict[str, str], nested: bool
) -> Record | Refused:
    used = set(chosen.values()) | {
        name
        for target in TARGETS
        if target not in chosen
        for name in FALLBACKS.get(target, (target,))
    }
    namespace = _field(row, chosen, "namespace", nested)
    try:
        record = Record(
            content=_field(row, chosen, "content", nested),
            where=where,
            source_id=_text(_field(row, chosen, "id", nested), "id"),
            created_at=_field(row, chosen, "created_at", nested),
            updated_at=_field(row, chosen, "updated_at", nested),
            metadata=_metadata(row, chosen, nested),
            namespace=namespace_for(namespace) if namespace not in (None, "") else None,
            agent=_text(_field(row, chosen, "agent", nested), "agent"),
            thread_id=_text(_field(row, chosen, "thread", nested), "thread"),
            priority=_text(_field(row, chosen, "priority", nested), "priority"),
        )
        found = tags(_field(row, chosen, "tags", nested))
    except ValueError as error:
        return Refused(where, str(error))
    if found:
        record.extra["tags"] = found
    rest = {
        key: value
        for key, value in row.items()
        if key not in used and isinstance(value, str | int | float | bool) and value != ""
    }
    if rest:
        record.extra["fields"] = rest
    return record


def _metadata(row: dict[str, Any], chosen: dict[str, str], nested: bool) -> dict[str, Any]:
    """The record's metadata: its object (or JSON text) and each ``metadata.KEY`` field.

    Raises ValueError, a reason to refuse the record, when it is not an object.
    """
    metadata = _field(row, chosen, "metadata", nested)
    if isinstance(metadata, str):
        if metadata.strip():
            try:
                metadata = json.loads(metadata)
            except (ValueError, RecursionError):
                raise ValueError("metadata is not valid JSON") from None
        else:
            metadata = None
    if metadata is not None and not isinstance(metadata, dict):
        raise ValueError("metadata is not a JSON object")
    metadata = dict(metadata or {})
    for target, name in chosen.items():
        if target.startswith("metadata."):
            value = _get(row, name, nested)
            if value is not None and value != "":
                metadata[target[9:]] = value
    return metadata


def _text(value: Any, name: str) -> str | None:
    """A field that must be text; a number is its text, as mem0's identities are.

    An object or a list refuses the record (ValueError): its Python text
    became an agent called "{'x': 1}".
    """
    if value is None or value == "":
        return None
    if not is_text(value):
        raise ValueError(f"{name} must be text, not {kind_of(value)}")
    return str(value)
