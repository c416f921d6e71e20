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
from typing import Any

from recall.errors import ValidationFailed

CONTENT_MAX = 50_000
QUERY_MAX = 10_000
NAMESPACE_MAX = 64
# Letters, digits and ``_ - . : / @``: safe in URLs, logs and tag attributes.
NAMESPACE_PATTERN = re.compile(r"[A-Za-z0-9_.:/@-]{1,64}")
METADATA_MAX_BYTES = 16_384
METADATA_MAX_DEPTH = 8
FILTER_MAX_KEYS = 8
RECALL_LIMIT_MAX = 50
LIST_LIMIT_MAX = 100
OFFSET_MAX = 1_000_000
ORDERS = ("created_at", "updated_at")


def normalize(text: str) -> str:
    text = unicodedata.normalize("NFC", text)
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    return text.strip()


def content_hash(normalized: str) -> str:
    return hashlib.sha256(normalized.encode("utf-8")).hexdigest()


def _check_storable(value: str, field: str) -> None:
    if "\x00" in value:
        raise ValidationFailed(f"{field} must not contain NUL characters.")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValidationFailed(f"{field} must be valid Unicode text.") from None


def text(value: Any, *, field: str, maximum: int) -> str:
    """Return ``value`` normalised, or raise if it is not 1..maximum characters."""
    if not isinstance(value, str):
        raise ValidationFailed(f"{field} must be a string.")
    _check_storable(value, field)
    normalized = normalize(value)
    if not normalized:
        raise ValidationFailed(f"{field} must not be empty or only whitespace.")
    if len(normalized) > maximum:
        raise ValidationFailed(
            f"{field} is {len(normalized):,} characters; the maximum is {maximum:,}."
        )
    return normalized


def content(value: Any) -> str:
    return text(value, field="content", maximum=CONTENT_MAX)


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


def order(value: Any) -> str:
    if value is None:
        return "created_at"
    if value not in ORDERS:
        raise ValidationFailed('order must be "created_at" or "updated_at".')
    return value


def memory_id(value: Any) -> uuid.UUID:
    if isinstance(value, uuid.UUID):
        return value
    if not isinstance(value, str):
        raise ValidationFailed("id must be a memory id (a UUID string).")
    try:
        return uuid.UUID(value)
    except ValueError:
        raise ValidationFailed("id must be a memory id (a UUID string).") from None


def _check_json(value: Any, depth: int) -> None:
    if depth > METADATA_MAX_DEPTH:
        raise ValidationFailed(f"metadata must not nest deeper than {METADATA_MAX_DEPTH} levels.")
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise ValidationFailed("metadata keys must be strings.")
            _check_storable(key, "metadata")
            _check_json(item, depth + 1)
    elif isinstance(value, list):
        for item in value:
            _check_json(item, depth + 1)
    elif isinstance(value, str):
        _check_storable(value, "metadata")
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise ValidationFailed("metadata numbers must be finite.")
    elif value is not None and not isinstance(value, bool | int):
        raise ValidationFailed("metadata must contain only JSON values.")


def metadata(value: Any) -> dict[str, Any]:
    """Return ``value`` if it is a JSON object within the size and depth bounds."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ValidationFailed("metadata must be a JSON object.")
    _check_json(value, 1)
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
        if not isinstance(key, str) or not key:
            raise ValidationFailed("metadata_filter keys must be non-empty strings.")
        if isinstance(item, dict | list):
            raise ValidationFailed(
                "metadata_filter values must be strings, numbers, booleans or null."
            )
    _check_json(value, 1)
    return value
