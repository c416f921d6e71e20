"""uvicorn's HTTP/1.1 protocol with a deadline for receiving each request, and no Nagle delay.

uvicorn times out idle keep-alive connections, but not a client that sends
its request slowly: fifty connections dribbling a byte a second stayed open
for as long as they liked. Here each request, headers and body, must arrive
within ``REQUEST_TIMEOUT_SECONDS`` of its first byte (or of the connection
opening). Past that the client gets a 408 in our JSON error shape, unless the
response to that request has already begun (or was sent before its body came
in), and the connection is closed. A client whose response waits in memory
must read some of it in each such span, or its connection is dropped with
the response.

Every accepted TCP connection also gets ``TCP_NODELAY``. asyncio sets it
itself only on sockets whose ``proto`` is ``IPPROTO_TCP``; with ``--workers``
uvicorn binds the shared socket as ``socket.socket(family=...)``, proto 0, and
the connections it accepts inherit that, so they kept Nagle's algorithm. A
response goes out in two writes (headers, then body): the second waited for
the client to acknowledge the first, and a client on a kept-alive connection
delays that acknowledgement by up to 40 ms. Every call on a reused
connection took about 45 ms more than the same call on a new one
(``BENCHMARKS.md``, "Keep-alive").

`recall serve` and the tests' servers run uvicorn with ``--http
recall.protocol:TimedH11Protocol``.

A request may name its target in absolute form (``POST http://host/mcp
HTTP/1.1``), as a client talking through a forward proxy does; HTTP/1.1
servers must accept it (RFC 9112, 3.2.2). uvicorn passes the whole URI on as
the path, and every route missed it: ``origin_form`` gives the app the path
alone and the target's authority as the Host, as that section says.
"""

from __future__ import annotations

import asyncio
import json
import socket
from typing import Any
from urllib.parse import unquote, urlsplit

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from recall import jsonrpc

# A JSON-RPC error in our vocabulary, as every other refusal of the gate's.
_BODY = json.dumps(
    jsonrpc.refusal("validation_failed", "The request took too long to arrive.")
).encode()
TIMEOUT_RESPONSE = (
    b"HTTP/1.1 408 Request Timeout\r\n"
    b"content-type: application/json\r\n"
    b"content-length: " + str(len(_BODY)).encode() + b"\r\n"
    b"connection: close\r\n\r\n" + _BODY
)


class TimedH11Protocol(H11Protocol):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        from django.conf import settings

        self.request_timeout: float = settings.REQUEST_TIMEOUT_SECONDS
        self._deadline: asyncio.TimerHandle | None = None
        self._stalled: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        no_delay(transport)
        super().connection_made(transport)
        self._arm()  # a connection that never sends a whole request

    def data_received(self, data: bytes) -> None:
        if self._deadline is None:
            self._arm()  # the first bytes of the next request on this connection
        super().data_received(data)
        if self.conn.their_state in (h11.DONE, h11.MUST_CLOSE, h11.CLOSED, h11.ERROR):
            self._disarm()  # the whole request is in

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self._unstall()
        super().connection_lost(exc)

    def pause_writing(self) -> None:
        # The client reads slower than we write, and the response waits in
        # memory. Each REQUEST_TIMEOUT_SECONDS it must have taken some of it;
        # one that took nothing in that long goes, and the memory with it.
        super().pause_writing()
        self._unstall()
        self._watch(self.transport.get_write_buffer_size())

    def resume_writing(self) -> None:
        self._unstall()
        super().resume_writing()

    def _watch(self, waiting: int) -> None:
        self._stalled = self.loop.call_later(self.request_timeout, self._check_reading, waiting)

    def _check_reading(self, waiting: int) -> None:
        self._stalled = None
        if self.transport.is_closing():
            return
        now = self.transport.get_write_buffer_size()
        if now < waiting:
            self._watch(now)  # it is reading, however slowly
        else:
            self._not_reading()

    def _unstall(self) -> None:
        if self._stalled is not None:
            self._stalled.cancel()
            self._stalled = None

    def _not_reading(self) -> None:
        self.logger.info("response not read in time: closing a stalled connection")
        self.transport.abort()

    def _arm(self) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(self.request_timeout, self._timed_out)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _timed_out(self) -> None:
        self._deadline = None
        if self.transport.is_closing():
            return
        self.logger.info("request timed out: closing a slow connection")
        # On a kept-alive connection, the cycle is the last request's, answered,
        # and the client is sending the next one. A request answered early (a
        # refusal before its body was read) has had its one response.
        cycle = self.cycle
        answered_early = (
            cycle is not None and cycle.response_complete and self.conn.their_state == h11.SEND_BODY
        )
        if (
            cycle is None
            or not cycle.response_started
            or (cycle.response_complete and not answered_early)
        ):
            self.transport.write(TIMEOUT_RESPONSE)
        self.transport.close()


def no_delay(transport: asyncio.BaseTransport) -> None:
    """Turn Nagle's algorithm off on a TCP connection, whatever ``proto`` its socket reports."""
    sock = transport.get_extra_info("socket")
    if (
        sock is not None
        and sock.family in (socket.AF_INET, socket.AF_INET6)
        and sock.type == socket.SOCK_STREAM
    ):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class BadTarget(ValueError):
    """An absolute-form request target this server cannot take."""


def origin_form(scope: dict[str, Any]) -> dict[str, Any]:
    """Return ``scope`` with an absolute-form target (``http://host/path``) as its path alone.

    The target's authority replaces the Host header (RFC 9112, 3.2.2), so the
    Host checks apply to the name the client asked for. A target with user
    information, or with no host, raises ``BadTarget``.
    """
    raw = scope.get("raw_path") or scope.get("path", "").encode("latin-1")
    if not raw[:8].lower().startswith((b"http://", b"https://")):
        return scope
    target = urlsplit(raw.decode("latin-1"))
    if not target.netloc or "@" in target.netloc:
        raise BadTarget("The request target names no host, or holds credentials.")
    path = target.path or "/"
    headers = [(name, value) for name, value in scope["headers"] if name != b"host"]
    headers.append((b"host", target.netloc.encode("latin-1")))
    return {
        **scope,
        "path": unquote(path),
        "raw_path": path.encode("latin-1"),
        "headers": headers,
    }
