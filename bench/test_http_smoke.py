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
