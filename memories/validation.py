"""Input rules shared by every interface to the memory services.

Content normalisation, applied before hashing, storing and embedding:

1. Unicode NFC, so that the same text typed on different systems is one memory;
2. line endings become ``\\n``;
3. leading and trailing whitespace is trimmed.

Nothing else changes: inner whitespace, case and punctuation are the author's.
NUL characters and unpaired surrogates cannot be stored by PostgreSQL and are
refused rather than silently altered.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import unicodedata
import uuid
from datetime import UTC, date, datetime, time, timedelta
from typing import Any

from django.utils import timezone
from django.utils.dateparse import parse_datetime

from core import storable
from core.errors import ValidationFailed
from core.timestamps import iso

CONTENT_MAX = 50_000
QUERY_MAX = 10_000
NAMESPACE_MAX = 64
# Letters, digits and ``_ - . : / @``: safe in URLs, logs and tag attributes.
NAMESPACE_CHARS = "A-Za-z0-9_.:/@-"
NAMESPACE_PATTERN = re.compile(f"[{NAMESPACE_CHARS}]{{1,{NAMESPACE_MAX}}}")
METADATA_MAX_BYTES = 16_384
METADATA_MAX_DEPTH = 8
FILTER_MAX_KEYS = 8
RECALL_LIMIT_MAX = 50
LIST_LIMIT_MAX = 100
OFFSET_MAX = 1_000_000
ORDERS = ("created_at", "updated_at")
PRIORITIES = ("critical", "high", "medium", "low")
# Ten years: long enough for anything that should expire at all.
TTL_MAX = 10 * 365 * 86_400
MESSAGES_MAX = 100
ROLE_MAX = 32
LABEL_MAX = 200
IDEMPOTENCY_KEY_MAX = 200
SEARCH_MODES = ("hybrid", "semantic", "lexical")


def normalize(text: str) -> str:
    text = unicodedata.normalize("NFC", text)
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    return text.strip()


# Characters drawn as nothing that are not format characters (Cf): the Hangul
# fillers, the braille blank, the combining grapheme joiner, and the variation
# selectors (U+FE00-FE0F, U+E0100-E01EF).
_BLANK = frozenset("\u115f\u1160\u3164\uffa0\u2800\u034f")


def _blank(c: str) -> bool:
    return c in _BLANK or "\ufe00" <= c <= "\ufe0f" or "\U000e0100" <= c <= "\U000e01ef"


def _invisible(text: str) -> bool:
    """Whether ``text`` is all whitespace, format (zero-width, joiners, BOM), control and
    blank characters: stored, it would be a memory that no one can read or search for."""
    return all(c.isspace() or _blank(c) or unicodedata.category(c) in ("Cf", "Cc") for c in text)


def content_hash(normalized: str) -> str:
    return hashlib.sha256(normalized.encode("utf-8")).hexdigest()


def _check_storable(value: str, field: str) -> None:
    storable.text(value, field=field)


def text(value: Any, *, field: str, maximum: int, visible: bool = True) -> str:
    """Return ``value`` normalised, or raise if it is not 1..maximum characters (with
    ``visible``, not all of them invisible)."""
    if not isinstance(value, str):
        raise ValidationFailed(f"{field} must be a string.")
    _check_storable(value, field)
    normalized = normalize(value)
    if not normalized:
        raise ValidationFailed(f"{field} must not be empty or only whitespace.")
    if visible and _invisible(normalized):
        raise ValidationFailed(
            f"{field} must show some text: it holds only invisible characters"
            " (such as a zero-width space or a byte order mark) and whitespace."
        )
    if len(normalized) > maximum:
        # Counted as stored: NFC can make one character sent two (or two one).
        counted = " once normalised (Unicode NFC)" if len(normalized) > len(value) else ""
        raise ValidationFailed(
            f"{field} is {len(normalized):,} characters{counted}; the maximum is {maximum:,}."
        )
    return normalized


def content(value: Any) -> str:
    return text(value, field="content", maximum=CONTENT_MAX)


def stored_content(value: Any) -> str:
    """``content`` as Recall's own export holds it: what an older release stored may be
    invisible, and a backup restores whole."""
    return text(value, field="content", maximum=CONTENT_MAX, visible=False)


def query(value: Any) -> str:
    return text(value, field="query", maximum=QUERY_MAX)


def namespace(value: Any) -> str:
    if value is None:
        return "default"
    if not isinstance(value, str) or not NAMESPACE_PATTERN.fullmatch(value):
        raise ValidationFailed(
            "namespace must be 1-64 characters of letters, digits and _ - . : / @."
        )
    return value


def integer(value: Any, *, field: str, low: int, high: int, default: int) -> int:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValidationFailed(f"{field} must be an integer from {low} to {high}.")
    if isinstance(value, float):
        if not value.is_integer():
            raise ValidationFailed(f"{field} must be an integer from {low} to {high}.")
        value = int(value)
    if not low <= value <= high:
        raise ValidationFailed(f"{field} must be an integer from {low} to {high}; got {value}.")
    return value


def threshold(value: Any, default: float) -> float:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
        raise ValidationFailed("threshold must be a number from 0 to 1.")
    if not 0.0 <= value <= 1.0:
        raise ValidationFailed(f"threshold must be a number from 0 to 1; got {value}.")
    return float(value)


def search_mode(value: Any, default: str) -> str:
    if value is None:
        return default
    if value not in SEARCH_MODES:
        raise ValidationFailed('mode must be "hybrid", "semantic" or "lexical".')
    return str(value)


def moment(value: Any, *, field: str) -> datetime | None:
    """Return an ISO 8601 date or date-time as an aware datetime; None stays None.

    A date alone means its midnight, and a time without an offset is UTC.
    """
    if value is None:
        return None
    if isinstance(value, datetime):
        parsed = value
    elif isinstance(value, date):
        parsed = datetime.combine(value, time())
    elif isinstance(value, str) and 0 < len(value) <= 64 and value.isprintable():
        try:
            parsed = datetime.fromisoformat(value.strip())
        except ValueError:
            raise ValidationFailed(
                f"{field} must be an ISO 8601 date or date-time, such as "
                f'"2025-03-01" or "2025-03-01T09:30:00Z".'
            ) from None
    else:
        raise ValidationFailed(f"{field} must be an ISO 8601 date or date-time string.")
    return in_range(parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC), field)


def in_range(moment: datetime, field: str) -> datetime:
    """Return ``moment`` in UTC, refusing one whose UTC time, or a millisecond either side, is past
    what a datetime holds ("9999-12-31T23:59:59.999Z", "0001-01-01T00:00:00+05:00"):
    as_of is applied as the bound a millisecond later."""
    margin = timedelta(milliseconds=1)
    try:
        utc = moment.astimezone(UTC)
    except OverflowError:
        utc = None
    if utc is None or not _EARLIEST + margin <= utc <= _LATEST - margin:
        raise ValidationFailed(
            f"{field} is out of range: give a time from 0001-01-01T00:00:00.001Z"
            " to 9999-12-31T23:59:59.998Z."
        )
    # In UTC: Python reads offsets up to 23:59, PostgreSQL refuses past 15:59
    # ("+20:00" reached the database and came back as internal_error).
    return utc


_EARLIEST, _LATEST = datetime.min.replace(tzinfo=UTC), datetime.max.replace(tzinfo=UTC)

# When an imported memory may have been written (README, "Moving from another
# memory server"): not before the Unix epoch, where a negative Unix time or a
# mistyped year lands (year 385 came from one), and not more than a day ahead,
# which clock skew stays within. A time years ahead sorts first in every list
# by recency until then.
IMPORTED_EARLIEST = datetime(1970, 1, 1, tzinfo=UTC)
IMPORTED_AHEAD = timedelta(days=1)


def imported_time(moment: datetime, field: str, *, earliest: bool = True) -> datetime:
    """Return an imported memory's ``moment`` in UTC, refusing one a day ahead and, with
    ``earliest``, one before 1970."""
    utc = in_range(moment, field)
    too_early = earliest and utc < IMPORTED_EARLIEST
    if too_early or utc > timezone.now() + IMPORTED_AHEAD:
        raise ValidationFailed(
            f"{field} {iso(utc)} is not when a memory was written: give a time from"
            " 1970-01-01T00:00:00Z to a day from now."
        )
    return utc


def created_range(after: Any, before: Any) -> tuple[datetime | None, datetime | None]:
    """Return (created_after, created_before): the half-open range [after, before)."""
    start = moment(after, field="created_after")
    end = moment(before, field="created_before")
    if start is not None and end is not None and start >= end:
        raise ValidationFailed("created_after must be earlier than created_before.")
    return start, end


def order(value: Any) -> str:
    if value is None:
        return "created_at"
    if value not in ORDERS:
        raise ValidationFailed('order must be "created_at" or "updated_at".')
    return value


def memory_id(value: Any, *, field: str = "id") -> uuid.UUID:
    """Return ``value`` as a memory id; ``field`` is the argument's name where the caller is."""
    if isinstance(value, uuid.UUID):
        return value
    problem = f"{field} must be a memory id (a UUID string)."
    if not isinstance(value, str):
        raise ValidationFailed(problem)
    try:
        return uuid.UUID(value)
    except ValueError:
        raise ValidationFailed(problem) from None


