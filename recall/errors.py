"""The project's error vocabulary.

Services raise these; every interface (MCP tools, JSON endpoints, dashboard)
turns them into ``{"error": {"code": ..., "message": ...}}`` or its own
equivalent. Messages are written for the caller and never contain memory
content, queries, keys or exception text from below.
"""

from __future__ import annotations

from typing import Any


class RecallError(Exception):
    code = "internal_error"
    http_status = 500

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.details = details

    def as_dict(self) -> dict[str, Any]:
        error: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.details:
            error["details"] = self.details
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


class InternalError(RecallError):
    code = "internal_error"
    http_status = 500


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
        InternalError,
    )
]
