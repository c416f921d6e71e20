"""Each benchmark script runs end to end in its smoke mode.

These check that the scripts work and report what they should, not how fast
anything is: the smoke sizes are far too small to mean anything. Each script
starts its own throwaway PostgreSQL, as it does for real runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parent


def run(script: str, *args: str, tmp_path: Path) -> tuple[dict[str, Any], str]:
    out = tmp_path / f"{script}.json"
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    done = subprocess.run(
        [sys.executable, str(BENCH / f"{script}.py"), "--smoke", "--json", str(out), *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(out.read_text()), done.stdout


@pytest.fixture(scope="module")
def scale(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], str]:
    return run("scale", tmp_path=tmp_path_factory.mktemp("scale"))


def test_scale_smoke_reports_every_measurement(scale: tuple[dict[str, Any], str]) -> None:
    report, stdout = scale

    assert {"machine", "database", "config", "results"} <= report.keys()
    layouts = {(r["size"], r["layout"]) for r in report["results"]}
    assert layouts == {(240, "one"), (240, "spread")}
    for result in report["results"]:
        assert result["load"]["rows_per_s"] > 0
        assert result["index"]["index_mib"] > 0
        for key in ("recall_raw_sql_ms", "recall_service_ms", "recall_service_embedded_ms"):
            assert {"p50", "p95", "p99"} <= result[key].keys()
        assert set(result["modes"]) == {"semantic", "hybrid", "lexical"}
        for timings in result["modes"].values():
            assert {"p50", "p95"} <= timings["service_ms"].keys()
            assert {"p50", "p95"} <= timings["raw_sql_ms"].keys()
        assert 0.0 <= result["recall_at_10"] <= 1.0
        assert set(result["filters"]) == {"1%", "5%"}
        for figures in result["filters"].values():
            assert figures["hybrid"]["ms"]["p50"] > 0
            assert figures["hybrid"]["outside_filter"] == 0
        assert "offset_0_ms" in result["list"]
        assert {"stubbed_ms", "embedded_ms", "stubbed_per_s"} <= result["remember"].keys()
        assert {"by_id_ms", "preview_ms", "confirm_ms"} <= result["forget"].keys()
        assert result["forget"]["deleted_by_query"] > 0
        assert result["ef_search_sweep"] and result["scan_sweep"]
        assert result["memory"]["query"]["python_rss_mib"] > 0
    assert "size/layout" in stdout


def test_retrieval_smoke_reports_every_metric(tmp_path: Path) -> None:
    report, stdout = run("retrieval", "--cross-validate", tmp_path=tmp_path)

    turns = report["locomo"]["turns"]
    for key in ("recall@5", "recall@10", "hit@5", "hit@10", "mrr", "mrr@10", "ndcg@10"):
        assert key in turns["overall_1_4"]
    assert 0.0 <= turns["overall_1_4"]["evidence_marked@5"] <= 1.0
    assert set(turns["by_category"]) == {"1", "2", "3", "4", "5"}
    assert turns["category_5"]["questions"] == 1
    assert {"turns+hybrid", "turns+semantic", "turns+lexical"} <= report["locomo"].keys()
    # The default row is the default mode's, found by a call that names no mode.
    assert report["default_mode"] == "hybrid"
    assert turns == report["locomo"]["turns+hybrid"]
    for name in ("default", "hybrid", "dense", "bm25"):
        assert {"ndcg@10", "recall@100", "mrr"} <= report["scifact"][name].keys()
    for name in ("locomo", "scifact"):
        assert {"default", "hybrid", "semantic", "lexical"} <= report["latency_ms"][name].keys()
    folds = report["cross_validation"]["folds"]
    assert [fold["held_out"] for fold in folds] == ["smoke-1"]
    assert {"hit@5", "mrr@10"} <= report["cross_validation"]["pooled_held_out"].keys()
    assert {"locomo", "scifact"} <= report["similarity"].keys()
    assert "SciFact" in stdout


def test_plots_draw_small_pngs_from_a_scale_report(
    scale: tuple[dict[str, Any], str], tmp_path: Path
) -> None:
    pytest.importorskip("matplotlib")
    from bench import plots

    written = plots.plot_scale([scale[0]], tmp_path)

    assert written
    for path in written:
        assert 0 < path.stat().st_size < 200_000


def test_plots_render_the_benchmarks_tables_from_a_scale_report(
    scale: tuple[dict[str, Any], str],
) -> None:
    from bench import plots

    tables = plots.markdown_tables([scale[0]])

    rows = [line for line in tables.splitlines() if line.startswith("| 240 / ")]
    assert len(rows) == 4  # two layouts, in each of the two tables
    assert all("—" not in row.split("|")[5] for row in rows[:2])  # statement latencies present


def test_soak_smoke_runs_clean_and_reports_latency_and_memory(tmp_path: Path) -> None:
    report, stdout = run("soak", tmp_path=tmp_path)

    assert report["errors"] == {}
    assert report["error_log_lines"] == 0
    assert report["error_log"] == []
    assert report["calls"] > 0
    assert report["config"]["free_tier_clients"] == 1
    assert {"p50", "p95", "p99"} <= report["latency_ms"]["all"].keys()
    assert {"remember", "recall"} <= report["latency_ms"].keys()
    assert report["memory"]["server_rss"]["end_mib"] > 0
    assert report["usage_events_at_end"]["dropped"] == 0
    assert "errors other than 429: 0" in stdout


def test_a_failed_soak_names_the_servers_errors_and_where_without_their_content() -> None:
    from bench import soak

    failed = {
        "level": "error",
        "logger": "memories.tools",
        "event": "tool failed",
        "tool": "forget",
        "content_sha256": "1f2e3d4c",
        "note": "Alice banks with Zephyr",
        "exc_type": "django.db.utils.OperationalError",
        "sqlstate": "40P01",
        "origin": f"{soak.REPO}/memories/services/changes.py:170 in forget_by_id",
        "frames": [
            f"{soak.REPO}/memories/mcp/runtime.py:116 in _run",
            f"{soak.REPO}/memories/services/changes.py:170 in forget_by_id",
            f"{soak.REPO}/.venv/lib/python3.11/site-packages/psycopg/cursor.py:117 in execute",
        ],
    }
    finished = {"level": "error", "event": "tool call finished", "error_code": "internal_error"}
    logs = "\n".join(
        [json.dumps(failed), json.dumps(finished), '{"level": "info", "event": "ok"}'] * 2
    )

    assert soak.server_errors(logs) == [
        {
            "event": "tool failed",
            "tool": "forget",
            "exc_type": "django.db.utils.OperationalError",
            "sqlstate": "40P01",
            "origin": "memories/services/changes.py:170 in forget_by_id",
            "frames": [
                "memories/mcp/runtime.py:116 in _run",
                "memories/services/changes.py:170 in forget_by_id",
            ],
            "count": 2,
        },
        {"event": "tool call finished", "error_code": "internal_error", "count": 2},
    ]


def test_lifecycle_smoke_reports_latency_throughput_and_the_cache(tmp_path: Path) -> None:
    report, stdout = run("lifecycle", tmp_path=tmp_path)

    assert set(report["remember"]) == {"sync", "async", "async_free_tier", "commit_floor"}
    assert set(report["remember_http"]) == {"sync", "async"}
    for figures in [*report["remember"].values(), *report["remember_http"].values()]:
        assert {"p50", "p95", "p99"} <= figures.keys()
    for by_threads in report["queue"].values():
        assert all(r["jobs_per_s"] > 0 for r in by_threads.values())
    assert set(report["queue"]) == {"model", "stubbed"}
    assert {"hit", "miss", "miss_over_hit_p50"} <= report["cache"].keys()
    assert "jobs/s drained" in stdout


def test_priority_smoke_reports_every_scheme(tmp_path: Path) -> None:
    report, stdout = run("priority", tmp_path=tmp_path)

    assert set(report["schemes"]) == {
        "none",
        "random",
        "helpful",
        "adversarial",
        "critical-distractors",
    }
    for scheme, figures in report["schemes"].items():
        assert {"hit@1", "hit@5", "mrr"} <= figures.keys()
        if scheme != "none":
            assert figures["largest_lift"] < 0.01
    assert "max lift" in stdout


def test_auth_smoke_times_every_credential_and_endpoint(tmp_path: Path) -> None:
    report, stdout = run("auth", tmp_path=tmp_path)

    assert report["seed"]["memories"] == 20
    assert set(report["results"]) == {
        "tools/list, API key, /mcp",
        "tools/list, token, /mcp",
        "tools/list, token, /agent/mcp",
        "recall, API key, /mcp",
        "recall, token, /mcp",
        "memory_search, token, /agent/mcp",
    }
    for figures in report["results"].values():
        assert figures["requests"] == 10
        assert 0 < figures["p50_ms"] <= figures["p95_ms"]
    assert "token_check_ms" in report
    assert "token check, median over the key's" in stdout


def test_fastpath_smoke_reports_both_paths_for_each_request(tmp_path: Path) -> None:
    report, stdout = run("fastpath", tmp_path=tmp_path)

    assert set(report["cpu_per_request"]) == {"ping", "tools/list", "list_memories", "recall"}
    for figures in report["cpu_per_request"].values():
        assert figures["sdk_us"] > 0 and figures["fast_us"] > 0
    assert "fast path" in stdout


def test_ratelimit_measures_the_shared_memory_limiter_across_processes(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(BENCH / "ratelimit.py"), "--checks", "2000", "--processes", "2"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )

    assert done.returncode == 0, done.stderr[-3000:]
    assert "shared memory" in done.stdout and "shared x2 procs" in done.stdout


def test_cutoff_smoke_times_every_tenant_mode_and_way(tmp_path: Path) -> None:
    report, stdout = run("cutoff", tmp_path=tmp_path)

    [(table, cut_off)] = report["cut_off"].items()
    assert table == "300, 40, 120"  # one shared table
    assert set(cut_off) == {"semantic", "hybrid"}
    assert all(n >= 2000 for n in cut_off.values())  # RECALL_EXACT_SEARCH_MAX floor
    seen = {(r["tenant"], r["table"], r["mode"]) for r in report["results"]}
    assert seen == {(size, 460, mode) for size in (300, 40, 120) for mode in ("semantic", "hybrid")}
    for result in report["results"]:
        assert result["rule_takes"] == "exact"  # the smoke tenants are all under 2,000
        for way in ("rule", "exact", "index"):
            assert result[way]["p50"] > 0
        # Taking the exact scan, the rule returns exactly its results.
        assert result["overlap@10"]["rule"] == 1.0
        assert 0 <= result["overlap@10"]["index"] <= 1
    assert "rule takes" in stdout


def test_cutoff_smoke_with_no_big_tenant_gives_each_tenant_its_own_table(tmp_path: Path) -> None:
    report, _ = run("cutoff", "--big", "0", tmp_path=tmp_path)

    assert set(report["cut_off"]) == {"40", "120"}
    seen = {(r["tenant"], r["table"], r["mode"]) for r in report["results"]}
    assert seen == {(size, size, mode) for size in (40, 120) for mode in ("semantic", "hybrid")}


def test_imports_smoke_measures_both_sources_twice(tmp_path: Path) -> None:
    report, stdout = run("imports", "--workdir", str(tmp_path / "work"), tmp_path=tmp_path)

    cases = {case["format"]: case for case in report["cases"]}
    assert set(cases) == {"mcp-memory-service", "mem0"}
    mcp, mem0 = cases["mcp-memory-service"], cases["mem0"]
    assert (mcp["first"]["imported"], mcp["first"]["reused"], mcp["first"]["embedded"]) == (
        400,
        400,
        0,
    )
    assert (mem0["first"]["imported"], mem0["first"]["embedded"]) == (400, 400)
    for case in (mcp, mem0):
        assert case["again"]["duplicates"] == 400 and case["again"]["imported"] == 0
        assert case["first"]["records_per_second"] > 0
        assert case["peaks"]["first"]["python_rss_mib"] > 0
    assert "reused" in stdout


def test_cache_tenancy_smoke_reports_both_hit_rates(tmp_path: Path) -> None:
    report, stdout = run("cache_tenancy", tmp_path=tmp_path)

    shared_only = report["synthetic"]["0.5"]
    assert shared_only["shared_hit_rate"] > shared_only["private_hit_rate"] > 0
    assert report["synthetic"]["0.0"]["cost_points"] == 0
    assert "synthetic, 50% generic" in stdout
