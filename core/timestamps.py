"""How every interface writes a moment: the specification's timestamp format."""

from __future__ import annotations

from datetime import UTC, datetime


def iso(moment: datetime) -> str:
    """Format as the specification does: UTC, milliseconds, ``Z``, the year in four digits."""
    utc = moment.astimezone(UTC)
    # Not strftime's %Y: on Linux it does not pad a year before 1000 ("385-07-25"),
    # which no ISO 8601 reader, our own import included, takes back.
    return f"{utc.year:04d}-{utc:%m-%dT%H:%M:%S}.{utc.microsecond // 1000:03d}Z"
