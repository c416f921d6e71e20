"""Load-test the MCP endpoint over HTTP: N concurrent MCP clients on loopback.

    python bench/http.py --data DIR --repeat 3 --json http.json
    python bench/http.py --profile --concurrency 32 --mix recall-heavy
    python bench/http.py --url http://127.0.0.1:8080/mcp --key recall_live_...
    python bench/http.py --smoke --json smoke.json

Without ``--url`` the script starts the README's serve command itself,
``python -m recall serve``, on a free port with a fresh temporary
RECALL_DATA_DIR and every tier's rate limit raised to 1,000,000 a minute, so
that the run measures the server rather than the limiter. It reads the
first-run API key from the server's output, checks it works, then creates a
pro-tier user and key with ``recall create-user`` / ``create-key`` (the free
tier holds only 100 memories) and seeds memories through ``remember``:
sentences of SciFact abstracts with ``--data``, else made-up but natural
sentences.

Each client is a real MCP client. Most requests are stateless 2025-11-25
``tools/call`` POSTs on a keep-alive connection (a small HTTP/1.1 client on
asyncio streams, cheap enough not to steal the server's CPU); a share
(``--sdk-share``, default 2%) are whole SDK sessions, ``mcp.Client`` in
``legacy`` mode, so the initialize handshake is exercised too. Clients run in
their own process(es), never in the server's, so their Python work does not
compete for the server's GIL. They do share the machine's cores, which on a
2-core machine is a real cost: quote the load average with the results.

For every mix and concurrency the report gives requests per second and
p50/p95/p99 per tool (SDK sessions apart: their time includes the handshake),
the error count and, separately, 429s. Anything but a successful tool result
or a 429 is an error, and the script exits non-zero if there was any. It also
gives the CPU time each request cost, read from /proc over the measured
window: the server process, PostgreSQL (postmaster and backends), the load
generator, and everything else on the machine. On a shared machine that last
figure is other people's work; the first three are the run's own, and steadier
than requests per second.

``--profile`` adds a split of the server's time by layer (auth and rate limit,
MCP SDK, HTTP and event loop, embedding, database, usage recording, logging)
from ``py-spy record`` on the server process under a recall-heavy load, and
``pg_stat_statements`` (preloaded for the run) for PostgreSQL's own time per
statement, plus EXPLAIN ANALYZE of the recall query. See ``profile`` and
``profile_split`` for how samples are attributed.

``--openai-stub`` embeds through a local OpenAI-compatible embeddings server
(``memories/tests/fake_openai.py``, in a process of its own) instead of the
local model, as a deployment that embeds remotely does: the server's CPU per
request then leaves out the model's, which onnxruntime spends off the GIL and
so no py-spy split shows. Its vectors are random per text, so only the costs
mean anything in such a run, not which memories come back.

With 3,000 seeded memories, all one tenant's, recall searches the HNSW index
(namespaces of up to RECALL_EXACT_SEARCH_MAX memories, 2,000 by default, are
ranked by an exact scan instead); pass ``--seed-memories`` or ``--server-env``
to look at either side.
"""

from __future__ import annotations

import sys
from pathlib import Path

# Run as a script, this file's folder comes first on sys.path, where this
# module would shadow the standard library's ``http`` package.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
sys.path.insert(0, str(_HERE.parent))

import argparse  # noqa: E402
import asyncio  # noqa: E402
import contextlib  # noqa: E402
import csv  # noqa: E402
import datetime  # noqa: E402
import json  # noqa: E402
import multiprocessing  # noqa: E402
import os  # noqa: E402
import random  # noqa: E402
import re  # noqa: E402
import shutil  # noqa: E402
import signal  # noqa: E402
import socket  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
import urllib.error  # noqa: E402
import urllib.request  # noqa: E402
from collections import Counter, defaultdict  # noqa: E402
from collections.abc import Callable, Iterable, Iterator  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from typing import Any  # noqa: E402
from urllib.parse import urlsplit  # noqa: E402

from bench.harness import FOREIGN_SETTINGS  # noqa: E402

REPO = _HERE.parent
PROTOCOL_VERSION = "2025-11-25"
# uvicorn closes a kept-alive connection after 5 idle seconds; reconnect first.
KEEP_ALIVE_IDLE = 4.0
NAMESPACE = "bench"
MIXES: dict[str, dict[str, float]] = {
    "recall-heavy": {"recall": 0.9, "remember": 0.1},
    "remember-heavy": {"remember": 0.7, "recall": 0.2, "list_memories": 0.1},
}


# Texts --------------------------------------------------------------------------


_PEOPLE = ["The user", "Maya", "Tom", "The team lead", "Priya", "Our client", "Grandma", "Leo"]
_LIKES = [
    "prefers green tea to coffee in the morning",
    "wants code reviews finished within a day",
    "is allergic to shellfish and avoids seafood restaurants",
    "runs five kilometres before work on weekdays",
    "keeps project notes in plain Markdown files",
    "dislikes meetings scheduled after four in the afternoon",
    "is learning Portuguese for a move to Lisbon",
    "deploys the backend on Tuesdays after the standup",
    "uses PostgreSQL with pgvector for search features",
    "reads science fiction on the train home",
    "plays the cello in a community orchestra",
    "books flights with a window seat whenever possible",
    "has a dog called Pepper who needs a walk at noon",
    "pays the electricity bill on the first of each month",
    "writes tests before fixing any reported bug",
    "grows tomatoes and basil on the balcony",
]
_WHEN = [
    "since last spring",
    "according to the March planning notes",
    "as mentioned in Friday's call",
    "for the past two years",
    "since moving to the new office",
    "as of the latest retrospective",
    "after the holiday in Norway",
    "unless the schedule changes",
]
_QUESTIONS = [
    "What does {who} drink in the morning?",
    "When does {who} deploy the backend?",
    "Which database does {who} use for search?",
    "What food allergies does {who} have?",
    "How does {who} keep project notes?",
    "What instrument does {who} play?",
    "What is the name of {who}'s dog?",
    "Which language is {who} learning and why?",
    "What does {who} think about late meetings?",
    "What does {who} grow at home?",
]


