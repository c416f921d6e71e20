"""bench/calibration.py fits and reports an absolute score in its smoke mode."""

from __future__ import annotations

from pathlib import Path

from bench.test_smoke import run


def test_calibration_smoke_reports_a_fitted_score_and_its_meaning(tmp_path: Path) -> None:
    report, stdout = run("calibration", tmp_path=tmp_path)

    proposal = report["proposal"]
    assert proposal["A"] > 0  # more similar, more relevant
    assert {"locomo_hit@5", "scifact_ndcg@10", "knowledge_hit@5"} <= report["today"].keys()
    assert {"locomo_hit@5", "scifact_ndcg@10"} <= proposal.keys()
    assert len(report["two_fold"]) == 2
    assert set(report["values"]) == {"locomo", "scifact", "knowledge"}
    for figures in report["unrelated"].values():
        assert figures["queries"] > 0
        assert 0.0 <= figures["proposal_best_at_least_0.5"] <= 1.0
    # The score is absolute: more similar means a higher score, whatever the pool.
    examples = report["lone_match_examples"]
    assert examples["similarity 0.3, coverage 0.0"] < examples["similarity 0.6, coverage 0.0"]
    assert report["thresholds"][0]["rule"].startswith("today")
    assert "proposal: score = 1 / (1 + exp(" in stdout
