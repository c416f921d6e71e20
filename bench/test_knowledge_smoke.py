"""bench/knowledge.py runs end to end in its smoke mode, over a real server and MCP client."""

from __future__ import annotations

import json
from pathlib import Path

from bench.test_smoke import run


def test_knowledge_smoke_reports_every_figure(tmp_path: Path) -> None:
    report, stdout = run("knowledge", "--calibrate", tmp_path=tmp_path)

    for split in ("dev", "test"):
        rows = report["mcp"][split]
        for row in ("server", "server+detector"):
            figures = rows[row]
            for key in ("current@1", "stale_unmarked@5", "false_supersession", "lookalike_marked"):
                assert 0.0 <= figures[key] <= 1.0
            assert figures["chain_questions"] == 6
            assert figures["lookalike_questions"] == 8
        # Today's server marks nothing: the baseline shows every stale version.
        assert rows["server"]["lookalike_marked"] == 0.0
        assert rows["server"]["stale_unmarked@5"] > 0.5
        # The detector, run client-side, hides some of them.
        assert rows["server+detector"]["replaced"] > 0
        assert rows["server+detector"]["stale_unmarked@5"] < rows["server"]["stale_unmarked@5"]
        assert report["offline"][split]["updates"] == 6
        assert "raw" not in rows  # it goes beside the report
    latency = report["latency"]
    assert latency["remember_ms"]["p50"] > 0
    assert set(latency["added_p50_ms"]) == {"hybrid", "semantic", "lean"}
    assert latency["lean_statement_execution_ms"]["p50"] > 0
    assert report["calibration"]["pairs"] > 0
    assert "Over MCP" in stdout


def test_knowledge_replays_a_saved_run_without_a_server(tmp_path: Path) -> None:
    first, _ = run("knowledge", "--latency-size", "0", tmp_path=tmp_path)
    saved = tmp_path / "knowledge.raw.json"
    raw = json.loads(saved.read_text())
    assert len(raw["dev"]["answers"]) == 14  # every question's results
    assert len(raw["dev"]["writes"]) == 25  # every write but the first: its candidates

    again, _ = run("knowledge", "--latency-size", "0", "--replay", str(saved), tmp_path=tmp_path)

    for split in ("dev", "test"):
        for row in ("server", "server+detector"):
            assert again["mcp"][split][row] == first["mcp"][split][row] | (
                {"decide_ms": again["mcp"][split][row]["decide_ms"]} if row != "server" else {}
            )
