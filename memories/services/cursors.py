"""The recent changes feed's cursors: a change named by its place in the feed.

A cursor is when the change was recorded (microseconds since the epoch)
and its history id, the tie-break between changes of one moment. The id
counts every user's changes, so it is masked with a number of the user and
the moment (review134): two of one user's cursors would otherwise tell how
many changes others made between them.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import uuid
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings

from core.errors import ValidationFailed

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# At most 18 digits each: none overflows a bigint.
_CURSOR = re.compile(r"(-?\d{1,18})\.(\d{1,18})")
_NOT_OURS = "This is not a page of your changes."


def cursor(user_id: uuid.UUID | str, row: Mapping[str, Any]) -> str:
    """Name the history row ``row`` (its ``recorded_at`` and ``id``) for ``user_id``."""
    micros = (row["recorded_at"] - _EPOCH) // timedelta(microseconds=1)
    return f"{micros}.{row['id'] ^ _mask(user_id, micros)}"


def position(user_id: uuid.UUID | str, named: str) -> tuple[datetime, int]:
    """Return the moment and history id a cursor of ``user_id`` names.

    One that is not a cursor is refused (``ValidationFailed``); another
    user's names some other place, which pages nothing of theirs.
    """
    match = _CURSOR.fullmatch(named)
    if match is None:
        raise ValidationFailed(_NOT_OURS)
    micros = int(match[1])
    try:
        moment = _EPOCH + timedelta(microseconds=micros)
    except OverflowError:
        raise ValidationFailed(_NOT_OURS) from None
    return moment, int(match[2]) ^ _mask(user_id, micros)


def _mask(user_id: uuid.UUID | str, micros: int) -> int:
    """One number per user and moment, of 56 bits: a masked id stays a positive bigint."""
    said = f"changes-cursor:{user_id}:{micros}".encode()
    digest = hmac.new(settings.SECRET_KEY.encode(), said, hashlib.sha256).digest()
    return int.from_bytes(digest[:7], "big")
