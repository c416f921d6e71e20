"""bench/knowledge.py runs end to end in its smoke mode, over a real server and MCP client."""

from __future__ import annotations

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
    latency = report["latency"]
    assert latency["remember_ms"]["p50"] > 0
    assert set(latency["added_p50_ms"]) == {"hybrid", "semantic"}
    assert report["calibration"]["pairs"] > 0
    assert "Over MCP" in stdout
