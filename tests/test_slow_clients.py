"""Clients that send their request slowly are cut off, not kept forever."""

from __future__ import annotations

import json
import re
import socket
import time

import pytest

from recall.protocol import TimedH11Protocol
from tests.clients import raw_call
from tests.support import LiveServer, store_memory

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

TIMEOUT = 1.5


def dribble(port: int, request: bytes, interval: float = 0.25, limit: float = 10) -> bytes:
    """Send ``request`` a byte at a time; return what the server said before closing."""
    with socket.create_connection(("127.0.0.1", port), timeout=limit) as sock:
        deadline = time.monotonic() + limit
        sent = 0
        sock.settimeout(interval)
        while time.monotonic() < deadline:
            try:
                answer = sock.recv(4096)
            except TimeoutError:
                answer = None
            if answer is not None:
                return answer  # b"" when closed without a word
            if sent < len(request):
                try:
                    sock.sendall(request[sent : sent + 1])
                except (BrokenPipeError, ConnectionResetError):
                    return b""
                sent += 1
        raise AssertionError("the server kept a dribbling client for the whole test")


@pytest.fixture(scope="module")
def server(django_db_setup, django_db_blocker):
    with django_db_blocker.unblock():
        live = LiveServer(env={"REQUEST_TIMEOUT_SECONDS": str(TIMEOUT)}).start()
    yield live
    live.stop()


def test_a_client_dribbling_its_headers_gets_408_and_is_closed(server, cast):
    started = time.monotonic()
    answer = dribble(server.port, b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n" + b"X-Slow: " * 200)

    assert answer.startswith(b"HTTP/1.1 408")
    assert b'"code": "validation_failed"' in answer
    assert time.monotonic() - started < TIMEOUT + 3


def test_a_client_dribbling_its_body_gets_408_and_is_closed(server, cast):
    head = (
        b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Accept: application/json, text/event-stream\r\n"
        b"Authorization: Bearer " + cast.alice_key.raw.encode() + b"\r\n"
        b"Content-Length: 1000\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(head)  # the headers at once, then the body slowly
        answer = dribble_on(sock, b"{" + b" " * 999)

    assert answer.startswith(b"HTTP/1.1 408")


def dribble_on(sock: socket.socket, body: bytes, interval: float = 0.25) -> bytes:
    sock.settimeout(interval)
    for n in range(len(body)):
        try:
            answer = sock.recv(4096)
        except TimeoutError:
            answer = None
        if answer is not None:
            return answer
        try:
            sock.sendall(body[n : n + 1])
        except (BrokenPipeError, ConnectionResetError):
            return b""
    raise AssertionError("the server read a dribbled body to the end")


def test_slow_clients_do_not_hold_up_others_and_all_get_closed(server, cast):
    import threading

    answers: list[bytes] = []
    slow = [
        threading.Thread(
            target=lambda: answers.append(dribble(server.port, b"POST /mcp HTTP/1.1\r\n" * 50))
        )
        for _ in range(20)
    ]
    for thread in slow:
        thread.start()
    fast = raw_call(server.mcp_url, cast.alice_key.raw, "list_memories", {})
    for thread in slow:
        thread.join(15)

    assert fast.status_code == 200
    assert len(answers) == 20
    assert all(answer.startswith(b"HTTP/1.1 408") for answer in answers)


def test_a_slow_second_request_on_a_kept_alive_connection_gets_408(server):
    with socket.create_connection(("127.0.0.1", server.port), timeout=TIMEOUT + 5) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        first = b""
        while not first.endswith(b'{"status": "ok"}'):
            chunk = sock.recv(4096)
            assert chunk, first
            first += chunk
        assert first.startswith(b"HTTP/1.1 200")
        started = time.monotonic()
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # and no more
        answer = b""
        while chunk := sock.recv(4096):
            answer += chunk

    assert answer.startswith(b"HTTP/1.1 408")
    assert b'"code": "validation_failed"' in answer
    assert time.monotonic() - started < TIMEOUT + 3


def test_a_request_refused_before_its_body_came_in_gets_one_answer(server):
    # Refused at once (no key: 401), then, its body still dribbling in, the
    # same request was answered a second time with a 408.
    with socket.create_connection(("127.0.0.1", server.port), timeout=TIMEOUT + 5) as sock:
        sock.sendall(
            b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Accept: application/json\r\nContent-Length: 100\r\n\r\n{"
        )
        answer = b""
        deadline = time.monotonic() + TIMEOUT + 4
        while time.monotonic() < deadline:
            try:
                chunk = sock.recv(4096)
            except TimeoutError:
                break
            if not chunk:
                break
            answer += chunk

    assert answer.startswith(b"HTTP/1.1 401")
    assert answer.count(b"HTTP/1.1 ") == 1, answer


def test_a_client_that_stops_reading_its_answer_is_dropped_with_it(server, cast):
    # Its answer waited in the server's memory for as long as it liked: sixty
    # such clients held 600 MB of one worker.
    for n in range(60):
        store_memory(cast.alice, f"{n:03d} " + "word " * 6000)
    body = json.dumps(
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "tools/call",
            "params": {"name": "list_memories", "arguments": {"limit": 100}},
        }
    ).encode()
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(("127.0.0.1", server.port))
        sock.sendall(
            b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Accept: application/json\r\nMCP-Protocol-Version: 2025-11-25\r\n"
            b"Authorization: Bearer " + cast.alice_key.raw.encode() + b"\r\n"
            b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
        )
        time.sleep(TIMEOUT * 2 + 3)  # reading nothing
        received = b""
        sock.settimeout(10)
        try:
            while chunk := sock.recv(1 << 20):
                received += chunk
        except ConnectionResetError:
            pass

    # Cut off, not kept until it was read (what reached the socket before
    # the reset may be read first, or lost with it).
    head, _, answer = received.partition(b"\r\n\r\n")
    length = re.search(rb"content-length: (\d+)", head.lower())
    assert length is None or len(answer) < int(length.group(1))


class Stalled:
    """What TimedH11Protocol's stall check reads and calls, and nothing else."""

    def __init__(self, waiting: int) -> None:
        self.waiting = waiting
        self.dropped = False
        self.watching: list[int] = []
        self.transport = self

    def is_closing(self) -> bool:
        return False

    def get_write_buffer_size(self) -> int:
        return self.waiting

    def _watch(self, waiting: int) -> None:
        self.watching.append(waiting)

    def _not_reading(self) -> None:
        self.dropped = True


def test_a_client_that_reads_however_slowly_is_not_dropped():
    # The first cut dropped a client that read steadily but slower than the
    # server wrote: its timer ran from the pause to the resume.
    reading = Stalled(waiting=1_000_000)
    TimedH11Protocol._check_reading(reading, 1_200_000)
    stuck = Stalled(waiting=1_200_000)
    TimedH11Protocol._check_reading(stuck, 1_200_000)

    assert (reading.dropped, reading.watching) == (False, [1_000_000])
    assert (stuck.dropped, stuck.watching) == (True, [])