def _check_json(value: Any, depth: int, field: str = "metadata") -> None:
    # ``depth`` counts the objects and lists around ``value``: the top object's
    # values are at 1. A value inside 8 nested objects is at 8, and allowed.
    # ``field`` is the argument the caller checks: metadata, or metadata_filter.
    if depth > METADATA_MAX_DEPTH:
        raise ValidationFailed(f"{field} must not nest deeper than {METADATA_MAX_DEPTH} levels.")
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise ValidationFailed(f"{field} keys must be strings.")
            _check_storable(key, field)
            _check_json(item, depth + 1, field)
    elif isinstance(value, list):
        for item in value:
            _check_json(item, depth + 1, field)
    elif isinstance(value, str):
        _check_storable(value, field)
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise ValidationFailed(f"{field} numbers must be finite.")
    elif value is not None and not isinstance(value, bool | int):
        raise ValidationFailed(f"{field} must contain only JSON values.")


def metadata(value: Any) -> dict[str, Any]:
    """Return ``value`` if it is a JSON object within the size and depth bounds."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ValidationFailed("metadata must be a JSON object.")
    _check_json(value, 0)
    size = len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8"))
    if size > METADATA_MAX_BYTES:
        raise ValidationFailed(
            f"metadata is {size:,} bytes as JSON; the maximum is {METADATA_MAX_BYTES:,}."
        )
    return value


def metadata_filter(value: Any) -> dict[str, Any]:
    """Return a filter of at most 8 keys whose values are strings, numbers, booleans or null."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ValidationFailed("metadata_filter must be a JSON object.")
    if len(value) > FILTER_MAX_KEYS:
        raise ValidationFailed(f"metadata_filter may have at most {FILTER_MAX_KEYS} keys.")
    for key, item in value.items():
        # Any key metadata may hold, the empty one too: remember accepts it.
        if not isinstance(key, str):
            raise ValidationFailed("metadata_filter keys must be strings.")
        if isinstance(item, dict | list):
            raise ValidationFailed(
                "metadata_filter values must be strings, numbers, booleans or null."
            )
    _check_json(value, 1, "metadata_filter")
    return value


