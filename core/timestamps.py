"""How every interface writes a moment: the specification's timestamp format."""

from __future__ import annotations

from datetime import UTC, datetime


def iso(moment: datetime) -> str:
    """Format as the specification does: UTC, milliseconds, ``Z``."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.") + (
        f"{moment.microsecond // 1000:03d}Z"
    )
