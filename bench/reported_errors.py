"""Try to reproduce issue 24's reported tool errors: many SDK clients, and writes after a bulk load.

    python bench/reported_errors.py --json errors.json
    python bench/reported_errors.py --memories 10000 --clients 32 --calls 10 --workers 2
    python bench/reported_errors.py --smoke

The report said that a 2-worker ``recall serve`` once answered 107 of 320
calls with tool errors at 32 clients (the mcp SDK's client), and failed every
seed 001 write after a bulk load of 10,000 memories. This script starts
``python -m recall serve`` as an operator would (default worker count unless
``--workers``, the real rate limits and quota, a fresh data directory) and:

1. **Many clients.** For each tier (free, pro, unlimited: a user and key of
   each made with ``recall create-user`` / ``create-key``) and each protocol
   mode of the SDK's client (``legacy``: 2025-11-25 with initialize;
   ``2026-07-28``: stateless), ``--clients`` SDK sessions at once each make
   ``--calls`` calls, alternating a read and a write, on ``/mcp``
   (``recall`` / ``remember``) and on ``/v1/mcp`` (``search_memory`` /
   ``add_memory``).
2. **Writes after a bulk load.** ``--memories`` memories are stored for a
   user in one namespace three ways: ``recall import``, ``remember`` over HTTP
   (the lean client of ``bench/http.py``, 8 at a time) and asynchronous
   ``add_memory`` (queued, then the queue drained); then SDK sessions in both
   modes make seed 001's writes: ``add_memory`` asynchronous and synchronous,
   ``update_memory`` and ``delete_memory``, on that user's key. The unlimited
   tier (the first-run user's) takes all three loads; a free and a pro user
   also get the import.

Every call's outcome is counted: ``ok``, the tool error's code, the HTTP
status, or the exception. Refusals the tier explains (``rate_limited`` past
the tier's rate, ``quota_exceeded`` past the free tier's 100 memories) are
counted apart from the rest, which would be defects. Exits 1 if there is any
unexplained one.
"""

from __future__ import annotations

import sys
from pathlib import Path

_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
sys.path.insert(0, str(_HERE.parent))

import argparse  # noqa: E402
import asyncio  # noqa: E402
import json  # noqa: E402
import time  # noqa: E402
from collections import Counter  # noqa: E402
from typing import Any  # noqa: E402

from bench import http as bench  # noqa: E402

MODES = ("legacy", "2026-07-28")
TIERS = ("free", "pro", "unlimited")
# Refusals a tier explains: the rate limit and the free tier's quota.
EXPLAINED = {"rate_limited", "quota_exceeded"}


def classify(result: Any) -> str:
    """One SDK tool result: ``ok`` or its error code (seed 001's or Recall's), lower-cased."""
    if not result.is_error:
        return "ok"
    content = result.structured_content or {}
    error = content.get("error")
    if isinstance(error, dict):
        return str(error.get("code", "unknown")).lower()
    details = content.get("details") or {}
    return str(details.get("recall_code") or content.get("code") or "unknown").lower()


def exception_label(exc: BaseException) -> str:
    """An exception from the SDK or the transport, with the HTTP status where there is one."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    status = getattr(getattr(exc, "response", None), "status_code", None)
    if status is not None:
        return f"http_{status}"
    # A JSON-RPC error (the gate's 429 is one): its data names the code.
    data = getattr(getattr(exc, "error", None), "data", None)
    if isinstance(data, dict):
        error = data.get("error")
        code = error.get("code") if isinstance(error, dict) else data.get("code")
        if code:
            return str(code).lower()
    return f"exception_{type(exc).__name__}: {str(exc)[:120]}"


async def session(
    url: str, key: str, mode: str, calls: list[tuple[str, dict[str, Any]]]
) -> list[str]:
    """One SDK session making ``calls`` in order; each call's outcome."""
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    outcomes: list[str] = []
    http = httpx2.AsyncClient(
        headers={"Authorization": f"Bearer {key}"}, timeout=httpx2.Timeout(60, read=120)
    )
    try:
        async with http, Client(streamable_http_client(url, http_client=http), mode=mode) as c:
            for tool, arguments in calls:
                try:
                    outcomes.append(classify(await c.call_tool(tool, arguments)))
                except Exception as exc:  # one failed call; the session goes on
                    outcomes.append(exception_label(exc))
    except BaseException as exc:  # the session itself failed: its remaining calls with it
        if isinstance(exc, KeyboardInterrupt | SystemExit):
            raise
        outcomes += [exception_label(exc)] * (len(calls) - len(outcomes))
    return outcomes


