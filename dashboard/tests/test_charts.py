from __future__ import annotations

import re
from datetime import date, timedelta
from itertools import pairwise

import pytest

from dashboard.charts import nice_ceiling, stacked_bars

DAYS = [date(2026, 11, 1) + timedelta(days=n) for n in range(3)]


@pytest.mark.parametrize(
    ("value", "ceiling"), [(0, 1), (1, 1), (3, 5), (7, 10), (11, 20), (50, 50), (51, 100)]
)
def test_the_axis_ends_at_a_round_number(value, ceiling):
    assert nice_ceiling(value) == ceiling


def test_it_draws_one_segment_per_tool_and_day_with_calls():
    chart = stacked_bars(DAYS, {"recall": [2, 0, 1], "remember": [1, 0, 0]})

    segments = re.findall(r'data-tool="(\w+)" data-day="([\d-]+)" data-count="(\d+)"', chart.svg)
    assert sorted(segments) == [
        ("recall", "2026-11-01", "2"),
        ("recall", "2026-11-03", "1"),
        ("remember", "2026-11-01", "1"),
    ]
    assert chart.total == 4
    assert [(e.name, e.total) for e in chart.legend] == [("recall", 3), ("remember", 1)]
    assert "4 calls over 3 days" in chart.svg


def test_segments_of_a_day_stack_without_overlapping():
    chart = stacked_bars(DAYS, {"a": [3, 0, 0], "b": [2, 0, 0]})

    spans = [
        (float(y), float(y) + float(h))
        for y, h in re.findall(
            r'<rect x="[\d.]+" y="([\d.]+)" width="[\d.]+" height="([\d.]+)"', chart.svg
        )
    ]
    (top_a, bottom_a), (top_b, bottom_b) = sorted(spans, reverse=True)
    assert bottom_b <= top_a + 0.11
    # Heights are proportional to counts: 3 against 2.
    assert (bottom_a - top_a) / (bottom_b - top_b) == pytest.approx(1.5, rel=0.05)


def test_names_are_escaped():
    chart = stacked_bars(DAYS, {'<script>alert("x")</script>': [1, 0, 0]})

    assert "<script>" not in chart.svg
    assert "&lt;script&gt;" in chart.svg


def test_an_empty_chart_still_draws_its_axis():
    chart = stacked_bars(DAYS, {})

    assert chart.total == 0
    assert "<rect" not in chart.svg
    assert chart.svg.startswith("<svg")


def test_the_last_day_is_always_labelled_and_labels_never_crowd():
    days = [date(2026, 11, 1) + timedelta(days=n) for n in range(30)]

    chart = stacked_bars(days, {"recall": [1] * 30})

    labels = re.findall(
        r'<text class="axis" x="([\d.]+)" y="\d+" text-anchor="middle">([^<]+)<', chart.svg
    )
    assert labels[-1][1] == "Nov 30"
    xs = [float(x) for x, _ in labels]
    assert min(b - a for a, b in pairwise(xs)) > 60
