"""How much a request to a Django page may send, enforced before Django stores a byte past it.

Django's ASGI handler reads a request's whole body into a spooled temporary
file before any middleware or view runs. A client that declares a huge
``Content-Length``, or sends chunks with no length at all, fills memory and
then disk for as long as it sends: the upload view's size check, and
Django's ``DATA_UPLOAD_MAX_MEMORY_SIZE``, both come after. The MCP endpoints
read their own bodies with a cap (``asgi.read_body``); ``Capped`` puts one in
front of Django:

* The dashboard's import upload may send ``IMPORT_UPLOAD_MAX_MB`` and a
  margin for the form around the file; every other path Django's own
  ``DATA_UPLOAD_MAX_MEMORY_SIZE`` and the same margin (no other page takes
  files).
* A declared length over the cap is refused before a byte is read, with 413
  in the project's words (``error_responses``: plain text for a browser's
  page, JSON for the API, billing and webhooks). The upload view words that
  refusal itself from the header alone, so it is handed an empty body.
* A body that grows past the cap as it streams ends there: Django is told
  the client left, and the answer is the same 413.
"""

from __future__ import annotations

import json
from typing import Any

import anyio
from django.conf import settings
from django.http import HttpRequest
from starlette.types import Message, Receive, Scope, Send

from core import errors
from recall.error_responses import OAUTH_PROGRAM_PATHS, in_words

# Room for a form's other fields and the multipart framing around a file.
MARGIN = 64 * 1024
TOO_LARGE = "Request body too large."
# Django's DATA_UPLOAD_MAX_MEMORY_SIZE when it is left alone: 2.5 MiB.
DJANGO_DEFAULT = 2_621_440
# The dashboard's import upload (dashboard/urls.py), whose view words its own
# refusal (tests/test_body_limit.py checks that page, so a moved URL fails it).
UPLOAD_PATH = "/memories/import"


def _upload(path: str) -> bool:
    return path.rstrip("/") == UPLOAD_PATH


def cap(path: str) -> int:
    """The most a request to ``path`` may send, in bytes."""
    if _upload(path):
        return int(settings.IMPORT_UPLOAD_MAX_MB) * 1024 * 1024 + MARGIN
    # None switches Django's own check off; the cap stays at Django's default.
    size = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    return int(size if size is not None else DJANGO_DEFAULT) + MARGIN


class Capped:
    """An ASGI app in front of ``app`` (Django) that holds each request's body to ``cap``."""

    def __init__(self, app: Any) -> None:  # Django's ASGIHandler, typed by django-stubs its own way
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        limit = cap(path)
        declared = _declared(scope)
        if declared is not None and declared > limit:
            if _upload(path):
                await self.app(scope, _empty(), send)
            else:
                await _refuse(scope, send)
            return
        received = 0
        over = False
        started = False

        async def counted() -> Message:
            nonlocal received, over
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    over = True
                    return {"type": "http.disconnect"}
            return message

        async def watched(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        await self.app(scope, counted, watched)
        if over and not started:
            await _refuse(scope, send)


def _declared(scope: Scope) -> int | None:
    for name, value in scope.get("headers", []):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


def _empty() -> Receive:
    """A body of nothing, then no further message: Django waits on its next
    receive for the client to leave, and stops waiting when it has answered."""
    given = False

    async def receive() -> Message:
        nonlocal given
        if not given:
            given = True
            return {"type": "http.request", "body": b"", "more_body": False}
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    return receive


def _accepts_html(scope: Scope) -> bool:
    """Whether the request accepts HTML, as Django's ``HttpRequest.accepts`` reads it.

    No Accept header and ``*/*`` accept it; a q of 0 refuses it.
    """
    request = HttpRequest()
    accept = [v for k, v in scope.get("headers", []) if k == b"accept"]
    if accept:
        request.META["HTTP_ACCEPT"] = b",".join(accept).decode("latin-1")
    return request.accepts("text/html")


async def _refuse(scope: Scope, send: Send) -> None:
    path = scope.get("path", "")
    if path.startswith(OAUTH_PROGRAM_PATHS):
        oauth = {"error": "invalid_request", "error_description": TOO_LARGE}
        payload, kind = json.dumps(oauth).encode(), b"application/json"
    elif in_words(path, _accepts_html(scope)):
        payload, kind = TOO_LARGE.encode(), b"text/plain; charset=utf-8"
    else:
        body: dict[str, Any] = errors.body("validation_failed", TOO_LARGE)
        payload, kind = json.dumps(body).encode(), b"application/json"
    await send(
        {
            "type": "http.response.start",
            "status": 413,
            "headers": [
                (b"content-type", kind),
                (b"content-length", str(len(payload)).encode()),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": payload})