def many_clients_plan(endpoint: str, client: int, calls: int) -> list[tuple[str, dict[str, Any]]]:
    plan: list[tuple[str, dict[str, Any]]] = []
    for n in range(calls):
        text = f"Client {client} note {n}: the build on the {n}th day passed after a retry."
        if endpoint == "/mcp":
            plan.append(
                ("remember", {"content": text, "namespace": "many"})
                if n % 2
                else ("recall", {"query": f"build notes of client {client}", "namespace": "many"})
            )
        else:
            plan.append(
                ("add_memory", {"content": text, "user_id": "many"})
                if n % 2
                else ("search_memory", {"query": f"client {client} builds", "user_id": "many"})
            )
    return plan


async def many_clients(
    base: str, key: str, mode: str, endpoint: str, clients: int, calls: int
) -> Counter[str]:
    sessions = [
        session(base + endpoint, key, mode, many_clients_plan(endpoint, c, calls))
        for c in range(clients)
    ]
    return Counter(o for outcomes in await asyncio.gather(*sessions) for o in outcomes)


async def writes_after_load(base: str, key: str, mode: str, tag: str) -> Counter[str]:
    """Seed 001's writes on /v1/mcp, in one SDK session: each kind a few times."""
    url = base + "/v1/mcp"
    counts: Counter[str] = Counter()
    ids: list[str] = []
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    http = httpx2.AsyncClient(
        headers={"Authorization": f"Bearer {key}"}, timeout=httpx2.Timeout(60, read=120)
    )
    try:
        async with http, Client(streamable_http_client(url, http_client=http), mode=mode) as c:
            for n in range(5):
                for asynchronous in (True, False):
                    text = (
                        f"{tag}: after the load, write {n} ({'async' if asynchronous else 'sync'})"
                    )
                    args = {"content": text, "user_id": "bulk", "async": asynchronous}
                    result = await c.call_tool("add_memory", args)
                    counts[
                        f"add_memory {'async' if asynchronous else 'sync'}: {classify(result)}"
                    ] += 1
                    memory_id = (result.structured_content or {}).get("memory_id")
                    if not result.is_error and not asynchronous and memory_id:
                        ids.append(str(memory_id))
            for memory_id in ids:
                content = f"{tag}: memory {memory_id} updated"  # each its own: no duplicate
                result = await c.call_tool(
                    "update_memory", {"memory_id": memory_id, "content": content}
                )
                counts[f"update_memory: {classify(result)}"] += 1
            for memory_id in ids:
                result = await c.call_tool("delete_memory", {"memory_id": memory_id})
                counts[f"delete_memory: {classify(result)}"] += 1
    except Exception as exc:  # the rest of the session's writes did not happen
        counts[f"session: {exception_label(exc)}"] += 1
    return counts


async def load_by_calls(base: str, key: str, tool: str, texts: list[str]) -> dict[str, Any]:
    """Store ``texts`` in namespace "bulk" by ``remember`` (/mcp) or asynchronous
    ``add_memory`` (/v1/mcp), 8 lean clients at once; then wait for the job queue."""
    queue = iter(texts)
    failures: Counter[str] = Counter()
    path = "/mcp" if tool == "remember" else "/v1/mcp"

    def arguments(text: str) -> dict[str, Any]:
        if tool == "remember":
            return {"content": text, "namespace": "bulk"}
        return {"content": text, "user_id": "bulk"}

    async def worker() -> None:
        connection = bench.HttpConnection(base + path, key)
        try:
            for n, text in enumerate(queue):
                status, payload = await connection.post(bench.tools_call(n, tool, arguments(text)))
                result = bench.outcome(status, payload)
                if result != "ok":
                    failures[result] += 1
        finally:
            await connection.close()

    started = time.monotonic()
    await asyncio.gather(*(worker() for _ in range(8)))
    caller = bench.Caller(base, key)
    try:
        drained = await bench.queue_drained(caller, timeout=1800)
    finally:
        await caller.close()
    return {
        "memories": len(texts),
        "seconds": round(time.monotonic() - started, 1),
        "drained": drained,
        "failures": dict(failures),
    }


def user_with_key(server: bench.Server, tier: str) -> str:
    email = f"{tier}@example.com"
    server.manage("create-user", email, "--tier", tier)
    return server.manage("create-key", email, "--tier", tier, "--name", tier).strip()


