"""The stdio transport: one JSON-RPC message per line, stdin in and stdout out.

``recall stdio`` serves through this rather than the SDK's stdio transport,
which leaves three gaps:

* A line that is not one JSON-RPC 2.0 message reaches the SDK's dispatcher
  as an exception, which it only logs, so the client waits forever. Here each
  line goes through the HTTP gate's parser (``recall/jsonrpc.py``), and a
  refused one is answered on stdout with the gate's body: -32700 for what is
  not JSON (a lone surrogate escape included, as pydantic-core refuses it),
  -32600 for what is not one message, -32602 for params that are not an
  object.
* It holds a line whole, however long. Here a line may hold
  ``MAX_LINE_BYTES``, an HTTP body's cap at /mcp; a longer one is answered
  -32600 and skipped up to its newline without being kept. The answer
  carries the request's id, so the client's call ends rather than waiting:
  read from the line's opening at once when it is there (as the Python SDK
  writes requests), else from its end at the newline (as the TypeScript SDK
  writes them, id last); a line with no newline after four times the cap is
  answered with no id.
* At end of input it cancels the requests still running: their work is done
  (a memory stored) but their answers are lost. Here reading stops, every
  request read is answered, then the server ends.

A daemon thread reads stdin, so SIGINT or SIGTERM stops an idle process at
once, with status 0. Calls running in threads then finish first (a thread
cannot be cut short; each call's transaction stores all or nothing), their
answers unsent; requests still waiting for a thread are answered
"Connection closed" by the SDK.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import re
import signal
import sys
import threading
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.lowlevel
import anyio.to_thread
import mcp_types as types
import pydantic
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from django.conf import settings
from mcp.server.mcpserver import MCPServer
from mcp.shared.message import ServerMessageMetadata, SessionMessage
from mcp_types import PROTOCOL_VERSION_META_KEY

from recall import jsonrpc

# recall/asgi.py's MAX_BODY_BYTES: a message may be as large either way in.
MAX_LINE_BYTES = 1024 * 1024
TOO_LONG = f"Message too large: a line may hold at most {MAX_LINE_BYTES} bytes."
CHUNK = 64 * 1024
# How much of a line over the cap is kept to find the request's id in.
HEAD_BYTES = 4096
# An id among a message's first members, after only "jsonrpc" and "method"
# (as the Python SDK writes them): one further in could be a parameter's.
_LEADING_ID = re.compile(
    rb'\s*\{\s*(?:"(?:jsonrpc|method)"\s*:\s*"(?:[^"\\]|\\.)*"\s*,\s*)*'
    rb'"id"\s*:\s*(-?\d+|"(?:[^"\\]|\\.)*")\s*[,}]'
)
_A_RESPONSE = re.compile(rb'\s*,\s*"(?:result|error)"')
# A request whose first members are "method" or "jsonrpc" (the TypeScript
# SDK writes "method", "params", then "jsonrpc" and "id").
_A_REQUEST = re.compile(rb'\s*\{\s*(?:"jsonrpc"\s*:\s*"2\.0"\s*,\s*)?"method"\s*:')
# The last member of the line's object, when it is "id": the closing brace
# after it is the message's own.
_CLOSING_ID = re.compile(rb',\s*"id"\s*:\s*(-?\d+|"(?:[^"\\]|\\.)*")\s*\}\s*$')
# A line that runs on this many times the limit with no newline is refused
# then, with no id, rather than waited for.
OVERLONG_FACTOR = 4

Outgoing = SessionMessage | dict[str, Any]


async def serve(server: MCPServer) -> None:
    """Serve ``server`` on this process's stdin and stdout until stdin ends, SIGINT or SIGTERM.

    Tool calls run in at most ``STDIO_WORKER_THREADS`` threads, each with its
    own database connection; more calls at once wait their turn. anyio's
    default, 40, let one client's burst take 40 connections of the database,
    beside a server's own.
    """
    anyio.to_thread.current_default_thread_limiter().total_tokens = settings.STDIO_WORKER_THREADS
    stdin, stdout = claim()
    await Transport(stdin, stdout).serve(server)


def claim() -> tuple[int, int]:
    """Return private copies of stdin and stdout; fds 0 and 1 become /dev/null and stderr.

    A stray read then sees end of file and a stray print lands in the log,
    never in the protocol, until the process exits.
    """
    sys.stdout.flush()
    stdin, stdout = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.dup2(2, 1)
    return stdin, stdout


def message(line: bytes) -> types.JSONRPCMessage:
    """Return the one JSON-RPC message on ``line``, or raise ``jsonrpc.Invalid`` as /mcp would."""
    parsed = jsonrpc.parse(line)
    try:
        return types.jsonrpc_message_adapter.validate_json(line, by_name=False)
    except pydantic.ValidationError as exc:
        # Over HTTP the SDK answers these itself, and jsonrpc.Clean rewords them the same way.
        if any(error["type"] == "json_invalid" for error in exc.errors()):
            code, call_id = jsonrpc.PARSE_ERROR, None
        else:
            code, call_id = jsonrpc.INVALID_PARAMS, jsonrpc.call_id(parsed)
        raise jsonrpc.Invalid(
            jsonrpc.clean_message(None, code), rpc_code=code, call_id=call_id
        ) from None


@dataclass(frozen=True)
class Overlong:
    """A line over the limit, of which only its first and last ``HEAD_BYTES`` are kept."""

    head: bytes
    tail: bytes = b""

    def call_id(self) -> Any:
        """The id of the request the line held, when either end shows it; else None."""
        found = leading_id(self.head)
        if found is None and _A_REQUEST.match(self.head):
            found = _closing_id(self.tail)
        return found


def leading_id(head: bytes) -> Any:
    """The id a request opens with, or None: what a refusal of a line too long answers.

    A response (its id followed by "result" or "error") is no request to answer.
    """
    found = _LEADING_ID.match(head)
    if found is None or _A_RESPONSE.match(head, found.end(1)):
        return None
    return _parsed_id(found.group(1))


def _closing_id(tail: bytes) -> Any:
    """The id a message ends with (``..., "id": 7}``), as the TypeScript SDK writes them."""
    found = _CLOSING_ID.search(tail)
    return _parsed_id(found.group(1)) if found else None


def _parsed_id(raw: bytes) -> Any:
    try:
        return jsonrpc.call_id({"id": json.loads(raw)})
    except ValueError:
        return None


class Lines:
    """Split a byte stream into lines, holding at most ``limit`` bytes of any one."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = bytearray()
        self.skipping = False
        self.head = b""  # of the line being skipped
        self.tail = b""
        self.skipped = 0
        self.reported = False

    def feed(self, data: bytes) -> Iterator[bytes | Overlong]:
        """Yield each line ``data`` completes, and an ``Overlong`` for a line over the limit.

        A line over the limit is dropped up to its newline, and reported once:
        as soon as it gets there when its opening names its id, else at its
        newline (where a request written id last ends), or when it has run
        on for ``OVERLONG_FACTOR`` times the limit with no newline.
        """
        start = 0
        while (end := data.find(b"\n", start)) >= 0:
            if self.skipping:
                self._skip(data[start:end])
                self.skipping = False
                if not self.reported:
                    yield Overlong(self.head, self.tail)
            elif len(self.held) + end - start > self.limit:
                self._begin_skip(data[start:end])
                yield Overlong(self.head, self.tail)
            else:
                yield bytes(self.held) + data[start:end]
                self.held.clear()
            start = end + 1
        if self.skipping:
            self._skip(data[start:])
            if not self.reported and self.skipped > OVERLONG_FACTOR * self.limit:
                self.reported = True
                yield Overlong(self.head)
            return
        self.held += data[start:]
        if len(self.held) > self.limit:
            self._begin_skip(b"")
            self.skipping = True
            if leading_id(self.head) is not None:
                self.reported = True
                yield Overlong(self.head)

    def _begin_skip(self, more: bytes) -> None:
        line = bytes(self.held) + more
        self.head, self.tail, self.skipped = line[:HEAD_BYTES], line[-HEAD_BYTES:], len(line)
        self.reported = False
        self.held.clear()

    def _skip(self, more: bytes) -> None:
        self.skipped += len(more)
        self.tail = (self.tail + more)[-HEAD_BYTES:]

    def rest(self) -> bytes | Overlong | None:
        """What follows the last newline: a last line the client did not end."""
        if not self.skipping:
            return bytes(self.held)
        return None if self.reported else Overlong(self.head, self.tail)


