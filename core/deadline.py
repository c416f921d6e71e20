"""A deadline on the answer of an OpenAI-compatible server, however slowly it comes.

Imported where the SDK is, when a client is made: httpx2 imports the standard
library's http, which a script run from bench/ finds as bench/http.py.

The SDK's ``timeout`` bounds each read of the socket, not the request: a
server that sends its answer a few bytes at a time, each sooner than the
timeout, held a tool call (and a worker thread) for as long as it kept
sending. ``client(seconds)`` is the SDK's own HTTP client (its proxies from
the environment, its connection limits) with two event hooks: the request's
start is noted, and once the headers are in, reading the body fails as a
read timeout when ``seconds`` have passed since it began; the SDK retries it
as one, and then says the server did not answer in time. The headers
themselves are bounded per read, as before: a server that sends them a byte
at a time is not one an operator points Recall at.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx2

_UNTIL = "recall_until"


class _Until(httpx2.SyncByteStream):
    """A response body that stops with a read timeout once its exchange's time is up."""

    def __init__(self, inner: httpx2.SyncByteStream, until: float, request: httpx2.Request):
        self._inner = inner
        self._until = until
        self._request = request

    def __iter__(self) -> Iterator[bytes]:
        for chunk in self._inner:
            _check(self._until, self._request)
            yield chunk

    def close(self) -> None:
        self._inner.close()


def _check(until: float, request: httpx2.Request) -> None:
    if time.monotonic() > until:
        raise httpx2.ReadTimeout("The answer took longer than the request may.", request=request)


def client(seconds: float) -> httpx2.Client:
    """The OpenAI SDK's HTTP client, each answer read within ``seconds`` of its request."""
    from openai import DefaultHttpxClient

    def started(request: httpx2.Request) -> None:
        request.extensions[_UNTIL] = time.monotonic() + seconds

    def bounded(response: httpx2.Response) -> None:
        request = response.request
        until = float(request.extensions.get(_UNTIL, time.monotonic() + seconds))
        _check(until, request)
        assert isinstance(response.stream, httpx2.SyncByteStream)
        response.stream = _Until(response.stream, until, request)

    return DefaultHttpxClient(
        timeout=seconds, event_hooks={"request": [started], "response": [bounded]}
    )
