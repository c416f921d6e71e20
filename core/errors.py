"""The project's error vocabulary.

Services raise these; every interface (MCP tools, JSON endpoints, dashboard)
turns them into ``{"error": {"code": ..., "message": ...}}`` or its own
equivalent. Messages are written for the caller and never contain memory
content, queries, keys or exception text from below.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import psycopg
from django.db import utils as db_utils


class RecallError(Exception):
    code = "internal_error"
    http_status = 500

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.details = details

    def as_dict(self) -> dict[str, Any]:
        return body(self.code, self.message, self.details)


def body(code: str, message: str, details: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Return an error as every interface shows it: ``{"error": {"code", "message"}}``.

    With ``details``, they join the error as ``details``.
    """
    error: dict[str, Any] = {"code": code, "message": message}
    if details:
        error["details"] = dict(details)
    return {"error": error}


class ValidationFailed(RecallError):
    code = "validation_failed"
    http_status = 400


class NotFound(RecallError):
    code = "not_found"
    http_status = 404


class QuotaExceeded(RecallError):
    code = "quota_exceeded"
    http_status = 403


class Conflict(RecallError):
    code = "conflict"
    http_status = 409


class ConfirmationInvalid(RecallError):
    code = "confirmation_invalid"
    http_status = 400


class ConfirmationExpired(RecallError):
    code = "confirmation_expired"
    http_status = 400


class EmbeddingUnavailable(RecallError):
    code = "embedding_unavailable"
    http_status = 503


class RateLimited(RecallError):
    """The caller's key is out of tokens for now; see accounts/admission.py."""

    code = "rate_limited"
    http_status = 429


class Unauthorized(RecallError):
    """The API key a stdio process acts as is no longer live (revoked, or its user gone)."""

    code = "unauthorized"
    http_status = 401


class Unavailable(RecallError):
    """A dependency (the database) is down for now; the same call can succeed later."""

    code = "unavailable"
    http_status = 503


class InternalError(RecallError):
    code = "internal_error"
    http_status = 500


# Seconds a client is told to wait (Retry-After) while the database is down.
UNAVAILABLE_RETRY_AFTER = 2

# SQLSTATE classes that mean "not now" rather than "never": 08 connection
# exception, 53 insufficient resources (too many connections), 57P admin or
# crash shutdown and "the database system is starting up".
_OUTAGE_SQLSTATES = ("08", "53", "57P")


def is_outage(exc: BaseException) -> bool:
    """Return whether ``exc`` says the database is unreachable, rather than that a query is wrong.

    Django wraps psycopg's errors; the psycopg error (the cause) carries the
    SQLSTATE. A connection that failed or broke has none.
    """
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, db_utils.InterfaceError | psycopg.InterfaceError):
            return True
        if isinstance(seen, psycopg.OperationalError):
            state = seen.sqlstate
            return state is None or state.startswith(_OUTAGE_SQLSTATES)
        seen = seen.__cause__
    return False


# SQLSTATEs that mean "this transaction lost a race and was rolled back":
# 40P01 deadlock detected, 40001 serialization failure. Nothing of it was
# written, and the same call again normally succeeds.
_CONTENTION_SQLSTATES = frozenset({"40P01", "40001"})


LOST_RACE = (
    "Another change to the same memories ran at the same moment, and nothing of"
    " this call was written. Make the call again."
)


class LostRace(Conflict):
    """A write that found, part-way through, that a concurrent one changed what it relied on.

    Raised where PostgreSQL has refused a statement for it (a trigger's
    check): the transaction is rolled back whole, and the call may run
    again, as after a deadlock (the tools do, once). Shown, it is a
    ``conflict``.
    """

    def __init__(self, message: str = LOST_RACE, **details: Any) -> None:
        super().__init__(message, **details)


def is_contention(exc: BaseException) -> bool:
    """Return whether ``exc`` is a transaction rolled back to settle a race."""
    return isinstance(exc, LostRace) or _sqlstate(exc) in _CONTENTION_SQLSTATES


# SQLSTATE 57014, query_canceled: a statement_timeout, or pg_cancel_backend by
# an operator. The transaction is rolled back; the same call again may pass.
_CANCELLED = "57014"


def _sqlstate(exc: BaseException) -> str | None:
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, psycopg.Error):
            return seen.sqlstate
        seen = seen.__cause__
    return None


def database_away(exc: BaseException) -> bool:
    """Whether ``exc`` means the database cannot be reached: raised as ``unavailable`` by
    us, or an outage (``is_outage``). A cancelled statement is answered ``unavailable``
    too, but the database answered it: no outage to log once or to back off for."""
    if isinstance(exc, RecallError):
        return exc.code == Unavailable.code
    return is_outage(exc)


def from_exception(exc: BaseException) -> RecallError:
    """Return the error a client sees for ``exc``: itself, ``unavailable``, ``conflict``
    (a lost race) or ``internal_error``."""
    if isinstance(exc, RecallError):
        return exc
    if is_contention(exc):
        return Conflict(LOST_RACE)
    if is_outage(exc):
        return Unavailable("The database is unavailable right now. Retry in a few seconds.")
    if _sqlstate(exc) == _CANCELLED:
        return Unavailable(
            "The database cancelled this call's statement (a timeout, or its operator),"
            " and nothing of it was written. Retry in a few seconds."
        )
    return InternalError("Something went wrong on our side. Try again shortly.")


CODES = [
    cls.code
    for cls in (
        ValidationFailed,
        NotFound,
        QuotaExceeded,
        Conflict,
        ConfirmationInvalid,
        ConfirmationExpired,
        EmbeddingUnavailable,
        RateLimited,
        Unavailable,
        InternalError,
    )
]