def synthetic_sentences(count: int, seed: int = 7) -> list[str]:
    """Return ``count`` distinct, plausible memory sentences."""
    rng = random.Random(seed)
    combos = [(p, like, w) for p in _PEOPLE for like in _LIKES for w in _WHEN]
    rng.shuffle(combos)
    out = [f"{p} {like}, {w}." for p, like, w in combos[:count]]
    serial = 0
    while len(out) < count:  # more than the templates hold: number them
        p, like, w = combos[serial % len(combos)]
        out.append(f"{p} {like}, {w} (note {serial // len(combos) + 2}).")
        serial += 1
    return out


def synthetic_queries(count: int, seed: int = 11) -> list[str]:
    rng = random.Random(seed)
    who = [p.lower() if p.startswith(("The", "Our")) else p for p in _PEOPLE]
    return [rng.choice(_QUESTIONS).format(who=rng.choice(who)) for _ in range(count)]


def scifact_texts(data: Path) -> tuple[list[str], list[str]]:
    """Return SciFact abstracts' sentences and the training claims, in file order."""
    from bench.similarity import split_abstract

    csv.field_size_limit(1 << 24)
    sentences: list[str] = []
    with (data / "scifact" / "corpus.csv").open(newline="", encoding="utf-8") as f:
        for row in csv.DictReader(f):
            sentences.extend(s.strip() for s in split_abstract(row["abstract"]) if s.strip())
    with (data / "scifact" / "claims_train.csv").open(newline="", encoding="utf-8") as f:
        claims = [row["claim"].strip() for row in csv.DictReader(f) if row["claim"].strip()]
    # Sentences past MAX_TOKENS are truncated by the model anyway; keep memories
    # memory-sized.
    sentences = [s for s in dict.fromkeys(sentences) if 20 <= len(s) <= 600]
    random.Random(3).shuffle(sentences)
    return sentences, claims


# A small HTTP/1.1 client ------------------------------------------------------


class HttpConnection:
    """One keep-alive HTTP/1.1 connection that POSTs JSON-RPC bodies."""

    def __init__(self, url: str, key: str) -> None:
        parts = urlsplit(url)
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or 80
        self.path = parts.path or "/"
        self.head = (
            f"POST {self.path} HTTP/1.1\r\n"
            f"Host: {parts.netloc}\r\n"
            f"Authorization: Bearer {key}\r\n"
            "Content-Type: application/json\r\n"
            "Accept: application/json, text/event-stream\r\n"
            f"MCP-Protocol-Version: {PROTOCOL_VERSION}\r\n"
        )
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.opened = 0
        self.last_used = 0.0

    async def post(self, body: bytes) -> tuple[int, bytes]:
        reused = self.writer is not None
        if reused and (
            self.reader is None
            or self.reader.at_eof()
            or time.monotonic() - self.last_used > KEEP_ALIVE_IDLE
        ):
            await self.close()  # the server has closed it, or is about to
            reused = False
        try:
            return await self._post(body)
        except ConnectionError:
            if not reused:
                raise
        # Like any HTTP client: a kept-alive connection the server closed
        # before answering gets the request once more, on a new connection.
        return await self._post(body)

    async def _post(self, body: bytes) -> tuple[int, bytes]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
            self.opened += 1
        assert self.reader is not None
        self.writer.write(f"{self.head}Content-Length: {len(body)}\r\n\r\n".encode() + body)
        try:
            status, headers = await self._head()
            if headers.get("transfer-encoding", "").lower() == "chunked":
                payload = await self._chunked()
            elif "content-length" in headers:
                payload = await self.reader.readexactly(int(headers["content-length"]))
            else:
                payload = await self.reader.read()
                headers["connection"] = "close"
        except BaseException:
            await self.close()
            raise
        if headers.get("connection", "").lower() == "close":
            await self.close()
        self.last_used = time.monotonic()
        return status, payload

    async def _head(self) -> tuple[int, dict[str, str]]:
        assert self.reader is not None
        line = await self.reader.readline()
        if not line:
            raise ConnectionError("server closed the connection")
        status = int(line.split(b" ", 2)[1])
        headers: dict[str, str] = {}
        while True:
            line = await self.reader.readline()
            if line in (b"\r\n", b"\n", b""):
                return status, headers
            name, _, value = line.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()

    async def _chunked(self) -> bytes:
        assert self.reader is not None
        parts: list[bytes] = []
        while True:
            size = int((await self.reader.readline()).split(b";")[0], 16)
            if size == 0:
                await self.reader.readline()
                return b"".join(parts)
            parts.append(await self.reader.readexactly(size))
            await self.reader.readline()

    async def close(self) -> None:
        writer, self.writer, self.reader = self.writer, None, None
        if writer is not None:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()


def outcome(status: int, payload: bytes) -> str:
    """Classify one tools/call response: ``ok``, ``rate_limited`` or an error label."""
    if status == 429:
        return "rate_limited"
    if status != 200:
        return f"http_{status}"
    try:
        message = json.loads(payload)
    except ValueError:
        return "bad_json"
    if "error" in message:
        return f"rpc_{message['error'].get('code')}"
    result = message.get("result") or {}
    if result.get("isError"):
        error = (result.get("structuredContent") or {}).get("error") or {}
        return f"tool_{error.get('code', 'unknown')}"
    return "ok"


def tools_call(call_id: int, tool: str, arguments: dict[str, Any]) -> bytes:
    return json.dumps(
        {
            "jsonrpc": "2.0",
            "id": call_id,
            "method": "tools/call",
            "params": {"name": tool, "arguments": arguments},
        }
    ).encode()


# Clients (run in their own processes) -------------------------------------------


@dataclass
class Load:
    url: str
    key: str
    clients: int
    mix: dict[str, float]
    start_at: float  # time.time() at which measuring starts (after warm-up); drive() sets it
    warmup: float
    duration: float
    queries: list[str]
    contents: list[str]  # fresh texts for remember, this process's share
    sdk_share: float
    seed: int


@dataclass
class Tally:
    latencies: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    outcomes: Counter[str] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)
    connections: int = 0
    cpu_s: float = 0.0  # the client process's own CPU time while measuring

    def record(self, name: str, result: str, latency_ms: float, *, measured: bool) -> None:
        """Count one call's outcome: in the measured window, or as a warm-up error."""
        if measured:
            self.outcomes[result] += 1
            if result == "ok":
                self.latencies[name].append(latency_ms)
            elif result != "rate_limited":
                self.errors[result] += 1
        elif result not in ("ok", "rate_limited"):
            self.errors[f"warmup_{result}"] += 1

    def as_dict(self) -> dict[str, Any]:
        return {
            "latencies": dict(self.latencies),
            "outcomes": dict(self.outcomes),
            "errors": dict(self.errors),
            "connections": self.connections,
            "cpu_s": self.cpu_s,
        }