def priority(value: Any) -> str:
    if value is None:
        return "medium"
    if value not in PRIORITIES:
        raise ValidationFailed("priority must be critical, high, medium or low.")
    return str(value)


def priorities(value: Any) -> list[str]:
    """Return the priorities a search or listing keeps: one, several, or all (empty)."""
    if value is None:
        return []
    chosen = [value] if isinstance(value, str) else value
    if not isinstance(chosen, list) or not chosen or any(p not in PRIORITIES for p in chosen):
        raise ValidationFailed("priority must be critical, high, medium or low, or a list of them.")
    return sorted(set(chosen), key=PRIORITIES.index)


def timestamp(value: Any, *, field: str) -> datetime:
    """Return an ISO 8601 timestamp as an aware datetime (UTC when no offset is given)."""
    parsed = None
    if isinstance(value, str) and len(value) <= 64 and value.isprintable():
        try:
            parsed = parse_datetime(value.strip())
        except ValueError:
            parsed = None
    if parsed is None:
        raise ValidationFailed(f"{field} must be an ISO 8601 time such as 2026-12-31T23:59:00Z.")
    if timezone.is_naive(parsed):
        parsed = timezone.make_aware(parsed, UTC)
    return in_range(parsed, field)


def expiry(expires_at: Any, ttl_seconds: Any) -> datetime | None:
    """Return when a memory expires, from ``expires_at`` or ``ttl_seconds`` (not both)."""
    if expires_at is not None and ttl_seconds is not None:
        raise ValidationFailed("Pass expires_at or ttl_seconds, not both.")
    if ttl_seconds is not None:
        seconds = integer(ttl_seconds, field="ttl_seconds", low=1, high=TTL_MAX, default=0)
        return timezone.now() + timedelta(seconds=seconds)
    if expires_at is None:
        return None
    when = timestamp(expires_at, field="expires_at")
    if when <= timezone.now():
        raise ValidationFailed("expires_at is in the past; a memory must expire in the future.")
    return when


