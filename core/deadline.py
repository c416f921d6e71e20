"""A deadline on a whole HTTP exchange with an OpenAI-compatible server.

Imported where the SDK is, when a client is made: httpx2 imports the standard
library's http, which a script run from bench/ finds as bench/http.py.

The SDK's ``timeout`` bounds each read of the socket, not the request: a
server that sends its answer a few bytes at a time, each sooner than the
timeout, held a tool call (and a worker thread) for as long as it kept
sending. ``client(seconds)`` is the SDK's own HTTP client with a transport
that fails the exchange once ``seconds`` have passed since it began, headers
and body alike, as a read timeout: the SDK retries it as one, and then says
the server did not answer in time.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx2


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


class DeadlineTransport(httpx2.HTTPTransport):
    """An HTTP transport whose every exchange ends within ``seconds``."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self._seconds = seconds

    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        until = time.monotonic() + self._seconds
        response = super().handle_request(request)
        try:
            _check(until, request)
        except httpx2.ReadTimeout:
            response.close()
            raise
        assert isinstance(response.stream, httpx2.SyncByteStream)
        response.stream = _Until(response.stream, until, request)
        return response


def client(seconds: float) -> httpx2.Client:
    """The OpenAI SDK's HTTP client, its exchanges each bounded by ``seconds`` in all."""
    from openai import DefaultHttpxClient

    return DefaultHttpxClient(transport=DeadlineTransport(seconds), timeout=seconds)
