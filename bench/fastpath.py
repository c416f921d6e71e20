"""CPU per request of the fast path against the MCP SDK's stateless transport, in one process.

    python bench/fastpath.py                 # ping, tools/list, list_memories, recall
    python bench/fastpath.py --calls 3000 --rounds 5 --json fastpath.json
    python bench/fastpath.py --smoke

Both paths answer the same requests on the same endpoint objects of the app
(``recall.asgi.Recall``), behind the gate's ``Clean`` wrapper, with the
caller set as the gate sets it, against a throwaway embedded PostgreSQL with
a few hundred memories. No HTTP: this isolates what the fast path changes.
Rounds alternate the paths, and the figure is the median over rounds of the
process CPU time (every thread: the event loop, the tool's worker thread, the
usage recorder) divided by the calls. ``recall`` repeats one query, so the
query-embedding cache answers and the model's time stays out.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

# Run as a script, Python puts bench/ first on sys.path, where bench/http.py
# would stand in for the standard library's http package.
_ROOT = str(Path(__file__).resolve().parent.parent)
if sys.path[0] == str(Path(__file__).resolve().parent):
    sys.path[0] = _ROOT
elif _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from bench import harness  # noqa: E402

LEGACY = {
    "content-type": "application/json",
    "accept": "application/json, text/event-stream",
    "mcp-protocol-version": "2025-11-25",
}
REQUESTS: dict[str, tuple[str, dict[str, Any]]] = {
    "ping": ("ping", {}),
    "tools/list": ("tools/list", {}),
    "list_memories": ("tools/call", {"name": "list_memories", "arguments": {"limit": 10}}),
    "recall": ("tools/call", {"name": "recall", "arguments": {"query": "release notes"}}),
}


def main() -> None:  # noqa: C901 - one linear script: set up, measure, report
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=1000, help="calls per round and path")
    parser.add_argument("--rounds", type=int, default=3, help="rounds; medians are reported")
    parser.add_argument("--memories", type=int, default=300, help="memories stored first")
    parser.add_argument("--smoke", action="store_true", help="a few calls, to check it runs")
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args()
    if args.smoke:
        args.calls, args.rounds, args.memories = 20, 1, 20

    where = harness.configure()
    import anyio

    from accounts import auth, services
    from core import context
    from recall import jsonrpc
    from recall.asgi import Recall

    user = services.create_user(email="bench@example.com", tier="team")
    _, raw = services.issue_key(user=user, name="bench")
    caller = auth.authenticate(raw)
    assert caller is not None
    from memories import services as memory_services

    for n in range(args.memories):
        memory_services.remember(
            user_id=user.id, tier="team", content=f"Release note {n}: fixed bug number {n * 7}."
        )
    app = Recall()
    endpoint = app.endpoints["/mcp"]
    fast_path = endpoint.fast
    assert fast_path is not None, "MCP_FAST_PATH is off"
    scope = {
        "type": "http",
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/mcp",
        "raw_path": b"/mcp",
        "query_string": b"",
        "headers": [(k.encode(), v.encode()) for k, v in LEGACY.items()],
        "server": ("127.0.0.1", 80),
        "client": ("127.0.0.1", 1),
    }

    async def one(body: bytes, message: dict[str, Any], fast: bool) -> None:
        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": body, "more_body": False}

        sent: list[int] = []

        async def send(event: Any) -> None:
            if event["type"] == "http.response.start":
                sent.append(event["status"])

        token = auth.current.set(caller)
        rid = context.request_id.set("bench")
        try:
            clean = jsonrpc.Clean(send)
            if not (fast and await fast_path.answer(scope, receive, body, message, clean)):
                await endpoint.sessions.handle_request(scope, receive, clean)
        finally:
            auth.current.reset(token)
            context.request_id.reset(rid)
        assert sent and sent[0] == 200, sent

    async def measure() -> dict[str, Any]:
        results: dict[str, Any] = {}
        async with endpoint.sessions.run():
            for name, (method, params) in REQUESTS.items():
                message = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
                body = json.dumps(message).encode()
                for fast in (False, True):  # warm both paths, caches and connections
                    for _ in range(20):
                        await one(body, message, fast)
                per_call: dict[str, list[float]] = {"sdk": [], "fast": []}
                for round_ in range(args.rounds):
                    # Alternate which path goes first, so drift falls on both.
                    order = (False, True) if round_ % 2 == 0 else (True, False)
                    for fast in order:
                        started = time.process_time()
                        for _ in range(args.calls):
                            await one(body, message, fast)
                        cpu = (time.process_time() - started) / args.calls * 1e6
                        per_call["fast" if fast else "sdk"].append(cpu)
                sdk, fast_us = (
                    statistics.median(per_call["sdk"]),
                    statistics.median(per_call["fast"]),
                )
                results[name] = {
                    "sdk_us": round(sdk, 1),
                    "fast_us": round(fast_us, 1),
                    "saved_us": round(sdk - fast_us, 1),
                    "rounds": per_call,
                }
                print(
                    f"{name:<14} SDK {sdk:8.0f} us   fast path {fast_us:8.0f} us"
                    f"   saved {sdk - fast_us:7.0f} us ({(sdk - fast_us) / sdk:.0%})",
                    flush=True,
                )
        return results

    results = anyio.run(measure)
    if args.json:
        report = {
            "machine": harness.machine(),
            "database": where,
            "config": vars(args) | {"json": str(args.json)},
            "cpu_per_request": results,
        }
        args.json.write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
