"""core/outage.py: a database outage is a few lines in the log, however requests meet it."""

from __future__ import annotations

import logging

import pytest

from core import outage


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    now = [1000.0]
    monkeypatch.setattr(outage.time, "monotonic", lambda: now[0])
    monkeypatch.setattr(outage, "_open", {})
    monkeypatch.setattr(outage, "_quiet", {})
    return now


def lines(caplog: pytest.LogCaptureFixture) -> list[tuple[str, dict]]:
    return [
        (r.getMessage(), {k: getattr(r, k, None) for k in ("down_s", "outages_since_last_log")})
        for r in caplog.records
        if r.name == "recall.outage"
    ]


def test_a_connection_that_keeps_dropping_is_not_two_lines_a_request(clock, caplog):
    # A backend killed every 0.3 s: each request met its own short outage, and
    # each was logged as it began and as it ended.
    caplog.set_level(logging.WARNING, logger="recall.outage")
    error = OSError("server closed the connection unexpectedly")
    for _ in range(50):
        outage.note("tool calls", error)
        clock[0] += 0.15
        outage.recovered("tool calls")
        clock[0] += 0.15

    assert [message for message, _ in lines(caplog)] == [
        "database unavailable",
        "database available again",
    ]
    # After the quiet spell, the next outage is told with the count of those it did not tell.
    caplog.clear()
    clock[0] += outage.INTERVAL
    outage.note("tool calls", error)
    [(message, extra)] = lines(caplog)
    assert message == "database unavailable"
    assert extra["outages_since_last_log"] == 49


def test_a_short_outage_after_a_logged_one_is_told_if_it_lasts(clock, caplog):
    caplog.set_level(logging.WARNING, logger="recall.outage")
    error = OSError("connection refused")
    outage.note("gate", error)
    outage.recovered("gate")
    clock[0] += 1
    outage.note("gate", error)  # counted, not told
    clock[0] += outage.INTERVAL
    outage.note("gate", error)  # still down: now it is told
    outage.recovered("gate")

    assert [message for message, _ in lines(caplog)] == [
        "database unavailable",
        "database available again",
        "database unavailable",
        "database available again",
    ]
    assert lines(caplog)[2][1] == {"down_s": outage.INTERVAL, "outages_since_last_log": 1}
