"""`recall stdio` on the wire: each line answered, answers kept at end of input, lines capped."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import threading
import time
import uuid
from pathlib import Path

import pytest
from django.conf import settings
from django.db import connection

from core import tenancy
from memories.models import Memory
from recall import asgi, stdio_transport
from tests.conftest import usage_events
from tests.test_stdio import stdio_server

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 0,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "lines", "version": "1"},
    },
}
INITIALIZED = {"jsonrpc": "2.0", "method": "notifications/initialized"}


def line(message: object) -> bytes:
    return json.dumps(message).encode() + b"\n"


def call(call_id: int, tool: str, arguments: dict) -> bytes:
    params = {"name": tool, "arguments": arguments}
    return line({"jsonrpc": "2.0", "id": call_id, "method": "tools/call", "params": params})


def ping(call_id: int) -> bytes:
    return line({"jsonrpc": "2.0", "id": call_id, "method": "ping"})


class Stdio:
    """A `recall stdio` process spoken to a line at a time, as a desktop client does."""

    def __init__(
        self, key: str, *, read_stderr: bool = True, opened: bool = True, **extra: str
    ) -> None:
        params = stdio_server(key, **extra)
        self.process = subprocess.Popen(
            [params.command, *params.args],
            env=params.env,
            cwd=params.cwd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        self.held = b""
        self.stderr: list[bytes] = []
        self.drain = threading.Thread(target=self._drain_stderr, daemon=True)
        if read_stderr:
            self.drain.start()
        if opened:
            self.open()

    def open(self) -> None:
        self.send(line(INITIALIZE))
        [ready] = self.read(1, timeout=120)
        assert ready["id"] == 0 and "result" in ready
        self.send(line(INITIALIZED))

    def _drain_stderr(self) -> None:
        assert self.process.stderr is not None
        self.stderr.extend(self.process.stderr)

    def send(self, data: bytes) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(data)
        self.process.stdin.flush()

    def read(self, count: int | None, timeout: float = 30) -> list[dict]:
        """Read ``count`` lines from stdout (None: until it ends), each one JSON."""
        assert self.process.stdout is not None
        fd = self.process.stdout.fileno()
        out: list[dict] = []
        deadline = time.monotonic() + timeout
        while count is None or len(out) < count:
            while b"\n" in self.held and (count is None or len(out) < count):
                text, self.held = self.held.split(b"\n", 1)
                out.append(json.loads(text))
            if count is not None and len(out) == count:
                break
            left = deadline - time.monotonic()
            assert left > 0, f"waited for {count} lines, got {out}"
            if select.select([fd], [], [], left)[0]:
                data = os.read(fd, 1 << 16)
                if not data:
                    assert self.held == b"", "stdout ended mid-line"
                    break
                self.held += data
        return out

    def close(self) -> int:
        assert self.process.stdin is not None
        self.process.stdin.close()
        return self.process.wait(timeout=60)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


@pytest.fixture
def stdio(cast):
    started: list[Stdio] = []

    def start(*, read_stderr: bool = True, opened: bool = True, **extra: str) -> Stdio:
        started.append(Stdio(cast.alice_key.raw, read_stderr=read_stderr, opened=opened, **extra))
        return started[-1]

    yield start
    for process in started:
        process.stop()


DEEP = b'{"a": ' * 120 + b"1" + b"}" * 120
LONG = b"9" * 5000
SURROGATE = call(12, "remember", {"content": "x"}).replace(b'"x"', b'"a\\ud800b"')
MALFORMED = [
    # (what the client sends, the error code, the id the answer echoes)
    (b"hello world\n", -32700, None),
    (b'\xff\xfe{"jsonrpc":"2.0"}\n', -32700, None),
    # Not UTF-8, with a readable id: answered under it (it was id null, and waited on).
    (call(13, "remember", {"content": "x"}).replace(b'"x"', b'"caf\xe9"'), -32700, 13),
    (b"[" * 100_000 + b"]" * 100_000 + b"\n", -32700, None),
    # Too deep, or a number too long, for safejson: answered under the id (review142).
    (call(14, "remember", {"content": "x", "metadata": "D"}).replace(b'"D"', DEEP), -32700, 14),
    (
        call(15, "remember", {"content": "x", "metadata": {"n": "N"}}).replace(b'"N"', LONG),
        -32700,
        15,
    ),
    (
        b"\xef\xbb\xbf"
        + call(16, "remember", {"content": "x", "metadata": "D"}).replace(b'"D"', DEEP),
        -32700,
        16,
    ),
    (b"\xff\xfe" + ping(17), -32700, 17),
    (SURROGATE, -32602, 12),
    (b"[" + ping(5).strip() + b"," + ping(6).strip() + b"]\n", -32600, None),
    (b"42\n", -32600, None),
    (b"null\n", -32600, None),
    (b'{"id":8,"method":"ping"}\n', -32600, 8),
    (b'{"jsonrpc":"1.0","id":9,"method":"ping"}\n', -32600, 9),
    (b'{"jsonrpc":"2.0","id":1.5,"method":"ping"}\n', -32600, None),
    (b'{"jsonrpc":"2.0","id":null,"method":"ping"}\n', -32600, None),
    (b'{"jsonrpc":"2.0","id":{},"method":"ping"}\n', -32600, None),
    (b'{"jsonrpc":"2.0","id":11,"method":"tools/call","params":[1,2]}\n', -32602, 11),
]


def test_each_malformed_line_gets_a_json_rpc_error_and_serving_goes_on(stdio):
    process = stdio()

    for sent, code, call_id in MALFORMED:
        process.send(sent)
        [answer] = process.read(1)

        assert (answer["id"], answer["error"]["code"]) == (call_id, code), sent[:60]
        assert answer["error"]["data"]["error"]["code"] == "validation_failed"
    process.send(ping(99))
    assert process.read(1) == [{"jsonrpc": "2.0", "id": 99, "result": {}}]
    with tenancy.operator():
        assert not Memory.objects.exists()
    # Blank lines carry no message, so they get no answer either.
    process.send(b"\n  \n" + ping(100))
    assert process.read(1)[0]["id"] == 100


def test_a_refusal_the_sdk_writes_is_in_our_words_as_over_http(stdio):
    # They were {"message": "Method not found", "data": "bogus/method"} and
    # "Invalid request parameters" with data "": the SDK's words, no error code.
    process = stdio()
    sent = [
        ({"method": "bogus/method"}, -32601, "Method not found: 'bogus/method' is not a"),
        ({"method": "resources/read", "params": {}}, -32602, "Invalid params for 'resources/read'"),
    ]

    for number, (request, code, words) in enumerate(sent, start=20):
        process.send(line({"jsonrpc": "2.0", "id": number, **request}))
        [answer] = process.read(1)

        assert (answer["id"], answer["error"]["code"]) == (number, code)
        assert answer["error"]["message"].startswith(words)
        assert answer["error"]["data"]["error"] == {
            "code": "validation_failed",
            "message": answer["error"]["message"],
        }


def test_a_request_before_the_handshake_is_told_to_open_the_session(stdio):
    # It was "Invalid params for 'tools/call': it takes name and arguments.", of a
    # request that held both: the SDK refuses a request before initialize as bad params.
    process = stdio(opened=False)

    process.send(call(30, "health_check", {}))
    [refused] = process.read(1, timeout=120)
    process.open()
    process.send(call(31, "health_check", {}))
    [answered] = process.read(1)

    assert (refused["id"], refused["error"]["code"]) == (30, -32602)
    assert refused["error"]["message"].startswith("The session is not open: send initialize")
    assert answered["id"] == 31 and "result" in answered
    # The refused call is no tool call: one usage event, the answered one's
    # (waiting a little for a second that should never come).
    events = usage_events(2, timeout=5)
    assert [(e.tool_name, e.success) for e in events] == [("health_check", True)]


def test_a_burst_of_calls_takes_a_few_database_connections_not_one_each(stdio):
    # anyio's default of 40 threads, each with its own connection, let one
    # client's burst take 40 of the embedded database's 100 connections
    # beside a server's: calls failed "unavailable" ("too many clients").
    name = f"stdio-burst-{uuid.uuid4().hex[:8]}"
    process = stdio(PGAPPNAME=name, JOB_WORKERS="0", RATE_LIMIT_FREE="1000/min")
    burst = 24

    process.send(b"".join(call(200 + n, "recall", {"query": f"tea {n}"}) for n in range(burst)))
    answers = process.read(burst, timeout=120)

    assert sorted(a["id"] for a in answers) == list(range(200, 200 + burst))
    assert all("result" in a and not a["result"]["isError"] for a in answers), answers[0]
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", [name])
        (held,) = cursor.fetchone()
    # The tool threads', and those of the main thread, the listener, the
    # usage recorder, maintenance and the stall watch's check (27 before).
    assert held <= settings.STDIO_WORKER_THREADS + 5


def test_a_client_that_never_reads_stderr_is_still_answered(stdio):
    # MCP lets a client ignore the server's stderr. One that pipes it and
    # never reads it filled the pipe's 64 KiB with a log line per call, and
    # after about 150 calls the server stopped answering on stdout.
    process = stdio(read_stderr=False, LOG_LEVEL="debug", RATE_LIMIT_FREE="100000/min")
    assert process.process.stderr is not None
    pipe = process.process.stderr.fileno()
    calls = 600

    for start in range(0, calls, 100):
        batch = range(1000 + start, 1100 + start)
        process.send(b"".join(call(n, "recall", {"query": f"tea {n}"}) for n in batch))
        answers = process.read(len(batch), timeout=120)
        assert sorted(a["id"] for a in answers) == list(batch)

    # The log was written until the pipe filled, then dropped, and the lines
    # say so once someone reads again.
    read = b""
    while select.select([pipe], [], [], 1)[0]:
        read += os.read(pipe, 1 << 16)
    assert len(read) >= 32 << 10
    process.send(call(9, "recall", {"query": "tea"}))
    [answer] = process.read(1)
    assert answer["id"] == 9 and not answer["result"]["isError"]
    deadline = time.monotonic() + 10
    while b"dropped" not in read and time.monotonic() < deadline:
        if select.select([pipe], [], [], 0.2)[0]:
            read += os.read(pipe, 1 << 16)
    assert b"log lines were dropped: stderr was not being read" in read


def test_requests_in_flight_when_stdin_closes_are_answered(stdio):
    process = stdio()

    process.send(
        b"".join(call(n, "list_memories", {}) for n in range(1, 6))
        + call(6, "remember", {"content": "The user writes Rust at work."})
    )
    returncode = process.close()

    answers = process.read(None)
    assert sorted(answer["id"] for answer in answers) == [1, 2, 3, 4, 5, 6]
    assert all(answer["result"]["isError"] is False for answer in answers)
    assert returncode == 0
    with tenancy.operator():
        assert list(Memory.objects.values_list("content", flat=True)) == [
            "The user writes Rust at work."
        ]


def test_a_line_over_the_cap_is_refused_as_it_grows_and_skipped_to_its_newline(stdio):
    process = stdio()
    megabyte = b"x" * (1 << 20)
    before = resident_bytes(process.process.pid)

    for _ in range(64):
        process.send(megabyte)
    [answer] = process.read(1)

    assert answer["id"] is None
    assert answer["error"]["code"] == -32600
    assert "line" in answer["error"]["message"]
    # 64 MiB sent, none of it held.
    assert resident_bytes(process.process.pid) - before < 16 << 20
    process.send(megabyte + b"\n" + ping(7))
    assert process.read(1) == [{"jsonrpc": "2.0", "id": 7, "result": {}}]


def test_a_request_over_the_cap_is_refused_under_its_own_id(stdio):
    # It was answered with id null, so the client's call waited for ever.
    process = stdio()
    content = "x" * (2 << 20)

    process.send(call(31, "remember", {"content": content}))
    [answer] = process.read(1)

    assert answer["id"] == 31
    assert answer["error"]["code"] == -32600
    assert answer["error"]["message"].startswith("Message too large")
    process.send(ping(32))
    assert process.read(1) == [{"jsonrpc": "2.0", "id": 32, "result": {}}]


@pytest.mark.parametrize(
    ("head", "found"),
    [
        (b'{"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {', 7),
        (b'{"method":"tools/call","jsonrpc":"2.0","id":"a\\"b","params":{', 'a"b'),
        (b'  {"id": -3}', -3),
        # An "id" inside params is a parameter's, not the request's.
        (b'{"jsonrpc": "2.0", "params": {"id": 9}, "id": 4', None),
        (b'{"jsonrpc": "2.0", "id": 1.5, "method": "x"', None),
        (b'{"jsonrpc": "2.0", "id": true, "method": "x"', None),
        (b'{"jsonrpc": "2.0", "id": 12', None),  # cut before the id ends
        (b"[" * 5000, None),
    ],
)
def test_the_id_of_a_line_too_long_is_read_only_from_its_opening(head, found):
    assert stdio_transport.leading_id(head) == found


def test_a_request_written_id_last_is_refused_under_its_id_at_its_end(stdio):
    # The TypeScript SDK writes "method" and "params" first, "id" last.
    process = stdio()
    params = {"name": "remember", "arguments": {"content": "y" * (2 << 20)}}
    line = json.dumps({"method": "tools/call", "params": params, "jsonrpc": "2.0", "id": 41})

    process.send(line.encode() + b"\n")
    [answer] = process.read(1)

    assert answer["id"] == 41
    assert answer["error"]["message"].startswith("Message too large")


@pytest.mark.parametrize(
    ("head", "tail", "found"),
    [
        (b'{"method":"tools/call","params":{"a":"', b'xx"},"jsonrpc":"2.0","id":41}', 41),
        (b'{"jsonrpc":"2.0","method":"x","params":{"', b'"},"id":"k-9"} ', "k-9"),
        # A parameter's "id" closing a nested object is not the message's.
        (b'{"method":"x","params":{"', b'"id":3}}', None),
        # A response carries the client's id space, not a request to answer.
        (b'{"jsonrpc":"2.0","id":5,"result":{"', b'"}}', None),
        (b'{"result":{"', b'"},"jsonrpc":"2.0","id":5}', None),
    ],
)
def test_the_id_of_a_line_too_long_is_read_from_either_end(head, tail, found):
    assert stdio_transport.Overlong(head, tail).call_id() == found


def test_the_line_cap_is_the_http_body_cap():
    assert stdio_transport.MAX_LINE_BYTES == asgi.MAX_BODY_BYTES


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_ctrl_c_or_sigterm_stops_an_idle_process_cleanly(stdio, signum):
    process = stdio()

    process.process.send_signal(signum)

    assert process.process.wait(timeout=15) == 0
    assert process.read(None) == []
    process.drain.join(timeout=5)
    stderr = b"".join(process.stderr)
    assert b"Traceback" not in stderr
    assert b"KeyboardInterrupt" not in stderr


def resident_bytes(pid: int) -> int:
    status = Path(f"/proc/{pid}/status")
    if not status.exists():
        pytest.skip("needs /proc to read the process's memory")
    for row in status.read_text().splitlines():
        if row.startswith("VmRSS:"):
            return int(row.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc status")


def test_calls_in_flight_when_sigterm_arrives_each_leave_one_usage_event(stdio):
    # The calls the stop cancelled were logged as started, never finished, and
    # left no usage event: every tool call made leaves exactly one.
    process = stdio()
    process.send(
        b"".join(
            call(n, "remember", {"content": f"Fact number {n} to keep."}) for n in range(1, 31)
        )
    )
    process.read(1, timeout=120)  # the calls are running (the free tier refuses the 11th on)

    process.process.send_signal(signal.SIGTERM)

    assert process.process.wait(timeout=60) == 0
    process.drain.join(timeout=10)
    logged = [json.loads(row) for row in b"".join(process.stderr).decode().splitlines()]
    said = [row["event"] for row in logged]
    started, limited = said.count("tool call started"), said.count("rate limited")
    assert said.count("tool call finished") == started >= 1
    events = usage_events(started + limited)
    ran = [event for event in events if event.error_code != "rate_limited"]
    assert len(ran) == started and len(events) == started + limited
