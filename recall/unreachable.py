"""Say in one line that a command cannot reach its database, instead of a traceback.

Every ``recall`` command that needs the database met a wrong DATABASE_URL
(a closed port, a wrong password) with Django's and psycopg's whole stack.
The line names where the database was looked for and what PostgreSQL or the
network said, never the URL itself: it may hold the password.
"""

from __future__ import annotations

import re

from django.conf import settings

from core import errors

# psycopg's wording around libpq's reason: 'connection failed: connection to
# server at "127.0.0.1", port 1 failed: Connection refused' (and "FATAL:  ...").
_PREFIXES = re.compile(r"^(connection failed: )?(connection to server (at|on) .*? failed: )?")
_SEVERITY = re.compile(r"^(FATAL|ERROR):\s+")


def describe(exc: BaseException) -> str | None:
    """Return the line for a database that cannot be reached, or None if ``exc`` is not that."""
    if not errors.is_outage(exc):
        return None
    reason = _reason(exc)
    if settings.EMBEDDED_DATABASE:
        return (
            f"cannot reach the embedded PostgreSQL in RECALL_DATA_DIR ({reason}):"
            " look at pgdata/log in the data directory for why it did not start."
        )
    return (
        f"cannot reach the database in DATABASE_URL ({reason}):"
        " check its host, port, user and password, and that the server is up."
    )


def _reason(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    if not lines:
        return type(exc).__name__
    reason = _SEVERITY.sub("", _PREFIXES.sub("", lines[0].strip())).strip()
    if not reason:
        return type(exc).__name__
    # "Connection refused" reads as part of the sentence: "(connection refused)".
    return reason[0].lower() + reason[1:] if reason[1:2].islower() else reason