class Transport:
    """Serve a server over two descriptors, answering every request read before end of input."""

    def __init__(self, stdin: int, stdout: int) -> None:
        self.stdin = stdin
        self.stdout = stdout
        # Requests passed to the server and not yet answered, by id.
        self.pending: Counter[types.RequestId] = Counter()
        # Their methods, for the words of a refusal the SDK writes.
        self.methods: dict[types.RequestId | None, str] = {}
        # Whether the client has opened the session: sent initialize, or a request in
        # the 2026-era envelope, which needs none.
        self.opened = False
        self.ending = False
        self.answered = anyio.Event()
        self.gone = False
        self.writing = anyio.CapacityLimiter(1)

    async def serve(self, server: MCPServer) -> None:
        # MCPServer runs only over the SDK's own stdio transport; its
        # low-level server takes any pair of streams.
        lowlevel = server._lowlevel_server
        to_server, from_client = anyio.create_memory_object_stream[SessionMessage | Exception]()
        out, to_client = anyio.create_memory_object_stream[Outgoing]()
        async with anyio.create_task_group() as tg:
            # The writer outlives the server, for the answers it writes as it ends.
            tg.start_soon(self.write, to_client)
            with anyio.CancelScope() as serving:
                async with anyio.create_task_group() as reading:
                    reading.start_soon(self.read, to_server, out.clone())
                    reading.start_soon(stop_on_interrupt, serving)
                    await lowlevel.run(from_client, out, lowlevel.create_initialization_options())
                    reading.cancel_scope.cancel()

    async def read(
        self,
        to_server: MemoryObjectSendStream[SessionMessage | Exception],
        out: MemoryObjectSendStream[Outgoing],
    ) -> None:
        send, chunks = anyio.create_memory_object_stream[bytes]()
        token = anyio.lowlevel.current_token()
        # A daemon thread: one blocked on a read that never returns cannot hold up exit.
        threading.Thread(
            target=pump, args=(self.stdin, send, token), name="stdin", daemon=True
        ).start()
        lines = Lines(MAX_LINE_BYTES)
        async with to_server, out, send, chunks:
            async for data in chunks:
                if not data:
                    break
                for line in lines.feed(data):
                    await self.take(line, to_server, out)
            last = lines.rest()
            if last is not None:
                await self.take(last, to_server, out)
            self.ending = True
            if self.pending:
                await self.answered.wait()

    async def take(
        self,
        line: bytes | Overlong,
        to_server: MemoryObjectSendStream[SessionMessage | Exception],
        out: MemoryObjectSendStream[Outgoing],
    ) -> None:
        if isinstance(line, Overlong):
            await out.send(jsonrpc.Invalid(TOO_LONG, call_id=line.call_id()).body())
            return
        if not line.strip():
            return
        try:
            parsed = message(line)
        except jsonrpc.Invalid as invalid:
            await out.send(_under_its_id(line, invalid).body())
            return
        metadata = None
        if isinstance(parsed, types.JSONRPCRequest):
            request_id = parsed.id
            self.opened = self.opened or parsed.method == "initialize" or _enveloped(parsed)
            if not self.opened and parsed.method != "ping":
                # Refused here, as the SDK would refuse it: a tool call refused so
                # never reaches the rate limit or the usage events (over HTTP, a
                # refused envelope leaves none either).
                await out.send(
                    jsonrpc.refusal(
                        "validation_failed", NOT_OPENED, request_id, jsonrpc.INVALID_PARAMS
                    )
                )
                return
            self.pending[request_id] += 1
            self.methods[request_id] = parsed.method

            async def unanswered() -> None:
                # A request the client cancelled: the SDK writes nothing for it.
                self.settle(request_id)

            metadata = ServerMessageMetadata(on_request_unanswered=unanswered)
        await to_server.send(SessionMessage(parsed, metadata))

    async def write(self, to_client: MemoryObjectReceiveStream[Outgoing]) -> None:
        async with to_client:
            async for item in to_client:
                if isinstance(item, SessionMessage) and isinstance(
                    item.message, types.JSONRPCError
                ):
                    # As jsonrpc.Clean rewords the SDK's refusals over HTTP.
                    sent = item.message.model_dump(by_alias=True, exclude_unset=True, mode="json")
                    ours = (
                        jsonrpc.refusal(
                            "validation_failed", NOT_OPENED, item.message.id, jsonrpc.INVALID_PARAMS
                        )
                        if not self.opened and _generic(item.message.error)
                        else jsonrpc.error_body(sent, self.methods.get(item.message.id))
                    )
                    text = json.dumps(ours or sent)
                elif isinstance(item, SessionMessage):
                    text = item.message.model_dump_json(by_alias=True, exclude_unset=True)
                else:
                    text = json.dumps(item)
                await self.send_line(text.encode() + b"\n")
                if isinstance(item, SessionMessage) and isinstance(
                    item.message, types.JSONRPCResponse | types.JSONRPCError
                ):
                    self.settle(item.message.id)

    async def send_line(self, data: bytes) -> None:
        if self.gone:
            return
        try:
            # A limiter of its own: the tool calls' (STDIO_WORKER_THREADS)
            # would hold answers already made behind calls still running.
            await anyio.to_thread.run_sync(write_all, self.stdout, data, limiter=self.writing)
        except OSError:
            # The client closed stdout: what is left is answered to no one.
            self.gone = True

    def settle(self, request_id: types.RequestId | None) -> None:
        if request_id is not None and self.pending[request_id] > 0:
            self.pending[request_id] -= 1
            if not self.pending[request_id]:
                del self.pending[request_id]
                self.methods.pop(request_id, None)
        if self.ending and not self.pending:
            self.answered.set()


