"""What a user's usage events add up to: the dashboard's usage page and ``health_check``.

Read on the tenant path, so an agent sees only its own calls. A call the
rate limit refused never ran, and one cancelled while it ran was cut
short: neither counts as a failure, and neither's time is a latency.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Any

from django.db import connection
from django.db.models import Count, Q
from django.db.models.functions import TruncDate
from django.utils import timezone

from accounts import services as accounts_services
from billing.models import UsageEvent
from core import tenancy
from core import usage as core_usage


@dataclass(frozen=True)
class UsageSummary:
    days: list[date]
    # Calls per day, one list per tool, aligned with ``days``.
    calls: dict[str, list[int]]
    total: int
    failed: int  # failures other than rate limiting
    rate_limited: int
    p50_ms: float | None
    p95_ms: float | None

    @property
    def served(self) -> int:
        """The calls that ran: every call but those the rate limit refused."""
        return self.total - self.rate_limited

    @property
    def error_rate(self) -> float | None:
        return self.failed / self.served if self.served else None


@dataclass(frozen=True)
class AgentUsage:
    """One row of the usage page's breakdown by agent."""

    agent_id: uuid.UUID | None  # None: user-wide API keys, and agents since deleted
    name: str
    total: int
    failed: int
    rate_limited: int
    p50_ms: float | None


def usage_summary(
    *, user_id: uuid.UUID | str, days: int = 30, today: date | None = None
) -> UsageSummary:
    """Summarise the user's calls over the last ``days`` days, today included (UTC)."""
    since = _window_start(days, today)
    first = since.date()
    window = list(first + timedelta(days=n) for n in range(days))
    with tenancy.tenant(user_id):
        events = UsageEvent.objects.filter(user_id=user_id, occurred_at__gte=since)
        per_day = (
            events.annotate(day=TruncDate("occurred_at", tzinfo=UTC))
            .values("day", "tool_name")
            .annotate(n=Count("id"))
        )
        calls: dict[str, list[int]] = {}
        for row in per_day:
            series = calls.setdefault(row["tool_name"], [0] * days)
            index = (row["day"] - first).days
            if 0 <= index < days:
                series[index] += row["n"]
        totals = events.aggregate(**_counts())
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT percentile_cont(ARRAY[0.5, 0.95]) WITHIN GROUP (ORDER BY latency_ms)"  # noqa: S608
                f" FROM usage_events WHERE {_TIMED}",
                [str(user_id), since, core_usage.CANCELLED],
            )
            percentiles = cursor.fetchone()[0] or [None, None]
    return UsageSummary(
        days=window,
        calls=dict(sorted(calls.items())),
        total=totals["total"],
        failed=totals["failed"],
        rate_limited=totals["rate_limited"],
        p50_ms=percentiles[0],
        p95_ms=percentiles[1],
    )


def usage_by_agent(
    *, user_id: uuid.UUID | str, days: int = 30, today: date | None = None
) -> list[AgentUsage]:
    """Break the user's calls over the last ``days`` days down by the agent they acted as.

    Every agent the user has gets a row, idle ones too, by name; calls made
    without an agent (user-wide keys, and agents deleted since, whose events
    keep no agent) come last, when there are any.
    """
    since = _window_start(days, today)
    with tenancy.tenant(user_id):
        counted = {
            row["agent_id"]: row
            for row in UsageEvent.objects.filter(user_id=user_id, occurred_at__gte=since)
            .values("agent_id")
            .annotate(**_counts())
        }
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT agent_id, percentile_cont(0.5) WITHIN GROUP (ORDER BY latency_ms)"  # noqa: S608
                f" FROM usage_events WHERE {_TIMED} GROUP BY agent_id",
                [str(user_id), since, core_usage.CANCELLED],
            )
            medians = dict(cursor.fetchall())
    rows: list[tuple[uuid.UUID | None, str]] = [
        (agent.id, agent.name) for agent in accounts_services.list_agents(user_id=user_id)
    ]
    if None in counted:
        rows.append((None, ""))

    def row(agent_id: uuid.UUID | None, name: str) -> AgentUsage:
        found = counted.get(agent_id, {})
        return AgentUsage(
            agent_id=agent_id,
            name=name,
            total=found.get("total", 0),
            failed=found.get("failed", 0),
            rate_limited=found.get("rate_limited", 0),
            p50_ms=medians.get(agent_id),
        )

    return [row(agent_id, name) for agent_id, name in rows]


_LIMITED = "rate_limited"

# A user's events since a moment whose latency means something: a call the
# rate limit refused never ran, and a cancelled one was cut short.
# Parameters: the user's id, the window's start, ``core_usage.CANCELLED``.
_TIMED = (
    "user_id = %s AND occurred_at >= %s"
    f" AND error_code IS DISTINCT FROM '{_LIMITED}' AND error_code IS DISTINCT FROM %s"
)


def _counts() -> dict[str, Count]:
    """Return the aggregates both breakdowns count: calls, failures and refusals.

    A refused call and a cancelled one are no failures of ours.
    """
    limited = Q(error_code=_LIMITED)
    return {
        "total": Count("id"),
        "failed": Count(
            "id", filter=Q(success=False) & ~limited & ~Q(error_code=core_usage.CANCELLED)
        ),
        "rate_limited": Count("id", filter=limited),
    }


def _window_start(days: int, today: date | None) -> datetime:
    """Return the first moment (UTC) of a window of ``days`` days ending today."""
    today = today or timezone.now().astimezone(UTC).date()
    first = today - timedelta(days=days - 1)
    return datetime(first.year, first.month, first.day, tzinfo=UTC)


@dataclass(frozen=True)
class Latency:
    calls: int
    p50_ms: float | None
    p95_ms: float | None


def recent_latency(
    *,
    user_id: uuid.UUID | str,
    agent_id: uuid.UUID | str | None = None,
    api_key_id: uuid.UUID | str | None = None,
    calls: int = 1000,
) -> Latency:
    """Return the median and 95th percentile latency of a caller's latest successful calls.

    The caller is one key when ``api_key_id`` is given, else the whole user;
    an agent sees only its own calls (row-level security). Rate-limited
    calls (which never ran) are left out.
    """
    sql = (
        "SELECT count(*), percentile_cont(0.5) WITHIN GROUP (ORDER BY latency_ms),"
        " percentile_cont(0.95) WITHIN GROUP (ORDER BY latency_ms)"
        " FROM (SELECT latency_ms FROM usage_events"
        " WHERE user_id = %s AND success AND (%s::uuid IS NULL OR api_key_id = %s)"
        " ORDER BY occurred_at DESC LIMIT %s) AS recent"
    )
    key = str(api_key_id) if api_key_id else None
    params: list[Any] = [str(user_id), key, key, calls]
    with tenancy.tenant(user_id, agent_id=agent_id), connection.cursor() as cursor:
        cursor.execute(sql, params)
        count, p50, p95 = cursor.fetchone()
    return Latency(
        calls=int(count),
        p50_ms=round(float(p50), 1) if p50 is not None else None,
        p95_ms=round(float(p95), 1) if p95 is not None else None,
    )
