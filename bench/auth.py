"""Measure what an OAuth access token costs a request, against an API key, and memory_search.

    python bench/auth.py --json auth.json
    python bench/auth.py --smoke

Starts ``python -m recall serve`` on a free port and a throwaway data
directory (bench/http.py's ``Server``: every tier's rate limit raised), creates
a pro user with an API key, and one agent with an access token for ``/mcp``
and one for ``/agent/mcp``. The tokens are stored the way
the consent page stores them (hashed, bound to the agent and the resource) by
``recall manage shell``; the browser flow that issues them is tested in
tests/test_oauth_flow.py, and its cost is not what this measures.

It then seeds ``--memories`` notes into the agent's memory through
``memory_add`` and times one sequential client, on a keep-alive connection
per variant, sending the same requests with each credential:

* ``tools/list``: the gate and the SDK, nothing else. The difference between
  the key and the token is what checking the credential costs: an API key is
  found in the process's key cache after its first use, a token is looked up
  in the database on every request (see oauth/tokens.py).
* ``recall`` at ``/mcp`` with the key (user-wide, which includes the agent's
  memories) and with the token (acting as the agent), and ``memory_search`` at
  ``/agent/mcp``: the same question, over the same memories.

Variants take turns in rounds, in a shuffled order each round, so drift on a
shared machine spreads over all of them. Query vectors come from the query
cache (every question is asked once before the measured rounds), so the
figures are the request path and the search, not the embedding model.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

# Run as a script, this file's folder comes first on sys.path, where
# bench/http.py would shadow the standard library's ``http`` package.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
sys.path.insert(0, str(_HERE.parent))

from bench.http import (  # noqa: E402
    HttpConnection,
    Server,
    machine,
    outcome,
    synthetic_queries,
    synthetic_sentences,
    tools_call,
)

EMAIL = "bench@example.com"

# Run inside the server's environment by ``recall manage shell``: an agent,
# a public client, and a token for /mcp and one for /agent/mcp, stored as the
# consent page stores them. Prints "<path> <raw token>" for each.
MINT = """
import secrets
from datetime import timedelta

from django.utils import timezone
from oauth2_provider.models import set_token_value

from accounts import services
from oauth import resources
from oauth.models import AccessToken, Application
from core import tenancy

user = services.find_user(email={email!r})
agent = services.create_agent(user_id=user.id, name="bench")
with tenancy.operator():
    application = Application.objects.create(
        client_id="https://bench.example/recall-client.json",
        name="Recall bench",
        client_type=Application.CLIENT_PUBLIC,
        authorization_grant_type=Application.GRANT_AUTHORIZATION_CODE,
        redirect_uris="http://127.0.0.1:9/callback",
    )
    for path in (resources.MCP_PATH, resources.AGENT_MCP_PATH):
        raw = secrets.token_urlsafe(30)
        token = AccessToken(
            user=user,
            agent=agent,
            application=application,
            scope=resources.SCOPE,
            resource=[resources.identifier(path)],
            expires=timezone.now() + timedelta(hours=12),
        )
        set_token_value(token, raw)
        token.save()
        print(path, raw)
