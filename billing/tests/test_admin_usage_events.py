from __future__ import annotations

import csv
import io
import re
from datetime import timedelta

import pytest
from asgiref.sync import async_to_sync
from django.db import connection
from django.test import AsyncClient, RequestFactory
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from billing import admin as billing_admin
from billing.models import UsageEvent
from core import tenancy
from core.admin_tools import EstimatedCountPaginator

URL = "/admin/billing/usageevent/"
EXPORT = URL + "export/"


def add_event(user, *, request_id, tool="recall", success=True, error_code=None, ago=0, key=None):
    with tenancy.operator():
        return UsageEvent.objects.create(
            user=user,
            api_key=key,
            request_id=request_id,
            tool_name=tool,
            success=success,
            error_code=error_code,
            latency_ms=12,
            occurred_at=timezone.now() - timedelta(days=ago),
        )


@pytest.fixture
def events(cast):
    add_event(cast.alice, request_id="a-ok", tool="remember", key=cast.alice_key.key)
    add_event(cast.alice, request_id="a-bad", success=False, error_code="validation_failed")
    add_event(cast.alice, request_id="a-limited", success=False, error_code="rate_limited")
    add_event(cast.charlie, request_id="c-old", tool="forget", ago=40)
    return cast


def shown(response) -> set[str]:
    return set(re.findall(r"\b[ac]-(?:ok|bad|limited|old)\b", response.content.decode()))


def test_it_lists_every_tenants_events(events, admin_client):
    response = admin_client.get(URL)

    assert response.status_code == 200
    assert shown(response) == {"a-ok", "a-bad", "a-limited", "c-old"}


def test_events_are_read_only(events, admin_client):
    event = UsageEvent.objects.none()
    with tenancy.operator():
        event = UsageEvent.objects.get(request_id="a-ok")

    assert admin_client.get(URL + "add/").status_code == 403
    assert admin_client.post(f"{URL}{event.id}/change/", {"tool_name": "x"}).status_code == 403
    assert admin_client.post(f"{URL}{event.id}/delete/", {"post": "yes"}).status_code == 403
    assert "delete_selected" not in admin_client.get(URL).content.decode()


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        ({"user_email": "charlie@example.com"}, {"c-old"}),
        ({"tool": "remember"}, {"a-ok"}),
        ({"success__exact": "0"}, {"a-bad", "a-limited"}),
        ({"success__exact": "1"}, {"a-ok", "c-old"}),
        ({"error": "rate_limited"}, {"a-limited"}),
        ({"q": "a-bad"}, {"a-bad"}),
    ],
)
def test_it_filters(events, admin_client, params, expected):
    assert shown(admin_client.get(URL, params)) == expected


def test_it_filters_by_date(events, admin_client):
    since = str(timezone.now() - timedelta(days=7))

    response = admin_client.get(URL, {"occurred_at__gte": since})

    assert shown(response) == {"a-ok", "a-bad", "a-limited"}


def test_no_page_counts_the_whole_table(events, admin_client):
    with CaptureQueriesContext(connection) as queries:
        admin_client.get(URL)
        admin_client.get(URL, {"tool": "recall"})

    counts = [q["sql"] for q in queries if "COUNT(" in q["sql"].upper()]
    assert counts
    assert all("LIMIT" in sql.upper() for sql in counts)


# CSV export -----------------------------------------------------------------------


def read_csv(response) -> list[dict[str, str]]:
    body = b"".join(response.streaming_content).decode()
    return list(csv.DictReader(io.StringIO(body)))


def test_the_export_streams_the_current_filter_as_csv(events, admin_client):
    response = admin_client.get(EXPORT, {"user_email": "alice@example.com"})

    assert response.status_code == 200
    assert response.streaming
    assert response["Content-Type"].startswith("text/csv")
    assert "attachment" in response["Content-Disposition"]
    rows = read_csv(response)
    assert {row["request_id"] for row in rows} == {"a-ok", "a-bad", "a-limited"}
    ok = next(row for row in rows if row["request_id"] == "a-ok")
    assert ok["user__email"] == "alice@example.com"
    assert ok["api_key__prefix"] == events.alice_key.key.prefix
    assert ok["tool_name"] == "remember"


def test_the_list_links_to_the_export_with_its_filters(events, admin_client):
    text = admin_client.get(URL, {"tool": "forget"}).content.decode()

    assert f'href="{EXPORT}?tool=forget"' in text


def test_the_export_has_every_page_whatever_page_it_was_started_from(events, admin_client):
    response = admin_client.get(EXPORT, {"p": "999", "tool": "remember"})

    assert [row["request_id"] for row in read_csv(response)] == ["a-ok"]


def test_the_export_reads_in_chunks_on_the_operator_path(cast, admin_client, monkeypatch):
    monkeypatch.setattr(billing_admin, "EXPORT_CHUNK", 3)
    for n in range(10):
        add_event(cast.alice, request_id=f"r{n}")

    response = admin_client.get(EXPORT)

    # The rows are read while the body streams, after the admin middleware's
    # operator transaction has ended; each chunk opens its own.
    assert tenancy.current() is None
    ids = [row["request_id"] for row in read_csv(response)]
    assert sorted(ids) == sorted(f"r{n}" for n in range(10))
    assert len(ids) == len(set(ids))


def test_the_export_defuses_spreadsheet_formulas(cast, admin_client):
    add_event(cast.alice, request_id="=HYPERLINK(1)", tool="@SUM(A1)")

    [row] = read_csv(admin_client.get(EXPORT))

    assert row["request_id"] == "'=HYPERLINK(1)"
    assert row["tool_name"] == "'@SUM(A1)"


