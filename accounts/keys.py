"""API key format, generation and hashing.

A key is ``recall_live_`` followed by 32 URL-safe base64 characters (24 random
bytes from ``secrets``). The database holds only an HMAC-SHA256 of the whole
key under ``API_KEY_SECRET`` plus a display prefix used to find the row; the
key itself is shown once, when it is issued.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets

from django.conf import settings

KEY_PREFIX = "recall_live_"
# The prefix plus 8 random characters: enough to tell keys apart in a list and
# to find the row (48 bits), far too little to guess the rest.
DISPLAY_LENGTH = len(KEY_PREFIX) + 8
KEY_PATTERN = re.compile(r"recall_live_[A-Za-z0-9_-]{32}")


def generate() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(24)


def is_well_formed(raw: str) -> bool:
    return KEY_PATTERN.fullmatch(raw) is not None


def display_prefix(raw: str) -> str:
    return raw[:DISPLAY_LENGTH]


def current_secret() -> str:
    return settings.API_KEY_SECRET


def digest(raw: str, secret: str | None = None) -> str:
    key = (secret or current_secret()).encode()
    return hmac.new(key, raw.encode(), hashlib.sha256).hexdigest()


def matching_secret(raw: str, stored: str) -> str | None:
    """Return which configured secret produced ``stored``, or None.

    Tries the current secret, then each fallback, in constant time per
    comparison, the way Django's token generator walks ``SECRET_KEY_FALLBACKS``.
    """
    for secret in [current_secret(), *settings.API_KEY_SECRET_FALLBACKS]:
        if hmac.compare_digest(digest(raw, secret), stored):
            return secret
    return None
