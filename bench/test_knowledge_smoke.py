"""bench/knowledge.py runs end to end in its smoke mode, over a real server and MCP client."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bench.test_smoke import run


@pytest.fixture(scope="module")
def smoke(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], str, Path]:
    folder = tmp_path_factory.mktemp("knowledge")
    report, stdout = run("knowledge", "--calibrate", tmp_path=folder)
    return report, stdout, folder


def test_knowledge_smoke_reports_every_figure(smoke: tuple[dict[str, Any], str, Path]) -> None:
    report, stdout, _ = smoke

    for split in ("dev", "test"):
        rows = report["mcp"][split]
        for row in ("server", "server+detector", "hints judged right", "hints all taken"):
            figures = rows[row]
            for key in (
                "current@1",
                "stale_unmarked@5",
                "false_supersession",
                "lookalike_marked",
                "lookalike@1",
            ):
                assert 0.0 <= figures[key] <= 1.0
            assert figures["chain_questions"] == 6
            assert figures["lookalike_questions"] == 8
        # The server hides what it found replaced; on this slice it marks no
        # look-alike may_be_replaced_by for its own question.
        assert rows["server"]["lookalike_marked"] == 0.0
        assert rows["server"]["stale_unmarked@5"] < 1.0
        # Read marks count as marks: links alone leave at least as much showing.
        links = rows["server, links only"]
        assert links["stale_unmarked@5"] >= rows["server"]["stale_unmarked@5"]
        assert 0 <= rows["server"]["read_marks_true"] <= rows["server"]["read_marks"]
        assert "read_marks" not in links
        # Named with replaces, no outdated version shows.
        assert rows["explicit"]["stale_unmarked@5"] == 0.0
        assert rows["server+detector"]["replaced"] > 0
        # An agent that links only true hints hides no look-alike, and no
        # more outdated versions show than with the rules alone.
        judged, taken = rows["hints judged right"], rows["hints all taken"]
        assert judged["lookalike_marked"] == 0.0
        assert judged["false_supersession"] <= rows["server"]["false_supersession"]
        assert judged["stale_unmarked@5"] <= rows["server"]["stale_unmarked@5"]
        assert taken["stale_unmarked@5"] <= rows["server"]["stale_unmarked@5"]
        assert report["offline"][split]["updates"] == 6
        assert "raw" not in rows  # it goes beside the report
    assert report["mcp"]["server_takes_replaces"] is True
    latency = report["latency"]
    assert latency["remember_ms"]["p50"] > 0
    assert latency["with_detection_ms"]["p50"] > 0
    assert isinstance(latency["added_p50_ms"], float)
    assert report["calibration"]["pairs"] > 0
    assert "Over MCP" in stdout


def test_knowledge_replays_a_saved_run_without_a_server(
    smoke: tuple[dict[str, Any], str, Path], tmp_path: Path
) -> None:
    first, _, folder = smoke
    saved = folder / "knowledge.raw.json"
    raw = json.loads(saved.read_text())
    assert len(raw["dev"]["answers"]) == 14  # every question's results
    assert len(raw["dev"]["writes"]) == 25  # every write but the first: its candidates

    again, stdout = run(
        "knowledge", "--latency-size", "0", "--replay", str(saved), tmp_path=tmp_path
    )

    assert "starting python -m recall serve" not in stdout
    for split in ("dev", "test"):
        assert again["mcp"][split]["server"] == first["mcp"][split]["server"]
        detected = dict(again["mcp"][split]["server+detector"])
        expected = dict(first["mcp"][split]["server+detector"])
        detected.pop("decide_ms"), expected.pop("decide_ms")
        assert detected == expected