def run_clients(load: Load, results: Any, ready: Any, start: Any) -> None:
    """Process entry point: run ``load.clients`` clients and put a ``Tally`` dict on ``results``.

    Says it is ready (imports done) on ``ready`` and waits for the wall-clock
    start of measuring on ``start``: a process that is slow to spawn on a
    busy machine then never misses its own window.
    """
    try:
        # The SDK is imported here, not on first use: importing it inside the
        # event loop stalled every client of the process for seconds (3-4 s
        # with the machine busy), longer than a smoke run's whole window.
        import mcp.client.streamable_http  # noqa: F401

        ready.put(os.getpid())
        load = replace_load(load, start_at=start.get(timeout=300))
        results.put(asyncio.run(_run_clients(load)).as_dict())
    except BaseException as exc:  # report rather than hang the parent
        results.put({"crashed": f"{type(exc).__name__}: {exc}"})


async def _run_clients(load: Load) -> Tally:
    tally = Tally()
    contents = iter(load.contents)
    rng = random.Random(load.seed)
    tools = list(load.mix)
    weights = [load.mix[t] for t in tools]
    # Wall-clock start shared with the other client processes; monotonic after.
    measure_from = time.monotonic() + (load.start_at - time.time())
    stop_at = measure_from + load.duration
    warm_from = measure_from - load.warmup

    def arguments(tool: str) -> dict[str, Any]:
        if tool == "remember":
            text = next(contents, None) or f"Spare memory {rng.getrandbits(64):x}."
            return {"content": text, "namespace": NAMESPACE, "metadata": {"source": "bench"}}
        if tool == "recall":
            return {"query": rng.choice(load.queries), "namespace": NAMESPACE, "limit": 10}
        return {"namespace": NAMESPACE, "limit": 20}

    async def client(index: int) -> None:
        connection = HttpConnection(load.url, load.key)
        call_id = 0
        # The first client opens an SDK session for its first measured call,
        # so that every level exercises the handshake at least once.
        sdk_owed = index == 0 and load.sdk_share > 0
        await asyncio.sleep(max(0.0, warm_from - time.monotonic()) + rng.random() * 0.05)
        try:
            while time.monotonic() < stop_at:
                tool = rng.choices(tools, weights)[0]
                args = arguments(tool)
                via_sdk = rng.random() < load.sdk_share
                owed_now = False
                if sdk_owed and time.monotonic() >= measure_from:
                    via_sdk, sdk_owed, owed_now = True, False, True
                started = time.monotonic()
                try:
                    if via_sdk:
                        result = await sdk_call(load.url, load.key, tool, args)
                    else:
                        call_id += 1
                        status, payload = await connection.post(tools_call(call_id, tool, args))
                        result = outcome(status, payload)
                except Exception as exc:
                    result = f"exception_{type(exc).__name__}"
                finished = time.monotonic()
                tally.record(
                    f"{tool} (SDK session)" if via_sdk else tool,
                    result,
                    (finished - started) * 1000,
                    # The owed session counts if it started in the window: on a
                    # loaded machine a whole session can outlast a smoke run's 2 s.
                    measured=measure_from <= started and (finished <= stop_at or owed_now),
                )
                if result == "rate_limited":
                    await asyncio.sleep(0.05)
        finally:
            tally.connections += connection.opened
            await connection.close()

    async def cpu_meter() -> None:
        await asyncio.sleep(max(0.0, measure_from - time.monotonic()))
        cpu = time.process_time()
        await asyncio.sleep(max(0.0, stop_at - time.monotonic()))
        tally.cpu_s = time.process_time() - cpu

    await asyncio.gather(cpu_meter(), *(client(i) for i in range(load.clients)))
    return tally


async def sdk_call(url: str, key: str, tool: str, arguments: dict[str, Any]) -> str:
    """Open a whole SDK session (initialize handshake), call one tool, close it."""
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    http = httpx2.AsyncClient(
        headers={"Authorization": f"Bearer {key}"}, timeout=httpx2.Timeout(60, read=120)
    )
    async with http, Client(streamable_http_client(url, http_client=http), mode="legacy") as c:
        result = await c.call_tool(tool, arguments)
    if result.is_error:
        error = (result.structured_content or {}).get("error") or {}
        code = error.get("code", "unknown")
        return "rate_limited" if code == "rate_limited" else f"tool_{code}"
    return "ok"


def _ticks(stat: str, *, reaped: bool = False) -> int:
    # Fields after the command name: state [0], utime [11], stime [12], and
    # the time of exited children the process has waited for [13], [14].
    fields = stat.rsplit(")", 1)[1].split()
    own = int(fields[11]) + int(fields[12])
    return own + (int(fields[13]) + int(fields[14]) if reaped else 0)


class CpuMeter:
    """CPU time over a window, split: server process, PostgreSQL, load generator, the rest.

    Read from /proc: the server's own utime + stime, the same summed over the
    postmaster and its children (the backends and workers), and the whole
    machine's busy time. The load generator reports its own. "Other" is what
    the machine spent on everything else in the window (other jobs included).
    """

    def __init__(self, server_pid: int | None, postmaster_pid: int | None) -> None:
        self.server_pid = server_pid
        self.postmaster_pid = postmaster_pid
        self.hz = os.sysconf("SC_CLK_TCK")
        self.delta: dict[str, float] = {}

    def _snapshot(self) -> dict[str, float]:
        snap = {"machine": self._machine(), "server": 0.0, "postgres": 0.0}
        owners = {"server": self.server_pid, "postgres": self.postmaster_pid}
        for stat in Path("/proc").glob("[0-9]*/stat"):
            with contextlib.suppress(OSError, IndexError, ValueError):
                text = stat.read_text()
                pid, ppid = int(text.split()[0]), int(text.rsplit(")", 1)[1].split()[1])
                for name, owner in owners.items():
                    # A server's workers (recall serve --workers N) and
                    # PostgreSQL's backends are children; those that exit in
                    # the window leave their time in the parent's reaped fields.
                    if owner and pid == owner:
                        snap[name] += _ticks(text, reaped=True)
                    elif owner and ppid == owner:
                        snap[name] += _ticks(text)
        return {k: v / self.hz for k, v in snap.items()}

    @staticmethod
    def _machine() -> float:
        cpu = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
        user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in cpu[:8])
        return float(user + nice + system + irq + softirq + steal)

    def measure(self, start_at: float, duration: float) -> None:
        """Block until the window has passed; keep the differences."""
        time.sleep(max(0.0, start_at - time.time()))
        before = self._snapshot()
        time.sleep(duration)
        after = self._snapshot()
        self.delta = {k: after[k] - before[k] for k in before}

    def per_request(self, requests: int, client_cpu_s: float) -> dict[str, float]:
        if not requests or not self.delta:
            return {}
        d = self.delta
        other = d["machine"] - d["server"] - d["postgres"] - client_cpu_s
        split = {
            "server": d["server"],
            "postgres": d["postgres"],
            "load generator": client_cpu_s,
            "other processes": max(other, 0.0),
        }
        return {k: round(v * 1000 / requests, 2) for k, v in split.items()}


