from __future__ import annotations

import re

import pytest

from dashboard.tests.conftest import days_ago, record
from tests.support import store_memory

URL = "/usage/"


def segments(response) -> dict[tuple[str, str], int]:
    found = re.findall(
        r'data-tool="([^"]+)" data-day="([\d-]+)" data-count="(\d+)"', response.content.decode()
    )
    return {(tool, day): int(count) for tool, day, count in found}


def stat(response, name: str) -> str:
    match = re.search(rf'data-stat="{name}">([^<]*)<', response.content.decode())
    assert match is not None, f"no {name} figure on the page"
    return match[1].strip()


def test_signed_out_visitors_are_sent_to_sign_in(client):
    response = client.get(URL)

    assert response.status_code == 302
    assert response["Location"].startswith("/login/")


def test_it_charts_calls_per_day_per_tool(cast, alice_client):
    record(cast.alice, "recall")
    record(cast.alice, "recall")
    record(cast.alice, "remember", when=days_ago(2))

    response = alice_client.get(URL)

    today = days_ago(0).date().isoformat()
    two_days_ago = days_ago(2).date().isoformat()
    assert segments(response) == {("recall", today): 2, ("remember", two_days_ago): 1}
    assert stat(response, "calls") == "3"


def test_it_shows_error_rate_latency_rate_limiting_and_quota(cast, alice_client, settings):
    settings.FREE_TIER_MAX_MEMORIES = 10
    for latency in range(10, 110, 10):  # 10, 20, ... 100 ms
        record(cast.alice, "recall", latency_ms=latency)
    record(cast.alice, "remember", error_code="validation_failed", latency_ms=5)
    record(cast.alice, "remember", error_code="rate_limited", latency_ms=0)
    record(cast.alice, "remember", error_code="rate_limited", latency_ms=0)
    # Cancelled while it ran: no failure of ours, and its time was cut short.
    record(cast.alice, "remember", error_code="cancelled", latency_ms=100_000)
    for n in range(4):
        store_memory(cast.alice, f"memory {n}")

    response = alice_client.get(URL)

    assert stat(response, "calls") == "14"
    assert stat(response, "error-rate") == "8.3%"  # 1 of the 12 that ran
    # Each figure says what it counts: the refused calls are among the calls,
    # not among those the error rate is of.
    assert stat(response, "failed") == "1 failed of 12 run"
    assert "refused ones included" in response.content.decode()
    assert stat(response, "rate-limited") == "2"
    assert stat(response, "p50") == "50 ms"  # of 5, 10 ... 100; rate-limited left out
    assert stat(response, "p95") == "95 ms"  # halfway between 90 and 100
    assert re.search(r'data-stat="memories">4<span[^>]*> / 10<', response.content.decode())


def test_paid_tiers_show_unlimited_memories(cast, alice_client):
    type(cast.alice).objects.filter(id=cast.alice.id).update(tier="pro")

    response = alice_client.get(URL)

    assert "unlimited on Pro" in response.content.decode()


def test_old_calls_fall_outside_the_window(cast, alice_client):
    record(cast.alice, "recall", when=days_ago(10))

    assert stat(alice_client.get(URL, {"days": 7}), "calls") == "0"
    assert stat(alice_client.get(URL, {"days": 30}), "calls") == "1"


@pytest.mark.parametrize("days", ["abc", "-1", "1000"])
def test_a_strange_window_falls_back_to_30_days(cast, alice_client, days):
    assert "last 30 days" in alice_client.get(URL, {"days": days}).content.decode()


def test_charlie_never_sees_alices_usage(cast, alice_client, charlie_client):
    record(cast.alice, "recall")
    record(cast.alice, "forget")
    store_memory(cast.alice, "alice's memory")

    response = charlie_client.get(URL)

    assert segments(response) == {}
    assert stat(response, "calls") == "0"
    assert stat(response, "memories").startswith("0")


def test_with_no_calls_it_explains_how_to_connect_a_client(cast, alice_client, settings):
    settings.ALLOWED_HOSTS = ["recall.example.com"]
    response = alice_client.get(URL, HTTP_HOST="recall.example.com", secure=True)

    text = response.content.decode()
    assert "No calls yet" in text
    assert "https://recall.example.com/mcp" in text
    assert "mcpServers" in text
    assert "Claude Desktop" in text and "Cursor" in text


def by_agent(response) -> dict[str, int]:
    found = re.findall(
        r'data-agent-usage="([^"]+)">\s*<td[^>]*>(.*?)</td>\s*<td[^>]*data-calls>(\d+)<',
        response.content.decode(),
        re.S,
    )
    return {re.sub(r"<[^>]+>", "", name).split()[0]: int(calls) for _, name, calls in found}


def test_it_breaks_calls_down_by_agent(cast, agents, alice_client):
    record(cast.alice, "memory_search", agent=agents.research)
    record(cast.alice, "memory_add", agent=agents.research)
    record(cast.alice, "recall", agent=agents.writer)
    record(cast.alice, "recall")  # a user-wide key
    record(cast.charlie, "recall", agent=agents.helper)

    response = alice_client.get(URL)

    # Alice's agents by name, idle ones included, then calls with no agent;
    # Charlie's agent is nowhere.
    assert by_agent(response) == {"research": 2, "writer": 1, "No": 1}
    assert "helper" not in response.content.decode()
    assert stat(response, "calls") == "4"


def test_without_agents_there_is_no_breakdown(cast, alice_client):
    record(cast.alice, "recall")

    response = alice_client.get(URL)

    assert "data-agent-usage" not in response.content.decode()
