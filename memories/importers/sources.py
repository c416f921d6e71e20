"""Opening what a reader reads: a file by its path, named in every message by its label."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from core.errors import ValidationFailed
from memories.importers import jsonstream
from memories.transfer import not_utf8_near


@dataclass(frozen=True)
class Source:
    path: Path
    # The name a person knows the file by (an upload's original name): used in
    # messages and kept in imported_from, never the server's temporary path.
    label: str

    @classmethod
    def at(cls, path: str | Path, label: str | None = None) -> Source:
        where = Path(path)
        return cls(where, label or where.name)

    @property
    def suffix(self) -> str:
        return Path(self.label).suffix.lower() or self.path.suffix.lower()

    def text(self) -> IO[str]:
        try:
            return self.path.open(encoding="utf-8-sig", newline="")
        except OSError as error:
            raise ValidationFailed(f"Cannot read {self.label}: {error.strerror}.") from None


def lines_of(stream: IO[str], label: str) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield ``(line number, object)`` for each non-blank line of a JSON Lines stream."""
    number = 0
    try:
        for number, line in enumerate(stream, start=1):
            if not line.strip():
                continue
            if len(line) > jsonstream.MAX_VALUE_CHARS:
                raise ValidationFailed(f"{label}, line {number}: longer than a record can be.")
            try:
                value = json.loads(line)
            except (ValueError, RecursionError):
                raise ValidationFailed(f"{label}, line {number}: not valid JSON.") from None
            if not isinstance(value, dict):
                raise ValidationFailed(f"{label}, line {number}: not a JSON object.")
            yield number, value
    except UnicodeDecodeError:
        raise ValidationFailed(f"{label}: {not_utf8_near(number + 1)}.") from None


def documents(
    source: Source, arrays: frozenset[str], *, needs: tuple[str, ...] = (), what: str = ""
) -> Iterator[tuple[Any, Any, Any, int]]:
    """Yield a JSON document's top-level items (see ``jsonstream.Events.items``).

    A document that is an object must hold one of the arrays ``needs`` names
    (empty or not), or it is not ``what``: without this, a file of another
    format, or one memory not in an array, "succeeded" with 0 of 0 records.
    """
    with source.text() as stream:
        events = jsonstream.Events(stream, source.label)
        try:
            for key, index, value, line in events.items(arrays):
                if key in arrays and index is None and value is not None:
                    # Not an array: read as nothing, it "succeeded" with 0 of 0 records.
                    raise ValidationFailed(not_array(source.label, line, f"`{key}`", value))
                yield key, index, value, line
        except UnicodeDecodeError:
            raise ValidationFailed(f"{source.label}: not UTF-8 text.") from None
        if needs and not events.found & {None, *needs}:
            raise ValidationFailed(missing(source.label, needs, what))


def missing(label: str, needs: tuple[str, ...], what: str) -> str:
    names = [f"`{name}`" for name in needs]
    listed = names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"
    return f"{label}: no {listed} array; is this {what}?"


def not_array(label: str, line: int, name: str, value: Any) -> str:
    kind = {dict: "an object", str: "text", bool: "true or false"}.get(type(value), "a number")
    return f"{label}, line {line}: {name} is {kind}, not an array; is this the right format?"