def postmaster_pid(data_dir: Path) -> int | None:
    with contextlib.suppress(OSError, ValueError, IndexError):
        return int((data_dir / "pgdata" / "postmaster.pid").read_text().split()[0])
    return None


def drive(
    load: Load,
    processes: int,
    meter: CpuMeter | None = None,
    on_start: Callable[[float], None] | None = None,
) -> dict[str, Any]:
    """Run ``load`` split over ``processes`` client processes and merge their tallies.

    Measuring starts ``load.warmup`` seconds after every client process is
    ready, not at a time fixed before they were spawned; ``on_start`` is told
    when, as is the CPU meter.
    """
    context = multiprocessing.get_context("spawn")
    results, ready, start = context.Queue(), context.Queue(), context.Queue()
    workers = []
    for index in range(processes):
        share = replace_load(
            load,
            clients=load.clients // processes + (1 if index < load.clients % processes else 0),
            contents=load.contents[index::processes],
            seed=load.seed * 1000 + index,
        )
        if share.clients:
            workers.append(context.Process(target=run_clients, args=(share, results, ready, start)))
    for worker in workers:
        worker.start()
    for _ in workers:
        ready.get(timeout=300)
    # Half a second for the start message to reach every process.
    start_at = time.time() + load.warmup + 0.5
    for _ in workers:
        start.put(start_at)
    load = replace_load(load, start_at=start_at)
    if on_start is not None:
        on_start(start_at)
    if meter is not None:
        meter.measure(load.start_at, load.duration)
    timeout = load.start_at - time.time() + load.duration + 120
    tallies = [results.get(timeout=max(timeout, 30)) for _ in workers]
    for worker in workers:
        worker.join(10)
    merged = merge(tallies)
    summary = summarise(merged, load)
    if meter is not None:
        summary["cpu_ms_per_request"] = meter.per_request(summary["requests"], merged.cpu_s)
    return summary


def merge(tallies: list[dict[str, Any]]) -> Tally:
    """Add up the client processes' tallies; a crashed process fails the run."""
    merged = Tally()
    for tally in tallies:
        if "crashed" in tally:
            raise RuntimeError(f"a client process crashed: {tally['crashed']}")
        for name, values in tally["latencies"].items():
            merged.latencies[name].extend(values)
        merged.outcomes.update(tally["outcomes"])
        merged.errors.update(tally["errors"])
        merged.connections += tally["connections"]
        merged.cpu_s += tally["cpu_s"]
    return merged


def replace_load(load: Load, **changes: Any) -> Load:
    return Load(**{**load.__dict__, **changes})


def percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return 0.0
    position = q * (len(sorted_values) - 1)
    low = int(position)
    high = min(low + 1, len(sorted_values) - 1)
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * (position - low)


def summarise(tally: Tally, load: Load) -> dict[str, Any]:
    tools: dict[str, Any] = {}
    for name, values in sorted(tally.latencies.items()):
        ordered = sorted(values)
        tools[name] = {
            "count": len(ordered),
            "rps": round(len(ordered) / load.duration, 1),
            "p50_ms": round(percentile(ordered, 0.50), 1),
            "p95_ms": round(percentile(ordered, 0.95), 1),
            "p99_ms": round(percentile(ordered, 0.99), 1),
            "mean_ms": round(statistics.fmean(ordered), 1),
        }
    ok = sum(t["count"] for t in tools.values())
    return {
        "concurrency": load.clients,
        "duration_s": load.duration,
        "requests": ok,
        "rps": round(ok / load.duration, 1),
        "tools": tools,
        "errors": sum(tally.errors.values()),
        "error_kinds": dict(tally.errors),
        "rate_limited": tally.outcomes.get("rate_limited", 0),
        "connections_opened": tally.connections,
        "loadavg_1m": round(os.getloadavg()[0], 2),
    }


# The server ---------------------------------------------------------------------


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# The stub serves until its stdin closes, which happens when the bench exits.
STUB = """
import sys
from memories.tests.fake_openai import serving
with serving() as stub:
    stub.width = int(sys.argv[1])
    print(stub.url, flush=True)
    sys.stdin.read()
    print(len(stub.requests), flush=True)
"""


