"""bench/http.py runs end to end in its smoke mode, and attributes profiles as documented.

The smoke run starts a real ``python -m recall serve`` on a throwaway data
directory and drives it with real MCP clients (stateless POSTs and SDK
sessions). It checks that the run completes with no errors and reports what
it should, not how fast anything is.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from bench import http as bench_http

BENCH = Path(__file__).resolve().parent


def smoke_run(tmp_path: Path, *args: str) -> dict:
    """Run ``bench/http.py --smoke`` with ``args`` on its own data directory; return its report."""
    out = tmp_path / "http.json"
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "RECALL_DATA_DIR")}
    done = subprocess.run(
        [sys.executable, str(BENCH / "http.py"), "--smoke", *args, "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(out.read_text())


def test_the_smoke_run_finishes_with_no_errors_and_reports_every_level(tmp_path):
    report = smoke_run(tmp_path)
    assert {
        "machine",
        "config",
        "first_key_check",
        "seed",
        "results",
        "errors_total",
        "rate_limited_total",
    } <= report.keys()
    assert report["first_key_check"] == "ok"
    assert report["errors_total"] == 0
    assert report["seed"]["memories"] > 0
    levels = {(r["mix"], r["concurrency"]) for r in report["results"]}
    assert levels == {(mix, n) for mix in ("recall-heavy", "remember-heavy") for n in (1, 4)}
    for result in report["results"]:
        # Each level's whole result in the message: on a loaded machine the
        # smoke run's two seconds are short, and a failure should say why.
        assert result["errors"] == 0, result
        assert result["requests"] > 0, result
        assert {"rps", "rate_limited", "cpu_ms_per_request"} <= result.keys()
        for figures in result["tools"].values():
            assert {"rps", "p50_ms", "p95_ms", "p99_ms"} <= figures.keys()
        # The initialize handshake was exercised at every level.
        assert any(name.endswith("(SDK session)") for name in result["tools"]), result
    tools = {name for result in report["results"] for name in result["tools"]}
    assert {"recall", "remember", "list_memories"} <= tools

    # The default server's worker count, and the seed stored by recall import.
    assert report["config"]["workers"] >= 1
    assert report["seed"]["via"] == "recall import"
    # One client, one tool at a time: latency and CPU per call, server and PostgreSQL.
    sequential = report["sequential"]
    assert set(sequential) == {
        "recall hybrid, cached",
        "recall hybrid, new query",
        "recall semantic, cached",
        "recall lexical, repeated",
        "search_memory, cached",
        "search_memory, new query",
        "add_memory, async",
        "add_memory, sync",
        "update_memory",
        "get_memory_history",
        "get_all_memories",
        "cache_stats",
        "health_check",
        "delete_memory",
    }
    for name, figures in sequential.items():
        assert figures["errors"] == 0, (name, figures)
        assert figures["count"] == report["config"]["sequential_calls"], (name, figures)
        assert {"p50_ms", "p99_ms", "server_cpu_ms", "postgres_cpu_ms"} <= figures.keys()
    assert sequential["add_memory, async"]["queue_drained"] is True
    # Many clients: hybrid recall with repeated queries and with every query new.
    throughput = {r["mix"]: r for r in report["throughput"]}
    assert set(throughput) == {"hybrid, cached", "hybrid, new query"}
    for result in throughput.values():
        assert result["errors"] == 0, result
        assert result["concurrency"] == report["config"]["throughput_clients"]
        assert {"server", "postgres"} <= result["cpu_ms_per_request"].keys()
        assert result["tools"]["recall"]["p99_ms"] > 0


def test_profile_samples_are_attributed_to_layers():
    loop = "run (uvicorn/main.py:1);BaseEventLoop._run_once (asyncio/base_events.py:1)"
    worker = "Thread._bootstrap (threading.py:1);_run (memories/tools.py:1)"
    raw = "\n".join(
        [
            f"{worker};LocalEmbedder._run_batch (memories/embeddings/local.py:1);"
            "Session.run (onnxruntime/capi/x.py:1) 50",
            f"{worker};tenant (core/tenancy.py:1);Connection.wait (psycopg/connection.py:1) 20",
            f"{worker};tenant (core/tenancy.py:1);Cursor.execute (psycopg/cursor.py:1) 10",
            f"{loop};Recall.gate (recall/asgi.py:1);authenticate (recall/asgi.py:1) 5",
            f"{loop};observe_tool_calls (memories/mcp.py:1);Logger.info (logging/__init__.py:1) 5",
            f"{loop};ServerRunner._on_request (mcp/server/runner.py:1) 10",
            f"{loop};select (selectors.py:1) 999",
        ]
    )

    split = bench_http.profile_split(raw)

    assert split["samples"] == 100
    assert split["idle_samples"] == 999
    assert split["share"] == {
        "embedding": 0.5,
        "database (waiting)": 0.2,
        "database": 0.1,
        "MCP SDK + validation": 0.1,
        "auth + rate limit": 0.05,
        "logging": 0.05,
    }


def test_the_openai_stub_run_embeds_through_the_stub_and_not_the_model(tmp_path):
    report = smoke_run(tmp_path, "--openai-stub")
    assert report["errors_total"] == 0
    assert report["config"]["embedder"] == "OpenAI-compatible stub"
    # Without the stub in use, nothing would have asked it for a vector.
    assert report["stub_embedding_requests"] > 0


def test_the_reported_errors_run_counts_only_explained_refusals(tmp_path):
    out = tmp_path / "errors.json"
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "RECALL_DATA_DIR")}
    done = subprocess.run(
        [sys.executable, str(BENCH / "reported_errors.py"), "--smoke", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["unexplained"] == 0
    assert report["server_tracebacks"] == 0
    # Every tier, protocol mode and endpoint was driven, and most calls worked.
    many = report["many_clients"]
    assert len(many) == 3 * 2 * 2
    assert (
        sum(c.get("ok", 0) for c in many.values()) > sum(sum(c.values()) for c in many.values()) / 2
    )
    # The free tier's real rate limit refuses some calls, and they are counted
    # as explained refusals, not as errors: the run did not raise the limits.
    free = [c for label, c in many.items() if label.startswith("free ")]
    assert any(c.get("rate_limited", 0) for c in free), free
    # After each bulk load, seed 001's writes work for the tiers with room.
    writes = report["writes_after_load"]
    for label in ("pro legacy", "unlimited 2026-07-28"):
        assert writes[label].get("add_memory sync: ok", 0) > 0, writes[label]
        assert writes[label].get("update_memory: ok", 0) > 0, writes[label]
    assert all(load.get("outcome", "ok") == "ok" for load in report["bulk_loads"].values())