def test_under_asgi_the_export_streams_chunk_by_chunk(events, admin_user, monkeypatch):
    monkeypatch.setattr(billing_admin, "EXPORT_CHUNK", 1)

    async def export():
        client = AsyncClient()
        await client.aforce_login(admin_user)
        response = await client.get(EXPORT)
        return response, [chunk async for chunk in response.streaming_content]

    response, chunks = async_to_sync(export)()

    assert response.is_async  # Django would read a sync iterator whole first
    assert len(chunks) == 1 + 4  # the header, then one chunk per row
    assert b"c-old" in b"".join(chunks)


def test_the_export_needs_staff(cast, client):
    client.force_login(cast.alice)

    response = client.get(EXPORT)

    assert response.status_code == 302
    assert "/admin/login/" in response["Location"]


# Counting without counting everything ------------------------------------------------


def test_the_paginator_counts_exactly_up_to_its_cap(events, monkeypatch):
    monkeypatch.setattr(EstimatedCountPaginator, "CAP", 2)
    with tenancy.operator():
        everything = UsageEvent.objects.order_by("-id")
        assert EstimatedCountPaginator(everything.filter(tool_name="remember"), 10).count == 1
        # More matches than the cap: the cap, and the pages past it are not offered.
        assert EstimatedCountPaginator(everything.filter(success=False), 10).count == 2


def test_the_paginator_estimates_a_whole_big_table(cast, monkeypatch):
    monkeypatch.setattr(EstimatedCountPaginator, "CAP", 50)
    with tenancy.operator(), connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO usage_events (user_id, request_id, tool_name, tokens_consumed,"
            " latency_ms, success, occurred_at)"
            " SELECT %s, 'bulk-' || g, 'recall', 1, 5, true, now() FROM generate_series(1, 400) g",
            [str(cast.alice.id)],
        )
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE usage_events")  # as the owner: the operator may not
    with tenancy.operator():
        count = EstimatedCountPaginator(UsageEvent.objects.order_by("-id"), 100).count

    assert 300 <= count <= 500


# At scale -------------------------------------------------------------------------------

ROWS = 1_000_000


def insert_typical_events(cast, rows: int) -> None:
    """Insert ``rows`` events: Alice has 1%; forget, errors and rate limiting are rare."""
    with tenancy.operator(), connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO usage_events (user_id, request_id, tool_name, tokens_consumed,
                                      latency_ms, success, error_code, occurred_at)
            SELECT CASE WHEN g %% 100 = 0 THEN %(alice)s::uuid ELSE %(charlie)s::uuid END,
                   'req-' || g,
                   CASE WHEN g %% 1000 = 0 THEN 'forget'
                        ELSE (ARRAY['remember', 'recall', 'list_memories'])[1 + g %% 3] END,
                   1, g %% 300, g %% 500 <> 0,
                   CASE WHEN g %% 1000 = 0 THEN 'validation_failed'
                        WHEN g %% 500 = 0 THEN 'rate_limited' END,
                   now() - g * interval '1 second'
            FROM generate_series(1, %(rows)s) g
            """,
            {"alice": str(cast.alice.id), "charlie": str(cast.charlie.id), "rows": rows},
        )
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE usage_events")  # as the owner: the operator may not


def page_plan(user, params: dict[str, str]) -> str:
    """Return the plan of the query behind the list's first page for ``params``."""
    request = RequestFactory().get(URL, params)
    request.user = user
    model_admin = billing_admin.UsageEventAdmin(UsageEvent, billing_admin.admin.site)
    with tenancy.operator():
        return model_admin.get_changelist_instance(request).queryset[:100].explain()


@pytest.mark.slow
def test_the_list_filters_and_export_stay_fast_on_a_million_events(cast, admin_client, admin_user):
    insert_typical_events(cast, ROWS)
    since = str(timezone.now() - timedelta(days=1))
    # Each filter, and the index its first page should be read through.
    pages = [
        ({}, "usage_events_time_idx"),
        ({"user_email": "alice@example.com"}, "usage_events_user_time_idx"),
        ({"tool": "forget"}, "usage_events_tool_time_idx"),
        ({"success__exact": "0"}, "usage_events_failed_time_idx"),
        ({"error": "validation_failed"}, "usage_events_error_time_idx"),
        ({"occurred_at__gte": since}, "usage_events_time_idx"),
        ({"q": "req-4242"}, "usage_events_request_idx"),
        ({"p": str(EstimatedCountPaginator.MAX_PAGES)}, None),
    ]
    admin_client.get(URL)  # warm up
    # What keeps a page fast is checked structurally (bounded counts, the index in its
    # plan), not by the clock: a wall-clock limit fails on a loaded machine and proves
    # nothing on a fast one.
    for params, index in pages:
        with CaptureQueriesContext(connection) as queries:
            response = admin_client.get(URL, params)
        assert response.status_code == 200, params
        assert "req-" in response.content.decode(), params
        for query in queries:
            sql = query["sql"].upper()
            if "COUNT(" in sql:
                assert "LIMIT" in sql, f"{params}: unbounded count: {query['sql']}"
        if index:
            assert index in page_plan(admin_user, params), params

    # Past the last page the admin redirects rather than scanning.
    too_deep = admin_client.get(URL, {"p": str(EstimatedCountPaginator.MAX_PAGES + 1)})
    assert too_deep.status_code == 302

    response = admin_client.get(EXPORT, {"tool": "forget"})
    rows = read_csv(response)
    assert len(rows) == ROWS // 1000
