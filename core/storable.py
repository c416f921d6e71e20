"""Strings from outside, checked before PostgreSQL sees them.

PostgreSQL refuses three kinds of string that JSON and HTTP happily carry: one
holding a NUL character (``\\u0000``), one that is not valid Unicode (an
unpaired surrogate such as ``\\ud800``, which cannot be encoded as UTF-8), and,
in a ``varchar(n)`` column, one longer than n. Each fails the statement
halfway through a request: a 500, and for a webhook, days of retries.
``text()`` refuses such a string up front, with a message naming the field and
never quoting the value.
"""

from __future__ import annotations

import unicodedata
from typing import Any

from core.errors import ValidationFailed


def problem(value: str, *, max_length: int | None = None) -> str | None:
    """Return why PostgreSQL would refuse ``value`` (in a column of ``max_length``), or None."""
    if "\x00" in value:
        return "must not contain NUL characters"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return "must be valid Unicode text"
    if max_length is not None and len(value) > max_length:
        return f"must be at most {max_length:,} characters"
    return None


def text(value: str, *, field: str, max_length: int | None = None) -> str:
    """Return ``value`` if PostgreSQL can store it; else raise ValidationFailed naming ``field``."""
    why = problem(value, max_length=max_length)
    if why is not None:
        raise ValidationFailed(f"{field} {why}.")
    return value


# Characters that override the direction text is shown in: in a name they
# make it read as something else ("research" + U+202E reversed the words
# after it on the page that showed it). The marks right-to-left names use
# (U+200E, U+200F, U+061C) are left alone.
_DIRECTION = frozenset("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


def name(value: str, *, field: str) -> str:
    """Return a name ``value`` unless it holds a control character (C0, DEL, C1; not
    whitespace) or a direction override."""
    for char in value:
        if char in _DIRECTION or (unicodedata.category(char) == "Cc" and char not in "\t\n\r"):
            raise ValidationFailed(f"{field} must not hold control or text-direction characters.")
    return value


def column_length(model: Any, name: str) -> int:
    """Return the declared length of a model's ``varchar`` column: one place for each limit."""
    length = model._meta.get_field(name).max_length
    if length is None:
        raise ValueError(f"{model.__name__}.{name} has no maximum length")
    return int(length)


def scrub(value: object, *, max_length: int) -> str:
    """Return a loggable, storable rendering of an untrusted value: for records of refusals.

    At most ``max_length`` characters; a NUL or a lone surrogate shows as
    U+FFFD, so that what is recorded never passes for a value sent without
    one (a tool named "remember\\x00" is not recorded as ``remember``).
    """
    text = value if isinstance(value, str) else ""
    return "".join(
        "\ufffd" if ch == "\x00" or "\ud800" <= ch <= "\udfff" else ch for ch in text[:max_length]
    )
