"""A call on a kept-alive connection costs what it costs on a new one, in every server mode.

With ``--workers``, uvicorn binds the shared socket with proto 0; asyncio then
left Nagle's algorithm on for every connection it accepted, and each response's
second write waited for the client's delayed acknowledgement: about 45 ms on
every call of every MCP client, which all keep their connection alive.
"""

from __future__ import annotations

import asyncio
import socket
import statistics
import time
from collections.abc import Iterator

import pytest
import uvicorn
from uvicorn.server import ServerState

from recall.protocol import TimedH11Protocol
from tests.support import LiveServer

REQUEST = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
SAMPLES = 30


def uvicorn_style_socket() -> socket.socket:
    """A listening socket made as uvicorn makes it for several workers: proto 0."""
    sock = socket.socket(family=socket.AF_INET)
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    assert sock.proto == 0
    return sock


def test_the_protocol_turns_nagle_off_on_connections_a_proto_0_socket_accepts():
    config = uvicorn.Config(app=lambda scope, receive, send: None, lifespan="off")
    config.load()
    seen: list[int] = []

    class Recording(TimedH11Protocol):
        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            sock = transport.get_extra_info("socket")
            seen.append(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            transport.close()

    async def accept_one() -> None:
        listening = uvicorn_style_socket()
        server = await asyncio.get_running_loop().create_server(
            lambda: Recording(config=config, server_state=ServerState(), app_state={}),
            sock=listening,
        )
        async with server:
            port = listening.getsockname()[1]
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            for _ in range(100):
                if seen:
                    break
                await asyncio.sleep(0.01)
            writer.close()

    asyncio.run(accept_one())

    assert seen == [1]


def read_response(sock: socket.socket) -> None:
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    [length] = [
        int(line.split(b":")[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length")
    ]
    while len(body) < length:
        body += sock.recv(65536)


def connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # the client adds no delay
    return sock


def kept_alive_and_cold(port: int) -> tuple[float, float]:
    """Median ms of a request on one reused connection, and of one on a new connection each."""
    reused, cold = [], []
    with connect(port) as sock:
        for _ in range(3):  # the connection's first requests are acknowledged at once
            sock.sendall(REQUEST)
            read_response(sock)
        for _ in range(SAMPLES):
            started = time.perf_counter()
            sock.sendall(REQUEST)
            read_response(sock)
            reused.append(time.perf_counter() - started)
    for _ in range(SAMPLES):
        started = time.perf_counter()
        with connect(port) as sock:
            sock.sendall(REQUEST)
            read_response(sock)
        cold.append(time.perf_counter() - started)
    return statistics.median(reused) * 1000, statistics.median(cold) * 1000


@pytest.fixture(scope="module", params=[1, 2], ids=["one process", "two workers"])
def server(request, django_db_setup, django_db_blocker) -> Iterator[LiveServer]:
    with django_db_blocker.unblock():
        live = LiveServer(workers=request.param if request.param > 1 else None).start()
    yield live
    live.stop()


@pytest.mark.slow
def test_a_kept_alive_request_carries_no_delayed_ack_gap(server):
    reused, cold = kept_alive_and_cold(server.port)

    # A reused connection skips the handshake, so it is cheaper if anything;
    # with Nagle on it was 10-15 times dearer (48 ms against 3-6).
    assert reused < 2 * cold, f"kept alive {reused:.1f} ms, new connection {cold:.1f} ms"
