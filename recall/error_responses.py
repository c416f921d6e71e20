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
from django.db import DataError
from django.http import HttpRequest, HttpResponse, HttpResponseBase, JsonResponse

from core import errors, outage

logger = logging.getLogger("recall.http")


class ErrorResponseMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponseBase]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponseBase:
        try:
            refused = _holds_nul(request)
        except RequestDataTooBig:
            refused = False  # the view's own read raises it again, answered 413 below
        if refused:
            # PostgreSQL stores no NUL character: a lookup with one failed in
            # the driver, a 500 on the OAuth endpoints and the admin's filters.
            return _error(request, 400, "validation_failed", NUL_REFUSED)
        return self.get_response(request)

    def process_exception(self, request: HttpRequest, exc: Exception) -> HttpResponse | None:
        if isinstance(exc, DataError) and _holds_nul(request, parsed=True):
            # A multipart form's NUL, read by the view (the check above reads
            # urlencoded bodies only): the driver refused it.
            return _error(request, 400, "validation_failed", NUL_REFUSED)
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


NUL_REFUSED = "Request parameters must not contain NUL characters."


def _holds_nul(request: HttpRequest, *, parsed: bool = False) -> bool:
    """Whether the path, the query or a form field holds a NUL character.

    A multipart body (an upload) is the view's to parse, with its own
    handlers and limits: it is read here only once the view has (``parsed``).
    """
    if "\x00" in request.path:
        return True
    fields = [request.GET]
    urlencoded = request.content_type == "application/x-www-form-urlencoded"
    if urlencoded or (parsed and request.method == "POST" and hasattr(request, "_post")):
        fields.append(request.POST)
    return any(
        "\x00" in key or any("\x00" in value for value in values)
        for query in fields
        for key, values in query.lists()
    )


# Paths whose callers are programs: their errors are JSON, whatever they accept.
API_PREFIXES = ("/api/", "/billing/", "/webhooks/")


def in_words(path: str, accepts_html: bool) -> bool:
    """Whether an error on ``path`` is plain text (a browser's page), else JSON."""
    return accepts_html and not path.startswith(API_PREFIXES)


# OAuth endpoints a client program calls: their errors are OAuth's own JSON
# (RFC 6749 section 5.2, RFC 7591 section 3.2.2, RFC 7009 section 2.2.1),
# whatever the client accepts.
OAUTH_PROGRAM_PATHS = ("/oauth/token/", "/oauth/register/", "/oauth/revoke/")


def _error(request: HttpRequest, status: int, code: str, message: str) -> HttpResponse:
    if request.path.startswith(OAUTH_PROGRAM_PATHS) and status in (400, 413):
        oauth = {"error": "invalid_request", "error_description": message}
        return JsonResponse(oauth, status=status)
    if in_words(request.path, request.accepts("text/html")):
        return HttpResponse(message, status=status, content_type="text/plain; charset=utf-8")
    return JsonResponse(errors.body(code, message), status=status)