def label(
    value: Any,
    *,
    field: str,
    maximum: int = LABEL_MAX,
    blank_is_none: bool = False,
    shown: bool = False,
) -> str | None:
    """Return a short identifier (a thread id, a name, a path), normalised; None when absent.

    An empty (or all-whitespace) label is refused, or with ``blank_is_none``
    taken as absent: seed 003's tools treat it so. ``shown``: a name the
    dashboard shows as such (an agent's), held to ``storable.name``.
    """
    if value is None:
        return None
    if not isinstance(value, str):
        raise ValidationFailed(f"{field} must be a string.")
    _check_storable(value, field)
    if shown:
        storable.name(value, field=field)
    cleaned = normalize(value)
    if not cleaned:
        if blank_is_none:
            return None
        raise ValidationFailed(f"{field} must not be empty; leave it out instead.")
    if len(cleaned) > maximum:
        raise ValidationFailed(f"{field} is at most {maximum} characters.")
    return cleaned


def idempotency_key(value: Any) -> str | None:
    return label(value, field="idempotency_key", maximum=IDEMPOTENCY_KEY_MAX)


def flag(value: Any, *, field: str) -> bool:
    if value is None:
        return False
    if not isinstance(value, bool):
        raise ValidationFailed(f"{field} must be true or false.")
    return value


def messages(value: Any) -> list[tuple[str, dict[str, Any]]]:
    """Return each message's normalised content and the metadata it brings, in order.

    A message is ``{role, content, name?, timestamp?}``; at most 100 per call.
    """
    if not isinstance(value, list) or not value:
        raise ValidationFailed("messages must be a non-empty list of {role, content} objects.")
    if len(value) > MESSAGES_MAX:
        raise ValidationFailed(f"At most {MESSAGES_MAX} messages per call; got {len(value)}.")
    found: list[tuple[str, dict[str, Any]]] = []
    for position, message in enumerate(value):
        where = f"messages[{position}]"
        if not isinstance(message, dict):
            raise ValidationFailed(f"{where} must be an object with role and content.")
        unknown = set(message) - {"role", "content", "name", "timestamp"}
        if unknown:
            raise ValidationFailed(
                f"{where} has unknown fields: {', '.join(sorted(map(str, unknown)))}."
            )
        role = label(message.get("role"), field=f"{where}.role", maximum=ROLE_MAX)
        if role is None:
            raise ValidationFailed(f"{where} needs a role, such as user or assistant.")
        body = text(message.get("content"), field=f"{where}.content", maximum=CONTENT_MAX)
        extra: dict[str, Any] = {"role": role, "position": position}
        name = label(message.get("name"), field=f"{where}.name")
        if name is not None:
            extra["name"] = name
        if message.get("timestamp") is not None:
            moment = timestamp(message["timestamp"], field=f"{where}.timestamp")
            extra["timestamp"] = iso(moment)
        found.append((body, extra))
    return found
