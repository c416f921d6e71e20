"""What every reader yields: a source record in Recall's terms, or a refusal with its reason.

A reader turns one project's export or storage into a stream of ``Record``
and ``Refused`` values, one at a time, so that a file of any size is read in
bounded memory. A record says where it came from (``where``: a line, a record
number, a note's path) so that every refusal and error can name it.

Input that cannot be read at all (broken JSON, a CSV with a stray quote, a
database without the expected tables) raises ``ValidationFailed`` naming the
file and the line or record: the import stops there. A record that is read
but cannot become a memory (no content, deleted at the source, a date that is
not a date) is ``Refused``: the import counts it, with its reason, and goes on.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta
from typing import Any

import numpy as np

from core import storable
from core.errors import ValidationFailed
from memories import validation

# The metadata key under which an imported memory keeps where it came from:
# the format, the file, the record's id there, and whatever else the source
# knew about it that has no column here (tags, types, ids of users, agents
# and runs, frontmatter). README: "Moving from another memory server".
IMPORTED_FROM = "imported_from"
# Under IMPORTED_FROM: the source's fields that could not be kept (too large
# or nested too deeply), by name, so that their absence is never silent.
DROPPED = "dropped"

# Where source identities (mem0's user_id, agent_id, run_id; OpenMemory's
# app; Letta's agent) may go: a namespace, one of the user's agents (created
# when missing), a thread, or only metadata.
TARGETS = ("namespace", "agent", "thread", "metadata")


@dataclass
class Record:
    content: Any
    where: str  # "line 12", "record 3", "notes/coffee.md": named in refusals
    source_id: str | None = None
    created_at: Any = None
    updated_at: Any = None
    # The source's own metadata object: kept as the memory's metadata.
    metadata: Any = None
    # Everything else the source said about it, kept under IMPORTED_FROM.
    extra: dict[str, Any] = field(default_factory=dict)
    namespace: str | None = None
    agent: str | None = None
    thread_id: str | None = None
    priority: str | None = None
    kind: str = "note"
    path: str = ""
    author: str = ""
    # A vector the source stored, and the model it says made it.
    vector: np.ndarray | None = None
    vector_model: str | None = None


@dataclass(frozen=True)
class Refused:
    where: str
    reason: str


Item = Record | Refused
Stream = Iterator[Item]


def moment(value: Any, field_name: str) -> datetime | None:
    """Return a source's timestamp as an aware datetime: ISO 8601, or Unix seconds or ms.

    A number goes by its digits as written. 9 to 11 are Unix seconds and 13
    Unix milliseconds. 8, 12 and 14 are a date and time in UTC, ISO 8601's
    basic form: YYYYMMDD (at midnight), YYYYMMDDhhmm and YYYYMMDDhhmmss. Read
    as seconds, 20240101 was dated 1970-08-23, and read as milliseconds,
    202401011230 was dated 1976-05-31, silently; no memory server wrote such
    times (any YYYYMMDDhhmm from 1970 to now, as milliseconds, falls in 1976,
    and 14 digits of milliseconds are past the year 2286). Any other number
    of fewer than 9 digits, or of 8, 12 or 14 digits that make no such date,
    or written with a leading zero ("020240101"), is refused as ambiguous,
    and a negative number as before 1970. Zero stays the epoch.

    None and "" stay None. Raises ValueError (a reason to refuse the record)
    for anything else, and for a time outside what an imported memory may
    have (``validation.imported_time``: 1970 to a day from now): a negative
    Unix time became the year 385, exported as no ISO 8601 reader reads it.
    """
    found = _moment(value, field_name)
    if found is None:
        return None
    try:
        return validation.imported_time(found, field_name)
    except ValidationFailed as exc:
        raise ValueError(exc.message) from None


def _moment(value: Any, field_name: str) -> datetime | None:
    if value is None or value == "":
        return None
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    if isinstance(value, date):
        return datetime.combine(value, time(), tzinfo=UTC)
    if isinstance(value, bool):
        raise ValueError(f"{field_name} {value!r} is not a date")
    if isinstance(value, int):
        return _number(str(value), field_name, value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{field_name} {value!r} is not a date")
        return _number(f"{value:f}", field_name, value)
    if isinstance(value, str):
        text = value.strip()
        if re.fullmatch(r"-?\d+(\.\d+)?", text):
            return _number(text, field_name, value)
        try:
            parsed = datetime.fromisoformat(text)
        except ValueError:
            raise ValueError(f"{field_name} {_short(value)!r} is not an ISO 8601 date") from None
        return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)
    raise ValueError(f"{field_name} is a {type(value).__name__}, not a date")


# The digits of a date and time in ISO 8601's basic form; in UTC.
COMPACT_DIGITS = (8, 12, 14)


def _number(text: str, field_name: str, given: Any) -> datetime:
    """A number as written (``-?DIGITS(.DIGITS)?``), by its count of digits (see ``moment``)."""
    shown = _short(given) if isinstance(given, str) else given
    whole, _, fraction = text.lstrip("-").partition(".")
    value = float(text)
    if value == 0:
        return datetime.fromtimestamp(0, tz=UTC)
    if value < 0:
        raise ValueError(
            f"{field_name} {shown!r} is a negative number: a time before 1970, not when a"
            " memory was written"
        )
    digits = len(whole)
    if whole.startswith("0") or digits < 9 or digits in COMPACT_DIGITS:
        found = _compact(whole) if not fraction.strip("0") else None
        # Twelve digits past today (978307200000) are more likely Unix
        # milliseconds of 1973 to 2001 than a date to come: ambiguous, not a
        # date "no memory was written at" (review152).
        if found is None or found > datetime.now(UTC) + timedelta(days=1):
            raise ValueError(
                f"{field_name} {shown!r} is an ambiguous date: a number is read by its digits,"
                " 9 to 11 as Unix seconds, 13 as milliseconds, and 8, 12 or 14 as YYYYMMDD,"
                " YYYYMMDDhhmm or YYYYMMDDhhmmss (UTC); write it in ISO 8601 (2024-01-31)"
            )
        return found
    seconds = value if digits <= 11 else value / 1000.0
    try:
        return datetime.fromtimestamp(seconds, tz=UTC)
    except (OverflowError, OSError, ValueError):
        raise ValueError(f"{field_name} {shown!r} is not a date") from None


def _compact(digits: str) -> datetime | None:
    """YYYYMMDD, YYYYMMDDhhmm or YYYYMMDDhhmmss in UTC; None for any other digits."""
    if digits.startswith("0") or len(digits) not in COMPACT_DIGITS:
        return None
    full = digits.ljust(14, "0")  # midnight, or the minute's first second
    try:
        return datetime(
            int(full[:4]),
            int(full[4:6]),
            int(full[6:8]),
            int(full[8:10]),
            int(full[10:12]),
            int(full[12:]),
            tzinfo=UTC,
        )
    except ValueError:
        return None  # 20241301: no such day


def tags(value: Any) -> list[str]:
    """Return tags given as a list or a comma-separated string, trimmed, empties dropped.

    A number is a tag's text, as it is an identity's. Raises ValueError (a
    reason to refuse the record) for an object, or a list holding one: its
    Python text ("{'x': 1}") was kept as a tag.
    """
    if value is None:
        return []
    if isinstance(value, str):
        items: list[Any] = value.split(",")
    elif isinstance(value, list):
        items = value
    elif is_text(value):
        items = [value]
    else:
        raise ValueError(f"tags must be a list or text, not {kind_of(value)}")
    for item in items:
        if not is_text(item):
            raise ValueError(f"tags must be text, not {kind_of(item)}")
    return [str(item).strip() for item in items if str(item).strip()]


def jsonable(value: Any, depth: int = 0) -> Any:
    """Return ``value`` with dates as ISO strings and other non-JSON leaves as strings.

    Raises ValueError for a value nested deeper than metadata may be: past
    that it could not be stored anyway, and a source's field nested a few
    hundred levels deep exhausted Python's recursion limit here.
    """
    if isinstance(value, dict | list | tuple | set):
        if depth >= validation.METADATA_MAX_DEPTH:
            raise ValueError(f"nested deeper than {validation.METADATA_MAX_DEPTH} levels")
        if isinstance(value, dict):
            return {str(k): jsonable(v, depth + 1) for k, v in value.items()}
        return [jsonable(v, depth + 1) for v in value]
    if isinstance(value, datetime):
        return value.isoformat()
    if hasattr(value, "isoformat"):
        return value.isoformat()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return str(value)


def with_provenance(
    metadata: dict[str, Any], origin: dict[str, Any], extra: dict[str, Any]
) -> dict[str, Any]:
    """Return ``metadata`` with ``origin`` and ``extra`` under IMPORTED_FROM, validated.

    The source's own metadata must be valid: a fault there refuses the
    record, and the reason blames it. An extra field that cannot be stored
    (nested too deeply, not storable text) is left out, and so are the
    largest extras while the whole is over the size limit: losing a memory
    for the sake of a copy of some field its source had no column for is the
    worse loss. The names of those left out are kept under ``dropped``.
    """
    own = validation.metadata(metadata)
    kept: dict[str, Any] = {}
    dropped: list[str] = []
    origin = dict(origin)
    if "id" in origin:
        origin["id"] = _kept_id(origin["id"])
        if origin["id"] is None:
            del origin["id"]
            dropped.append("id")
    for key, value in extra.items():
        try:
            kept[key] = jsonable(value)
            # Checked where it will sit: inside IMPORTED_FROM, inside metadata.
            validation.metadata({IMPORTED_FROM: {key: kept[key]}})
        except (ValueError, ValidationFailed):
            kept.pop(key, None)
            dropped.append(key)

    def whole() -> dict[str, Any]:
        found = {**origin, **kept}
        if dropped:
            found[DROPPED] = _named(dropped)
        return {**own, IMPORTED_FROM: found}

    # Largest first, each field sized once: sizing the whole again after
    # every drop took minutes for a record of a few thousand small fields.
    over = _size(whole()) - validation.METADATA_MAX_BYTES
    by_size = sorted(kept, key=lambda key: _size({key: kept[key]}), reverse=True)
    for key in by_size:
        if over <= 0:
            break
        over -= _size({key: kept.pop(key)})
        dropped.append(key)
    while kept and _size(whole()) > validation.METADATA_MAX_BYTES:
        # The estimate's margin (the names listed grow as fields go): rare.
        key = next(iter(kept))
        kept.pop(key)
        dropped.append(key)
    return validation.metadata(whole())


# How many names of fields left out are kept, and how much of each: the list
# itself must never be what takes the metadata past its limit.
DROPPED_NAMES = 10
DROPPED_NAME_CHARS = 64


def _named(dropped: list[str]) -> list[str]:
    names = sorted(name[:DROPPED_NAME_CHARS] for name in dropped)
    if len(names) <= DROPPED_NAMES:
        return names
    return [*names[:DROPPED_NAMES], f"and {len(names) - DROPPED_NAMES:,} more"]


def _size(value: Any) -> int:
    # surrogatepass: a lone surrogate is sized, not raised as the codec's error;
    # validation refuses it in words.
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    return len(text.encode("utf-8", errors="surrogatepass"))


# How much of a source's id ``imported_from.id`` keeps: ids are short, and
# one of 20,000 characters cost its memory (metadata over its limit).
ID_MAX_CHARS = 200
ID_KEPT_CHARS = 160


def _kept_id(value: Any) -> str | None:
    """Return a source's id as kept: a longer one cut, with a digest of the whole so that two
    ids alike at the start stay apart; None when it cannot be stored at all."""
    text = str(value)
    if storable.problem(text) is not None:
        return None
    if len(text) <= ID_MAX_CHARS:
        return text
    return f"{text[:ID_KEPT_CHARS]}…sha256:{_digest(text)}"


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", errors="surrogatepass")).hexdigest()[:16]


def parse_mapping(text: str, allowed: tuple[str, ...], *, flag: str) -> dict[str, str]:
    """Parse ``a=b,c=d`` into a dict, refusing keys outside ``allowed`` (or any key if empty)."""
    mapping: dict[str, str] = {}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        key, sep, value = part.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not key or not value:
            raise ValidationFailed(
                f"{flag} takes name=value pairs separated by commas; got {part!r}."
            )
        if allowed and key not in allowed:
            raise ValidationFailed(f"{flag}: {key!r} is not one of {', '.join(allowed)}.")
        mapping[key] = value
    return mapping


def _short(value: str, limit: int = 40) -> str:
    return value if len(value) <= limit else value[: limit - 1] + "…"


def vector_from_blob(blob: bytes, dimensions: int) -> np.ndarray | None:
    """Return a little-endian float32 vector of ``dimensions`` from raw bytes, or None."""
    if len(blob) != dimensions * 4:
        return None
    return np.frombuffer(blob, dtype="<f4").astype(np.float32)


def namespace_for(value: Any) -> str:
    """Return a source's identity as a namespace: other characters become "-", at most 64.

    An identity longer than that gets a digest of the whole in place of its
    last characters: two ids alike in their first 64 characters were merged
    into one. One that fits keeps the namespace it always had ("Alice Smith"
    is ``Alice-Smith``), so an import run again after an upgrade still finds
    what the first run stored rather than storing it all again.
    """
    if not is_text(value):
        raise ValueError(f"a namespace must be made of text, not {kind_of(value)}")
    text = str(value).strip()
    kept = re.sub(f"[^{validation.NAMESPACE_CHARS}]", "-", text)
    if len(kept) <= validation.NAMESPACE_MAX:
        return kept or "default"
    return f"{kept[: validation.NAMESPACE_MAX - 17]}-{_digest(text)}"


def is_text(value: Any) -> bool:
    """Whether ``value`` may be an identity or a tag: text, or a number taken as its text."""
    return isinstance(value, str | int | float) and not isinstance(value, bool)


def kind_of(value: Any) -> str:
    names = {dict: "an object", list: "a list", bool: "true or false"}
    return names.get(type(value), f"a {type(value).__name__}")


def identities(spec: str | None, defaults: dict[str, str], *, flag: str) -> dict[str, str]:
    """Return where each source identity goes: ``defaults`` overridden by ``spec`` (``a=b,...``).

    Each target but metadata takes at most one identity.
    """
    chosen = dict(defaults)
    if spec:
        for key, target in parse_mapping(spec, tuple(defaults), flag=flag).items():
            if target not in TARGETS:
                raise ValidationFailed(
                    f"{flag}: {key} can go to {', '.join(TARGETS)}; not {target!r}."
                )
            chosen[key] = target
    for target in ("namespace", "agent", "thread"):
        taking = [key for key, value in chosen.items() if value == target]
        if len(taking) > 1:
            raise ValidationFailed(f"{flag}: only one of {', '.join(taking)} can go to {target}.")
    return chosen


def place(record: Record, values: dict[str, Any], mapping: dict[str, str]) -> None:
    """Put each identity in ``values`` where ``mapping`` says; every one is kept in extra too.

    Raises ValueError (a reason to refuse the record) for an identity that is
    not text: an object's text made a namespace of it ("--x-:-1-").
    """
    for key, target in mapping.items():
        value = values.get(key)
        if value is None or value == "":
            continue
        if not is_text(value):
            raise ValueError(f"{key} must be text, not {kind_of(value)}")
        text = str(value)
        record.extra[key] = text
        if target == "namespace":
            record.namespace = namespace_for(text)
        elif target == "agent":
            record.agent = text
        elif target == "thread":
            record.thread_id = text
