"""The export format: JSON Lines, one memory per line.

Each line is one JSON object: ``id``, ``namespace``, ``content``,
``metadata``, ``priority``, ``version``, ``created_at``, ``updated_at``,
``expires_at`` and ``history`` (every version, oldest first: ``version``,
``action``, ``content``, ``metadata``, ``namespace``, ``priority``,
``expires_at``, ``client``, ``timestamp``), plus ``embedding_model`` and
``embedding`` when asked for. ``services.export_memories`` produces the
objects and ``services.import_memories`` takes them; this module only turns
them into lines and back.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import IO, Any

from core.errors import ValidationFailed

# A line longer than this cannot be a valid record: 50,000 characters of
# content, 16 KB of metadata and their history, with room to spare.
MAX_LINE_CHARS = 64 * 1024 * 1024


def to_lines(records: Iterable[dict[str, Any]]) -> Iterator[str]:
    for record in records:
        yield json.dumps(record, ensure_ascii=False, separators=(",", ":")) + "\n"


def not_utf8_near(line: int) -> str:
    """Say where text that is not UTF-8 was met, as near as a decoder can tell: it
    decodes ahead, a block at a time, so the bad byte may be a few lines further on."""
    return f"not UTF-8 text, at line {line} or a little after it"


class Line(dict[str, Any]):
    """A record read from a file, which knows its line: a refusal names it."""

    line: int


def from_lines(stream: IO[str]) -> Iterator[dict[str, Any]]:
    """Yield each line's object (a ``Line``), skipping blank lines; a bad line fails naming
    its number. A byte order mark before the first line is not content (standard input
    is not opened as utf-8-sig, as a named file is)."""
    lines = iter(stream)
    number = 0
    while True:
        try:
            line = next(lines)
        except StopIteration:
            return
        except UnicodeDecodeError:
            raise ValidationFailed(f"the file is {not_utf8_near(number + 1)}.") from None
        number += 1
        if number == 1:
            line = line.removeprefix("\ufeff")
        if not line.strip():
            continue
        if len(line) > MAX_LINE_CHARS:
            raise ValidationFailed(f"line {number} is too long to be a memory.")
        try:
            record = json.loads(line)
        except (ValueError, RecursionError):
            raise ValidationFailed(f"line {number} is not valid JSON.") from None
        if not isinstance(record, dict):
            raise ValidationFailed(f"line {number} is not a JSON object.")
        found = Line(record)
        found.line = number
        yield found