@contextlib.contextmanager
def openai_stub(served: list[int], width: int = 384) -> Iterator[dict[str, str]]:
    """Run the OpenAI-compatible stub in its own process; yield the server settings for it.

    On the way out, ``served`` gets the number of embedding requests it answered.
    """
    process = subprocess.Popen(
        [sys.executable, "-c", STUB, str(width)],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        url = process.stdout.readline().strip()
        if not url.startswith("http"):
            raise RuntimeError("the OpenAI stub did not start")
        yield {
            "EMBEDDING_PROVIDER": "openai",
            "OPENAI_BASE_URL": url,
            "OPENAI_API_KEY": "bench-stub",
            "OPENAI_EMBEDDING_DIMENSIONS": str(width),
        }
    finally:
        if process.stdin is not None:
            process.stdin.close()
        count = process.stdout.readline().strip() if process.stdout else ""
        served.append(int(count) if count.isdigit() else 0)
        process.wait(10)


class Server:
    """``python -m recall serve`` on a free port and a throwaway data directory."""

    def __init__(self, extra_env: dict[str, str], *, pg_stats: bool) -> None:
        self.data_dir = Path(tempfile.mkdtemp(prefix="recall-http-bench-"))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.mcp_url = f"{self.url}/mcp"
        self.log_path = self.data_dir / "server.log"
        self.pg_stats = pg_stats
        self.env = {k: v for k, v in os.environ.items() if k not in FOREIGN_SETTINGS}
        self.env.update(
            {
                "RECALL_DATA_DIR": str(self.data_dir),
                "HOST": "127.0.0.1",
                "PORT": str(self.port),
                "PYTHONUNBUFFERED": "1",
                "DJANGO_SETTINGS_MODULE": "recall.settings",
                **{f"RATE_LIMIT_{tier}": "1000000/min" for tier in ("FREE", "STARTER", "PRO")},
                "RATE_LIMIT_TEAM": "1000000/min",
                **extra_env,
            }
        )
        self.process: subprocess.Popen[str] | None = None
        self.first_key: str | None = None
        self._key_seen = threading.Event()

    def start(self, timeout: float = 300.0) -> Server:
        if self.pg_stats:
            self._preload_pg_stat_statements()
        log = self.log_path.open("a")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "recall", "serve"],
            cwd=REPO,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
        )
        threading.Thread(target=self._read_stdout, daemon=True).start()
        self._wait_ready(timeout)
        if not self._key_seen.wait(10) or not self.first_key:
            raise RuntimeError(f"no first-run API key in the server output; see {self.log_path}")
        return self

    def _preload_pg_stat_statements(self) -> None:
        # Initialise the embedded cluster in a short-lived process (it stops
        # the server when it exits), then preload the extension for the next start.
        self.manage("manage", "migrate", "--verbosity", "0")
        conf = self.data_dir / "pgdata" / "postgresql.auto.conf"
        with conf.open("a") as f:
            f.write("\nshared_preload_libraries = 'pg_stat_statements'\n")
            f.write("pg_stat_statements.track = 'all'\n")

    def _read_stdout(self) -> None:
        assert self.process is not None and self.process.stdout is not None
        with self.log_path.open("a") as log:
            for line in self.process.stdout:
                log.write(line)
                log.flush()
                found = re.search(r"API key:\s+(\S+)", line)
                if found and not self.first_key:
                    self.first_key = found.group(1)
                    self._key_seen.set()
        self._key_seen.set()

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(f"server exited early:\n{self.logs()[-3000:]}")
            with (
                contextlib.suppress(urllib.error.URLError, ConnectionError, TimeoutError),
                urllib.request.urlopen(f"{self.url}/ready", timeout=2) as response,  # noqa: S310
            ):
                if response.status == 200:
                    return
            time.sleep(0.25)
        raise RuntimeError(f"server not ready in {timeout:.0f}s:\n{self.logs()[-3000:]}")

    def manage(self, *args: str) -> str:
        """Run a ``recall`` command against the same data directory; return its stdout."""
        done = subprocess.run(
            [sys.executable, "-m", "recall", *args],
            cwd=REPO,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        if done.returncode != 0:
            raise RuntimeError(f"recall {' '.join(args)} failed:\n{done.stderr[-3000:]}")
        return done.stdout

    def pro_key(self) -> str:
        email = "bench@example.com"
        self.manage("create-user", email, "--tier", "pro")
        return self.manage("create-key", email, "--tier", "pro", "--name", "bench").strip()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None

    def logs(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def cleanup(self) -> None:
        shutil.rmtree(self.data_dir, ignore_errors=True)


@contextlib.contextmanager
def superuser_cursor(data_dir: Path) -> Iterator[Any]:
    """A cursor on the server's database as the embedded cluster's superuser."""
    import psycopg

    from recall.db import embedded

    server = embedded.start(data_dir)
    with psycopg.connect(server.superuser_conninfo("recall"), autocommit=True) as conn:
        yield conn.cursor()


# Seeding ------------------------------------------------------------------------


async def seed(url: str, key: str, texts: list[str], concurrency: int = 8) -> dict[str, Any]:
    """Store ``texts`` through ``remember``; return how long it took."""
    queue = iter(enumerate(texts))
    failures: Counter[str] = Counter()

    async def worker() -> None:
        connection = HttpConnection(url, key)
        try:
            for index, text in queue:
                args = {"content": text, "namespace": NAMESPACE, "metadata": {"seq": index}}
                status, payload = await connection.post(tools_call(index, "remember", args))
                result = outcome(status, payload)
                if result != "ok":
                    failures[result] += 1
        finally:
            await connection.close()

    started = time.monotonic()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    seconds = time.monotonic() - started
    if failures:
        raise RuntimeError(f"seeding failed: {dict(failures)}")
    return {
        "memories": len(texts),
        "seconds": round(seconds, 1),
        "per_s": round(len(texts) / seconds, 1),
    }


async def check_key(url: str, key: str) -> str:
    connection = HttpConnection(url, key)
    try:
        status, payload = await connection.post(
            tools_call(1, "list_memories", {"namespace": NAMESPACE, "limit": 1})
        )
    finally:
        await connection.close()
    return outcome(status, payload)


# Profiling ----------------------------------------------------------------------

# (layer, test on one frame "function (file:line)") in precedence order: a
# sample goes to the first layer any of its frames matches, so a database
# call made while authenticating counts as auth, and a log call inside the
# MCP middleware counts as logging.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("usage recording", ("billing/usage.py",)),
    (
        "auth + rate limit",
        (
            "accounts/auth.py",
            "accounts/keys.py",
            "accounts/ratelimit.py",
            "authenticate (recall/asgi.py",
            "accounts/admission.py",
        ),
    ),
    ("embedding", ("memories/embeddings/", "onnxruntime", "tokenizers")),
    ("logging", ("logging/__init__.py", "core/logging.py", "json/encoder.py")),
    ("database", ("psycopg", "django/db", "core/tenancy.py", "pgvector")),
    (
        "MCP SDK + validation",
        ("mcp/", "mcp_types", "pydantic", "memories/mcp.py", "starlette", "jsonschema"),
    ),
    ("HTTP server + event loop", ("uvicorn", "h11", "asyncio", "anyio", "recall/asgi.py")),
    ("tools + services", ("memories/",)),
]
# Frames where a worker thread sits while it waits for PostgreSQL's answer.
# psycopg's C wait function releases the GIL but is no frame of its own, so
# py-spy (which asks the OS whether a thread runs) shows the calling
# ``Connection.wait`` as busy: these samples are the database round trips.
DB_WAIT = ("Connection.wait (psycopg", "wait_select", "wait_epoll", "psycopg/waiting.py")


def classify(frames: list[str]) -> str:
    for layer, needles in LAYERS:
        if any(needle in frame for frame in frames for needle in needles):
            return layer
    return "other"


def profile_split(raw: str) -> dict[str, Any]:
    """Aggregate py-spy ``--format raw`` output into shares by layer.

    Each line is one distinct stack (root first, ``;``-separated) and its
    sample count. Stacks of the event loop idling in ``select`` and of
    threads parked on a queue or condition are not samples of work (py-spy
    drops most of them itself). Samples of a worker waiting for PostgreSQL's
    answer count as ``database (waiting)``, apart from the database layer's
    own Python work (Django, psycopg, the tenant switch).
    """
    counts: Counter[str] = Counter()
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = stack.split(";")
        leaf = frames[-1]
        if _parked(frames):
            counts["idle"] += int(count)
            continue
        layer = classify(frames)
        if layer == "database" and any(needle in leaf for needle in DB_WAIT):
            layer = "database (waiting)"
        counts[layer] += int(count)
    busy = sum(n for layer, n in counts.items() if layer != "idle")
    return {
        "samples": busy,
        "share": {layer: round(n / busy, 3) for layer, n in counts.most_common() if layer != "idle"}
        if busy
        else {},
        "idle_samples": counts["idle"],
    }


def _parked(frames: list[str]) -> bool:
    """True for a thread waiting for work rather than doing or waiting on some."""
    leaf = frames[-1]
    if "select (selectors.py" in leaf or "_run_once (asyncio" in leaf:
        return True  # the event loop with nothing to do
    parked_in = ("wait (threading.py", "get (queue.py", "_worker (concurrent", "acquire")
    return any(p in leaf for p in parked_in) and not any(
        needle in frame for frame in frames for needle in DB_WAIT
    )


def py_spy(pid: int, seconds: float, out: Path, *, gil: bool, rate: int) -> str:
    exe = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    command = [
        exe,
        "record",
        "--pid",
        str(pid),
        "--duration",
        str(int(seconds)),
        "--rate",
        str(rate),
        "--format",
        "raw",
        "--nonblocking",
        # The workers of `recall serve --workers N` are the server's children.
        "--subprocesses",
        "--output",
        str(out),
    ]
    if gil:
        command.append("--gil")
    subprocess.run(command, check=True, capture_output=True, timeout=seconds + 60)
    return out.read_text()


def pg_statements(data_dir: Path, reset: bool) -> list[dict[str, Any]]:
    with superuser_cursor(data_dir) as cursor:
        if reset:
            cursor.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            cursor.execute("SELECT pg_stat_statements_reset()")
            return []
        cursor.execute(
            "SELECT query, calls, total_exec_time, mean_exec_time, total_plan_time"
            " FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid"
            " WHERE d.datname = 'recall' ORDER BY total_exec_time DESC LIMIT 25"
        )
        return [
            {
                "query": " ".join(query.split())[:160],
                "calls": calls,
                "total_ms": round(total, 1),
                "mean_ms": round(mean, 3),
                "plan_ms": round(plan, 1),
            }
            for query, calls, total, mean, plan in cursor.fetchall()
        ]


def explain_recall(server: Server) -> list[str]:
    """EXPLAIN ANALYZE the recall query as the bench user's tenant runs it.

    The query vector is a stored memory's, so the plan and timing are those of
    a real query of this model.
    """
    os.environ.update(server.env)
    import django

    django.setup()
    from django.conf import settings
    from django.db import connection

    from accounts.models import User
    from core import tenancy
    from memories import embeddings, search
    from memories.models import Memory

    user = User.objects.get(email="bench@example.com")
    embedder = embeddings.get_embedder()
    with tenancy.tenant(user.id, local_settings=search.SEARCH_SETTINGS):
        memory = Memory.objects.filter(user_id=user.id).values("content", "embedding")[7]
        # The statement the server's default recall runs for this memory's text.
        prepared = search.Search(
            text=memory["content"],
            vector=memory["embedding"],
            embedder=embedder,
            mode=settings.RECALL_SEARCH_MODE,
            limit=10,
            minimum=embedder.default_threshold,
            filters=search.Filters(NAMESPACE),
        )
        sql, params = search.statement(user.id, prepared)
        with connection.cursor() as cursor:
            for _ in range(5):  # the last of five: warm caches, as under load
                cursor.execute("EXPLAIN (ANALYZE, BUFFERS) " + sql, params)
                plan = [row[0] for row in cursor.fetchall()]
    return plan


class Sampler(threading.Thread):
    """Run ``py-spy record`` on the server from ``start_at`` (wall clock) for ``seconds``."""

    def __init__(self, pid: int, start_at: float, seconds: float, out: Path, *, mode: str) -> None:
        super().__init__(daemon=True)
        self.pid = pid
        self.start_at = start_at
        self.seconds = seconds
        self.out = out
        self.mode = mode
        self.raw = ""

    def run(self) -> None:
        time.sleep(max(0.0, self.start_at - time.time()))
        self.raw = py_spy(self.pid, self.seconds, self.out, gil=self.mode == "gil", rate=200)


class Sampling:
    """Start a ``Sampler`` when ``drive`` says measuring starts, and wait for it."""

    def __init__(self, pid: int, seconds: float, out: Path, *, mode: str) -> None:
        self.pid, self.seconds, self.out, self.mode = pid, seconds, out, mode
        self.sampler: Sampler | None = None

    def start(self, start_at: float) -> None:
        self.sampler = Sampler(self.pid, start_at, self.seconds, self.out, mode=self.mode)
        self.sampler.start()

    def join(self) -> Sampler:
        assert self.sampler is not None, "drive() never started measuring"
        self.sampler.join()
        return self.sampler


def profile(
    server: Server | None,
    pid: int,
    load: Load,
    processes: int,
    seconds: float,
    workdir: Path,
    meter: CpuMeter,
) -> dict[str, Any]:
    """Profile the server under ``load``, twice: who holds the GIL, and what threads wait on.

    ``gil`` samples only the thread holding the GIL: the split of the
    server's Python CPU time, which one core at most can serve. ``threads``
    samples every thread that is not parked waiting for work, whether it runs,
    waits for a core or waits for PostgreSQL's answer: the split of the time
    requests spend in the worker threads and the event loop. PostgreSQL's own
    side comes from ``pg_stat_statements`` over the first pass.
    """
    report: dict[str, Any] = {"mix": "recall-heavy", "concurrency": load.clients}
    for mode in ("gil", "threads"):
        if server is not None and mode == "gil":
            pg_statements(server.data_dir, reset=True)
        run = replace_load(load, duration=seconds)
        sampling = Sampling(pid, seconds - 1, workdir / f"py-spy-{mode}.txt", mode=mode)
        result = drive(run, processes, meter, on_start=sampling.start)
        sampler = sampling.join()
        report[mode] = profile_split(sampler.raw)
        report[mode]["load"] = {
            "rps": result["rps"],
            "errors": result["errors"],
            "tools": result["tools"],
            "cpu_ms_per_request": result.get("cpu_ms_per_request", {}),
        }
        if server is not None and mode == "gil":
            statements = pg_statements(server.data_dir, reset=False)
            calls = sum(t["count"] for t in result["tools"].values()) or 1
            report["postgres"] = {
                "statements": statements,
                "exec_ms_per_tool_call": round(sum(s["total_ms"] for s in statements) / calls, 3),
                "statements_per_tool_call": round(sum(s["calls"] for s in statements) / calls, 2),
            }
    return report


# Reporting ----------------------------------------------------------------------


def machine() -> dict[str, Any]:
    model = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu": model,
        "cores": os.cpu_count(),
        "python": sys.version.split()[0],
        "loadavg_at_start": [round(x, 2) for x in os.getloadavg()],
    }


