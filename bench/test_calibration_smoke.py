"""bench/calibration.py runs end to end in its smoke mode, against the search as it is.

It reads the hybrid statement's columns (similarity, score, coverage, rank):
a change to the statement that would silently break the study fails here.
"""

from __future__ import annotations

from pathlib import Path

from bench.test_smoke import run


def test_calibration_smoke_fits_and_reports_what_the_score_means(tmp_path: Path) -> None:
    report, stdout = run("calibration", tmp_path=tmp_path)

    assert {"today", "proposal", "two_fold", "values", "unrelated", "shipped"} <= report.keys()
    assert {"semantic", "lexical"} <= report.keys()
    proposal = report["proposal"]
    assert proposal["A"] > 0 and proposal["B"] >= 0
    shipped = report["shipped"]
    # The knowledge-update set joins where bench/knowledge_set.py is (issue 22).
    assert set(shipped["benchmarks"]) == {"locomo", "scifact", "knowledge"}
    for figures in shipped["unrelated"].values():
        assert figures["queries"] > 0
        assert 0.0 <= figures["best_at_least_0.5"] <= 1.0
    assert "the score the search returns now" in stdout