def import_for(server: bench.Server, email: str, texts: list[str], name: str) -> dict[str, Any]:
    path = server.data_dir / f"{name}.jsonl"
    with path.open("w", encoding="utf-8") as f:
        for n, text in enumerate(texts):
            record = {"namespace": "bulk", "content": text, "created_at": "2026-12-01T00:00:00Z"}
            f.write(json.dumps({**record, "metadata": {"seq": n}}) + "\n")
    started = time.monotonic()
    try:
        server.manage("import", email, str(path))
        outcome = "ok"
    except RuntimeError as exc:
        outcome = str(exc).strip().splitlines()[-1][:200]
    return {
        "memories": len(texts),
        "seconds": round(time.monotonic() - started, 1),
        "outcome": outcome,
    }


def unexplained(counts: dict[str, int]) -> int:
    return sum(
        n for label, n in counts.items() if label.rsplit(": ", 1)[-1] not in {"ok", *EXPLAINED}
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--memories", type=int, default=10_000)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--calls", type=int, default=10)
    parser.add_argument("--workers", type=int, help="recall serve --workers (default: its own)")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, seconds long")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    if args.smoke:
        args.memories, args.clients, args.calls = 30, 3, 2

    env = {} if args.workers is None else {"WEB_CONCURRENCY": str(args.workers)}
    server = bench.Server(env, pg_stats=False)
    # The real rate limits: drop the ones bench/http.py raises out of the way.
    for name in [n for n in server.env if n.startswith("RATE_LIMIT_")]:
        del server.env[name]
    report: dict[str, Any] = {"machine": bench.machine(), "config": vars(args) | {"json": None}}
    texts = bench.synthetic_sentences(args.memories * 3 + 500)
    try:
        server.start()
        assert server.first_key is not None
        report["config"]["server_workers"] = server.workers()
        base = server.url
        keys = {"unlimited": server.first_key}
        keys |= {tier: user_with_key(server, tier) for tier in ("free", "pro")}

        many: dict[str, dict[str, int]] = {}
        for tier in TIERS:
            for mode in MODES:
                for endpoint in ("/mcp", "/v1/mcp"):
                    label = f"{tier} {mode} {endpoint}"
                    counts = asyncio.run(
                        many_clients(base, keys[tier], mode, endpoint, args.clients, args.calls)
                    )
                    many[label] = dict(counts)
                    print(f"many clients, {label}: {dict(counts)}", flush=True)
        report["many_clients"] = many

        loads: dict[str, Any] = {}
        admin = "admin@localhost"
        chunks = [texts[i * args.memories : (i + 1) * args.memories] for i in range(3)]
        loads["unlimited via import"] = import_for(server, admin, chunks[0], "import-unlimited")
        loads["unlimited via remember"] = asyncio.run(
            load_by_calls(base, keys["unlimited"], "remember", chunks[1])
        )
        loads["unlimited via add_memory"] = asyncio.run(
            load_by_calls(base, keys["unlimited"], "add_memory", chunks[2])
        )
        loads["free via import"] = import_for(server, "free@example.com", chunks[0], "import-free")
        loads["pro via import"] = import_for(server, "pro@example.com", chunks[0], "import-pro")
        report["bulk_loads"] = loads
        print(f"bulk loads: {json.dumps(loads)}", flush=True)

        writes: dict[str, dict[str, int]] = {}
        for tier in TIERS:
            for mode in MODES:
                counts = asyncio.run(writes_after_load(base, keys[tier], mode, f"{tier}/{mode}"))
                writes[f"{tier} {mode}"] = dict(counts)
                print(f"writes after the load, {tier} {mode}: {dict(counts)}", flush=True)
        report["writes_after_load"] = writes
        report["machine"]["loadavg_at_end"] = [round(x, 2) for x in bench.os.getloadavg()]
    finally:
        server.stop()
        logs = server.logs()
        report["server_tracebacks"] = logs.count("Traceback")
        report["server_error_lines"] = sum(
            1 for line in logs.splitlines() if '"level": "error"' in line or " ERROR " in line
        )
        server.cleanup()

    every = [
        *report.get("many_clients", {}).values(),
        *report.get("writes_after_load", {}).values(),
    ]
    report["unexplained"] = sum(unexplained(c) for c in every)
    print(json.dumps({k: report[k] for k in ("unexplained", "server_tracebacks")}))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 1 if report["unexplained"] or report["server_tracebacks"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
