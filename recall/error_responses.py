"""Django's answers to two failures that are not bugs: a database outage and an oversized body.

Without this, both become error-level log lines that any client can cause at
will, and the first a 500: during an outage every dashboard page, key API
call and webhook that reached the database answered 500 with Django's error
page, and every webhook body over Django's upload limit logged
``django.security.RequestDataTooBig`` at error level.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, HttpResponse, HttpResponseBase, JsonResponse

from core import errors, outage

logger = logging.getLogger("recall.http")


class ErrorResponseMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponseBase]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponseBase:
        return self.get_response(request)

    def process_exception(self, request: HttpRequest, exc: Exception) -> HttpResponse | None:
        if isinstance(exc, RequestDataTooBig):
            logger.info("request body too large", extra={"path": request.path[:200]})
            return _error(request, 413, "validation_failed", "Request body too large.")
        if errors.is_outage(exc):
            outage.note("django", exc)
            wait = errors.UNAVAILABLE_RETRY_AFTER
            response = _error(
                request,
                503,
                errors.Unavailable.code,
                f"The service is unavailable right now. Retry in {wait} s.",
            )
            response["Retry-After"] = str(wait)
            # outage.note() has logged it, once per outage; Django would log
            # every 503 at error level again.
            response._has_been_logged = True  # type: ignore[attr-defined]
            return response
        return None


# Paths whose callers are programs: their errors are JSON, whatever they accept.
API_PREFIXES = ("/api/", "/billing/", "/webhooks/")


def in_words(path: str, accepts_html: bool) -> bool:
    """Whether an error on ``path`` is plain text (a browser's page), else JSON."""
    return accepts_html and not path.startswith(API_PREFIXES)


def _error(request: HttpRequest, status: int, code: str, message: str) -> HttpResponse:
    if in_words(request.path, request.accepts("text/html")):
        return HttpResponse(message, status=status, content_type="text/plain; charset=utf-8")
    return JsonResponse(errors.body(code, message), status=status)