"""


def mint_tokens(server: Server) -> dict[str, str]:
    out = server.manage("manage", "shell", "-c", MINT.format(email=EMAIL))
    tokens = dict(line.split(" ", 1) for line in out.strip().splitlines() if line.startswith("/"))
    if set(tokens) != {"/mcp", "/agent/mcp"}:
        raise RuntimeError(f"could not mint tokens: {out!r}")
    return tokens


def tools_list(call_id: int) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": call_id, "method": "tools/list"}).encode()


async def seed(url: str, token: str, texts: list[str], concurrency: int = 4) -> float:
    """Store ``texts`` as notes through memory_add; return the seconds it took."""
    queue = iter(enumerate(texts))

    async def worker() -> None:
        connection = HttpConnection(url, token)
        try:
            for index, text in queue:
                status, payload = await connection.post(
                    tools_call(index, "memory_add", {"content": text})
                )
                if outcome(status, payload) != "ok":
                    raise RuntimeError(f"memory_add failed: {status} {payload[:300]!r}")
        finally:
            await connection.close()

    started = time.monotonic()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return time.monotonic() - started


def variants(server: Server, key: str, tokens: dict[str, str]) -> dict[str, tuple[str, str, str]]:
    """Name -> (URL, credential, what to send)."""
    mcp, agent_mcp = server.mcp_url, f"{server.url}/agent/mcp"
    return {
        "tools/list, API key, /mcp": (mcp, key, "list"),
        "tools/list, token, /mcp": (mcp, tokens["/mcp"], "list"),
        "tools/list, token, /agent/mcp": (agent_mcp, tokens["/agent/mcp"], "list"),
        "recall, API key, /mcp": (mcp, key, "recall"),
        "recall, token, /mcp": (mcp, tokens["/mcp"], "recall"),
        "memory_search, token, /agent/mcp": (agent_mcp, tokens["/agent/mcp"], "memory_search"),
    }


def body(kind: str, call_id: int, query: str) -> bytes:
    if kind == "list":
        return tools_list(call_id)
    return tools_call(call_id, kind, {"query": query, "limit": 10})


async def measure(
    plan: dict[str, tuple[str, str, str]], queries: list[str], *, rounds: int, per_round: int
) -> dict[str, list[float]]:
    connections = {
        name: HttpConnection(url, credential) for name, (url, credential, _) in plan.items()
    }
    latencies: dict[str, list[float]] = {name: [] for name in plan}
    order = list(plan)
    shuffle = random.Random(5)
    call_id = 0
    try:
        # Every question once per search variant: vectors cached, connections open.
        for name, (_, _, kind) in plan.items():
            for query in queries if kind != "list" else queries[:20]:
                call_id += 1
                status, payload = await connections[name].post(body(kind, call_id, query))
                if status != 200 or (kind != "list" and outcome(status, payload) != "ok"):
                    raise RuntimeError(f"{name}: {status} {payload[:300]!r}")
        for _ in range(rounds):
            shuffle.shuffle(order)
            for name in order:
                kind = plan[name][2]
                connection, mine = connections[name], latencies[name]
                for _ in range(per_round):
                    call_id += 1
                    request = body(kind, call_id, queries[call_id % len(queries)])
                    started = time.perf_counter()
                    status, payload = await connection.post(request)
                    mine.append((time.perf_counter() - started) * 1000)
                    if status != 200 or (kind != "list" and outcome(status, payload) != "ok"):
                        raise RuntimeError(f"{name}: {status} {payload[:300]!r}")
    finally:
        for connection in connections.values():
            await connection.close()
    return latencies


def summarise(latencies: dict[str, list[float]]) -> dict[str, dict[str, float]]:
    figures = {}
    for name, values in latencies.items():
        ordered = sorted(values)
        figures[name] = {
            "requests": len(ordered),
            "p50_ms": round(statistics.median(ordered), 3),
            "p95_ms": round(ordered[int(len(ordered) * 0.95) - 1], 3),
            "mean_ms": round(statistics.fmean(ordered), 3),
        }
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--memories", type=int, default=1000, help="notes in the agent's memory")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--per-round", type=int, default=100, help="requests per variant a round")
    parser.add_argument("--json", type=Path, help="write the report here")
    parser.add_argument("--smoke", action="store_true", help="a few requests of each: for CI")
    args = parser.parse_args(argv)
    if args.smoke:
        args.memories, args.rounds, args.per_round = 20, 2, 5
    if min(args.memories, args.rounds, args.per_round) < 1:
        parser.error("--memories, --rounds and --per-round must be at least 1")

    report: dict[str, Any] = {
        "machine": machine(),
        "config": {
            "memories": args.memories,
            "rounds": args.rounds,
            "per_round": args.per_round,
        },
    }
    server = Server({}, pg_stats=False).start()
    try:
        key = server.pro_key()
        tokens = mint_tokens(server)
        seconds = asyncio.run(
            seed(
                f"{server.url}/agent/mcp", tokens["/agent/mcp"], synthetic_sentences(args.memories)
            )
        )
        report["seed"] = {"memories": args.memories, "seconds": round(seconds, 1)}
        plan = variants(server, key, tokens)
        latencies = asyncio.run(
            measure(plan, synthetic_queries(80), rounds=args.rounds, per_round=args.per_round)
        )
    finally:
        server.stop()
        server.cleanup()
    report["results"] = summarise(latencies)
    report["machine"]["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    results = report["results"]
    key_list = results["tools/list, API key, /mcp"]["p50_ms"]
    token_list = results["tools/list, token, /mcp"]["p50_ms"]
    report["token_check_ms"] = round(token_list - key_list, 3)

    print(f"{'variant':<36} {'requests':>8} {'p50 ms':>8} {'p95 ms':>8} {'mean ms':>8}")
    for name, figures in results.items():
        print(
            f"{name:<36} {figures['requests']:>8} {figures['p50_ms']:>8.2f} "
            f"{figures['p95_ms']:>8.2f} {figures['mean_ms']:>8.2f}"
        )
    print(f"token check, median over the key's: {report['token_check_ms']:+.2f} ms")
    load = report["machine"]
    print(f"load average at start {load['loadavg_at_start']}, end {load['loadavg_at_end']}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