# The SDK refuses a request before the handshake as it refuses bad params; over HTTP
# (stateless) there is no handshake, so only stdio can meet this.
NOT_OPENED = (
    "The session is not open: send initialize first, then notifications/initialized (at"
    " protocol version 2026-07-28, send the _meta envelope with every request instead)."
)


def _under_its_id(line: bytes, invalid: jsonrpc.Invalid) -> jsonrpc.Invalid:
    """A line refused as unparsable answered under its request's id, when either end shows it.

    It was a parse error with id null, which a client cannot match to its
    request: it waited for an answer (a TypeScript client for ever), as for a
    line too long. So it went for a line that is not UTF-8, and for one nested
    too deeply or holding a number too long for ``safejson`` (review142). A
    few stray bytes before the opening brace (a byte-order mark) are passed
    over to find it.
    """
    if invalid.call_id is not None or invalid.rpc_code != jsonrpc.PARSE_ERROR:
        return invalid
    opening = line.find(b"{", 0, 8)
    head = line[opening:] if opening > 0 else line
    found = Overlong(head[:HEAD_BYTES], line[-HEAD_BYTES:]).call_id()
    try:
        line.decode("utf-8")
    except UnicodeDecodeError as bad:
        return jsonrpc.Invalid(
            f"Parse error: the line is not UTF-8 text (byte {bad.start + 1} of it).",
            rpc_code=jsonrpc.PARSE_ERROR,
            call_id=found,
        )
    if found is None:
        return invalid
    return jsonrpc.Invalid(
        invalid.message, rpc_code=jsonrpc.PARSE_ERROR, call_id=found, data=invalid.data
    )