def median_of(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Combine repeated runs of one (mix, concurrency): the median of each figure."""
    if len(runs) == 1:
        return {**runs[0], "runs": 1}
    tools: dict[str, Any] = {}
    for name in sorted({n for r in runs for n in r["tools"]}):
        present = [r["tools"][name] for r in runs if name in r["tools"]]
        tools[name] = {
            k: round(statistics.median(t[k] for t in present), 1)
            for k in ("rps", "p50_ms", "p95_ms", "p99_ms", "mean_ms")
        }
        tools[name]["count"] = sum(t["count"] for t in present)
    return {
        "concurrency": runs[0]["concurrency"],
        "duration_s": runs[0]["duration_s"],
        "runs": len(runs),
        "rps": round(statistics.median(r["rps"] for r in runs), 1),
        "rps_each": [r["rps"] for r in runs],
        "requests": sum(r["requests"] for r in runs),
        "tools": tools,
        "errors": sum(r["errors"] for r in runs),
        "error_kinds": dict(sum((Counter(r["error_kinds"]) for r in runs), Counter())),
        "rate_limited": sum(r["rate_limited"] for r in runs),
        "loadavg_1m": [r["loadavg_1m"] for r in runs],
        "cpu_ms_per_request": {
            k: round(statistics.median(r["cpu_ms_per_request"].get(k, 0.0) for r in runs), 2)
            for k in runs[0].get("cpu_ms_per_request", {})
        },
    }


def print_table(results: list[dict[str, Any]]) -> None:
    print(f"{'mix':<15} {'N':>4} {'req/s':>7}  {'tool':<30} {'rps':>6} "
          f"{'p50':>7} {'p95':>7} {'p99':>7}  err 429")  # fmt: skip
    for result in results:
        first = True
        for name, t in result["tools"].items():
            lead = (
                f"{result['mix']:<15} {result['concurrency']:>4} {result['rps']:>7.1f}"
                if first
                else " " * 28
            )
            tail = f"  {result['errors']:>3} {result['rate_limited']:>3}" if first else ""
            print(
                f"{lead}  {name:<30} {t['rps']:>6.1f} {t['p50_ms']:>7.1f} "
                f"{t['p95_ms']:>7.1f} {t['p99_ms']:>7.1f}{tail}"
            )
            first = False


# Main ---------------------------------------------------------------------------


def parse_mix(text: str) -> dict[str, dict[str, float]]:
    mixes: dict[str, dict[str, float]] = {}
    for part in filter(None, (p.strip() for p in text.split(";"))):
        if part in MIXES:
            mixes[part] = MIXES[part]
            continue
        try:
            shares = {
                tool.strip(): float(share)
                for tool, share in (item.split("=") for item in part.split(","))
            }
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"not a mix: {part!r} (use {', '.join(MIXES)} or e.g. recall=0.8,remember=0.2)"
            ) from None
        unknown = set(shares) - {"recall", "remember", "list_memories"}
        if unknown or not shares or min(shares.values()) < 0 or sum(shares.values()) <= 0:
            raise argparse.ArgumentTypeError(f"not a mix: {part!r}")
        mixes[part] = shares
    return mixes


def parse_levels(text: str) -> list[int]:
    try:
        levels = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of client counts: {text!r}") from None
    if not levels or min(levels) < 1:
        raise argparse.ArgumentTypeError(f"not a list of client counts: {text!r}")
    return levels


def parse_env(items: Iterable[str]) -> dict[str, str]:
    env = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise SystemExit(f"--server-env takes NAME=VALUE, not {item!r}")
        env[name] = value
    return env


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Load-test the MCP endpoint with N concurrent MCP clients on loopback.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 2)[1] if __doc__ else None,
    )
    parser.add_argument("--url", help="Target a running server's MCP URL instead of starting one.")
    parser.add_argument("--key", help="With --url: a pro-tier (or higher-limit) API key.")
    parser.add_argument("--data", type=Path, help="Benchmark data folder (SciFact sentences).")
    parser.add_argument(
        "--concurrency", type=parse_levels, default=[1, 8, 32, 128], help="default 1,8,32,128"
    )
    parser.add_argument(
        "--mix",
        type=parse_mix,
        default=dict(MIXES),
        help="';'-separated: recall-heavy, remember-heavy, or e.g. recall=0.8,remember=0.2",
    )
    parser.add_argument("--duration", type=float, default=15.0, help="Seconds measured per level.")
    parser.add_argument("--warmup", type=float, default=3.0, help="Seconds run before measuring.")
    parser.add_argument("--repeat", type=int, default=1, help="Runs per level; medians reported.")
    parser.add_argument("--seed-memories", type=int, default=3000, help="Memories stored first.")
    parser.add_argument("--sdk-share", type=float, default=0.02, help="Share of SDK sessions.")
    parser.add_argument("--client-procs", type=int, default=1, help="Load-generator processes.")
    parser.add_argument("--profile", action="store_true", help="Add the py-spy time split.")
    parser.add_argument("--profile-concurrency", type=int, default=32)
    parser.add_argument("--profile-seconds", type=float, default=20.0)
    parser.add_argument("--profile-out", type=Path, help="Keep py-spy's raw stacks here.")
    parser.add_argument(
        "--server-env", action="append", default=[], metavar="NAME=VALUE", help="Server setting."
    )
    parser.add_argument(
        "--openai-stub",
        action="store_true",
        help="Embed through a local OpenAI-compatible stub, not the local model.",
    )
    parser.add_argument("--smoke", action="store_true", help="Seconds-long run at tiny sizes.")
    parser.add_argument("--json", type=Path, help="Write the results here.")
    args = parser.parse_args(argv)

    if args.smoke:
        args.concurrency = [1, 4]
        args.duration, args.warmup, args.repeat = 2.0, 0.5, 1
        args.seed_memories = min(args.seed_memories, 40)
        args.sdk_share = max(args.sdk_share, 0.2)
    if args.url and not args.key:
        parser.error("--url needs --key")
    return args


def run_levels(
    args: argparse.Namespace,
    url: str,
    key: str,
    queries: list[str],
    fresh: list[str],
    meter: CpuMeter,
) -> tuple[list[dict[str, Any]], int]:
    """Drive every mix at every concurrency, ``--repeat`` times; return medians and texts used."""
    runs: dict[tuple[str, int], list[dict[str, Any]]] = defaultdict(list)
    offset = 0
    for repeat in range(args.repeat):
        for mix_name, mix in args.mix.items():
            for clients in args.concurrency:
                # Enough fresh texts for remember at a generous 500/s.
                want = int(500 * (args.duration + args.warmup) * mix.get("remember", 0)) + 50
                contents = fresh[offset : offset + want]
                offset += len(contents)
                load = Load(
                    url=url,
                    key=key,
                    clients=clients,
                    mix=mix,
                    start_at=0.0,  # set by drive() once the clients are ready
                    warmup=args.warmup,
                    duration=args.duration,
                    queries=queries,
                    contents=contents,
                    sdk_share=args.sdk_share,
                    seed=repeat * 7919 + clients,
                )
                result = drive(load, min(args.client_procs, clients), meter)
                result["mix"] = mix_name
                runs[(mix_name, clients)].append(result)
                print(
                    f"run {repeat + 1}/{args.repeat} {mix_name} N={clients}: "
                    f"{result['rps']} req/s, errors {result['errors']}, "
                    f"429s {result['rate_limited']}, load {result['loadavg_1m']}, "
                    f"CPU ms/request {result.get('cpu_ms_per_request')}",
                    flush=True,
                )
    return [{"mix": m, **median_of(r)} for (m, _), r in runs.items()], offset


def server_settings(
    args: argparse.Namespace, stack: contextlib.ExitStack, stub_served: list[int]
) -> dict[str, str]:
    """``--server-env``, plus with ``--openai-stub`` the settings of a stub started on ``stack``."""
    settings = parse_env(args.server_env)
    if args.openai_stub:
        settings.update(stack.enter_context(openai_stub(stub_served)))
    return settings


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.data:
        sentences, queries = scifact_texts(args.data)
        source = f"SciFact ({len(sentences)} sentences, {len(queries)} claims as queries)"
    else:
        sentences = synthetic_sentences(60_000)
        queries = synthetic_queries(1000)
        source = "synthetic sentences and questions (no --data)"
    seeds, fresh = sentences[: args.seed_memories], sentences[args.seed_memories :]

    report: dict[str, Any] = {
        "machine": machine(),
        "config": {
            "target": args.url or "python -m recall serve (started by the bench)",
            "concurrency": args.concurrency,
            "mixes": args.mix,
            "duration_s": args.duration,
            "warmup_s": args.warmup,
            "repeat": args.repeat,
            "sdk_share": args.sdk_share,
            "client_processes": args.client_procs,
            "texts": source,
            "server_env": parse_env(args.server_env),
            "embedder": "OpenAI-compatible stub" if args.openai_stub else "server's own",
        },
    }
    if args.openai_stub and args.url:
        raise SystemExit("--openai-stub configures the server the bench starts; not with --url")
    server: Server | None = None
    stub = contextlib.ExitStack()
    stub_served: list[int] = []
    workdir = args.profile_out or Path(tempfile.mkdtemp(prefix="recall-http-bench-out-"))
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        if args.url:
            url, key = args.url, args.key
            report["first_key_check"] = "not applicable (--url)"
        else:
            server = Server(server_settings(args, stub, stub_served), pg_stats=args.profile)
            print(f"starting python -m recall serve on port {server.port} ...", flush=True)
            server.start()
            assert server.first_key is not None
            url = server.mcp_url
            report["first_key_check"] = asyncio.run(check_key(url, server.first_key))
            key = server.pro_key()
        meter = CpuMeter(
            server.process.pid if server and server.process else None,
            postmaster_pid(server.data_dir) if server else None,
        )
        report["seed"] = asyncio.run(seed(url, key, seeds))
        print(f"seeded {report['seed']}", flush=True)

        results, offset = run_levels(args, url, key, queries, fresh, meter)
        report["results"] = results
        report["errors_total"] = sum(r["errors"] for r in results)
        report["rate_limited_total"] = sum(r["rate_limited"] for r in results)

        if args.profile:
            pid = server.process.pid if server and server.process else None
            if pid is None:
                raise SystemExit("--profile needs the server started by the bench (no --url)")
            load = Load(
                url=url,
                key=key,
                clients=args.profile_concurrency,
                mix=MIXES["recall-heavy"],
                start_at=0.0,
                warmup=args.warmup,
                duration=args.profile_seconds,
                queries=queries,
                contents=fresh[offset:],
                sdk_share=args.sdk_share,
                seed=4242,
            )
            report["profile"] = profile(
                server, pid, load, args.client_procs, args.profile_seconds, workdir, meter
            )
            assert server is not None
            report["profile"]["explain_recall"] = explain_recall(server)
        report["machine"]["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    finally:
        if server is not None:
            server.stop()
            if server.logs() and "Traceback" in server.logs():
                report["server_tracebacks"] = server.logs().count("Traceback")
            server.cleanup()
        stub.close()
        if stub_served:
            report["stub_embedding_requests"] = stub_served[0]
        if not args.profile_out:
            shutil.rmtree(workdir, ignore_errors=True)

    print_table(report["results"])
    if "profile" in report:
        print(json.dumps(report["profile"], indent=2)[:6000])
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 1 if report["errors_total"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