def _generic(error: types.ErrorData) -> bool:
    return error.code == jsonrpc.INVALID_PARAMS and error.message == "Invalid request parameters"


def _enveloped(request: types.JSONRPCRequest) -> bool:
    meta = (request.params or {}).get("_meta")
    return isinstance(meta, dict) and PROTOCOL_VERSION_META_KEY in meta


def pump(
    fd: int, send: MemoryObjectSendStream[bytes], token: anyio.lowlevel.EventLoopToken
) -> None:
    """Pass ``fd``'s bytes to ``send`` until end of file, which arrives as ``b""``."""
    while True:
        try:
            data = os.read(fd, CHUNK)
        except OSError:
            data = b""
        try:
            anyio.from_thread.run(send.send, data, token=token)
        except (
            anyio.BrokenResourceError,
            anyio.ClosedResourceError,
            concurrent.futures.CancelledError,
            RuntimeError,  # anyio.RunFinishedError among them: the event loop has ended
        ):
            return  # the server has stopped reading
        if not data:
            return


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


async def stop_on_interrupt(scope: anyio.CancelScope) -> None:
    # SIGTERM too: a client quitting sends it, and ended by its default action
    # the process would skip the exit hooks that stop the embedded PostgreSQL.
    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for _ in signals:
            scope.cancel()
            return
