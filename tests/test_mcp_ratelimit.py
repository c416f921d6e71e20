"""Tier rate limits on the real server: 429 with Retry-After, before any tool runs."""

from __future__ import annotations

import concurrent.futures
import json
import math

import httpx2
import pytest

from core import tenancy
from memories.models import Memory
from tests.clients import raw_call
from tests.conftest import usage_events
from tests.fuzz import GENERATIONS, LEGACY, MODERN, envelope, headers
from tests.support import LiveServer

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def remember(server: LiveServer, key: str, n: int):
    return raw_call(server.mcp_url, key, "remember", {"content": f"memory {n}"}, call_id=n)


def test_the_free_tier_gets_ten_calls_a_minute_then_429(cast):
    with LiveServer() as server:  # the real limits: free is 10/min
        answers = [remember(server, cast.alice_key.raw, n) for n in range(11)]

    assert [a.status_code for a in answers] == [200] * 10 + [429]
    refused = answers[-1]
    retry_after = int(refused.headers["retry-after"])
    assert 1 <= retry_after <= 6  # one token comes back every 6 s
    assert refused.headers["ratelimit-limit"] == "10"
    assert refused.headers["ratelimit-remaining"] == "0"
    body = refused.json()
    assert body["id"] == 10
    assert body["error"]["data"]["error"]["code"] == "rate_limited"
    # The refused call never reached the tool: nine memories... ten, not eleven.
    with tenancy.operator():
        assert Memory.objects.count() == 10
    events = usage_events(11)
    assert len(events) == 11
    last = events[-1]
    assert (last.tool_name, last.success, last.error_code, last.tokens_consumed) == (
        "remember",
        False,
        "rate_limited",
        0,
    )
    assert last.request_id == refused.headers["x-request-id"]
    assert all(e.tokens_consumed == 1 for e in events[:10])


def test_a_refused_call_of_a_tool_the_endpoint_lacks_is_recorded_as_unknown(cast):
    key = cast.alice_key.raw
    with LiveServer() as server:
        for n in range(10):
            assert remember(server, key, n).status_code == 200
        refused = raw_call(server.mcp_url, key, "made_up_" + "z" * 80, {}, call_id=10)

    assert refused.status_code == 429
    last = usage_events(11)[-1]
    assert (last.tool_name, last.error_code) == ("unknown", "rate_limited")


def test_limits_are_per_key_and_follow_the_tier(cast):
    from conftest import issue_key

    pro = issue_key(cast.charlie, "pro key", tier="pro")
    with LiveServer(env={"RATE_LIMIT_FREE": "2/min", "RATE_LIMIT_PRO": "5/min"}) as server:
        alice = [remember(server, cast.alice_key.raw, n).status_code for n in range(3)]
        bob = [remember(server, cast.bob_key.raw, n + 10).status_code for n in range(3)]
        charlie = [remember(server, pro.raw, n).status_code for n in range(6)]

    assert alice == [200, 200, 429]
    assert bob == [200, 200, 429]  # Bob's key has its own bucket
    assert charlie == [200] * 5 + [429]


def test_protocol_chatter_does_not_spend_tokens(cast):
    import httpx2

    headers = {
        "Authorization": f"Bearer {cast.alice_key.raw}",
        "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": "2025-11-25",
    }
    with LiveServer(env={"RATE_LIMIT_FREE": "1/min"}) as server:
        for n in range(5):
            listed = httpx2.post(
                server.mcp_url,
                headers=headers,
                json={"jsonrpc": "2.0", "id": n, "method": "tools/list"},
            )
            assert listed.status_code == 200
        assert remember(server, cast.alice_key.raw, 1).status_code == 200
        assert remember(server, cast.alice_key.raw, 2).status_code == 429


def test_two_servers_sharing_redis_admit_no_more_than_capacity(cast, redis):
    env = {"REDIS_URL": redis.url, "RATE_LIMIT_FREE": "8/min"}
    with (
        LiveServer(env=env) as first,
        LiveServer(env=env) as second,
        concurrent.futures.ThreadPoolExecutor(8) as pool,
    ):
        answers = list(
            pool.map(
                lambda n: remember(first if n % 2 else second, cast.alice_key.raw, n).status_code,
                range(20),
            )
        )
    assert answers.count(200) == 8
    assert answers.count(429) == 12


def test_with_redis_down_servers_fail_open_to_their_own_limiter(cast, redis):
    env = {"REDIS_URL": redis.url, "RATE_LIMIT_FREE": "3/min"}
    with LiveServer(env=env) as first, LiveServer(env=env) as second:
        assert remember(first, cast.alice_key.raw, 0).status_code == 200
        redis.stop()  # killed mid-test
        # Each process now enforces the limit on its own: requests are still
        # answered, and each server admits at most its own allowance.
        first_answers = [remember(first, cast.alice_key.raw, n).status_code for n in range(1, 6)]
        second_answers = [remember(second, cast.alice_key.raw, n).status_code for n in range(6, 11)]
        logs = first.logs()

    assert first_answers == [200, 200, 200, 429, 429] or first_answers == [200, 200, 429, 429, 429]
    assert second_answers == [200, 200, 200, 429, 429]
    # One warning for the outage, not one per request.
    assert logs.count("Shared rate limiter unavailable") == 1


def test_retry_after_is_whole_seconds_rounded_up(cast):
    with LiveServer(env={"RATE_LIMIT_FREE": "1/hour"}) as server:
        assert remember(server, cast.alice_key.raw, 0).status_code == 200
        refused = remember(server, cast.alice_key.raw, 1)
    seconds = int(refused.headers["retry-after"])
    assert seconds == math.ceil(seconds)
    assert 3590 <= seconds <= 3600


@pytest.mark.parametrize("fast_path", ["true", "false"], ids=["fast path", "sdk path"])
def test_a_tool_call_sent_as_a_notification_spends_no_token_and_runs_nothing(cast, fast_path):
    # Ten of these once used up a free key's minute, each metered as a
    # successful call and logged as one, while no tool ran.
    key = cast.alice_key.raw
    with LiveServer(env={"RATE_LIMIT_FREE": "2/min", "MCP_FAST_PATH": fast_path}) as server:
        for generation in GENERATIONS:
            for n in range(3):
                params = {"name": "remember", "arguments": {"content": f"notified {n}"}}
                body = envelope("tools/call", params, generation)
                del body["id"]
                sent = headers(key, generation, body)
                notified = httpx2.post(server.mcp_url, headers=sent, json=body, timeout=30)
                assert notified.status_code == 202, generation
        answers = [remember(server, key, n).status_code for n in range(3)]
    logs = server.logs()

    assert answers == [200, 200, 429]
    with tenancy.operator():
        assert sorted(Memory.objects.values_list("content", flat=True)) == ["memory 0", "memory 1"]
    events = usage_events(3)
    assert [(e.tool_name, e.success) for e in events] == [
        ("remember", True),
        ("remember", True),
        ("remember", False),
    ]
    lines = [json.loads(line) for line in logs.splitlines() if line.startswith("{")]
    assert [line["event"] for line in lines if line["event"].startswith("tool call")] == [
        "tool call started",
        "tool call finished",
    ] * 2


@pytest.mark.parametrize("fast_path", ["true", "false"], ids=["fast path", "sdk path"])
def test_a_call_the_protocol_layer_refuses_still_leaves_exactly_one_usage_event(cast, fast_path):
    # The gate takes the token, then the SDK refuses the call before the
    # middleware that meters it: a token spent, and no event, for these.
    key = cast.alice_key.raw
    legacy = envelope("tools/call", {"name": "memory_stats", "_meta": "x"}, LEGACY, "legacy")
    modern = {  # a 2026-era call without its _meta envelope
        "jsonrpc": "2.0",
        "id": "modern",
        "method": "tools/call",
        "params": {"name": "memory_stats", "arguments": {}},
    }
    with LiveServer(env={"MCP_FAST_PATH": fast_path}) as server:
        for body, generation in ((legacy, LEGACY), (modern, MODERN)):
            sent = {**headers(key, generation, body), "X-Request-Id": f"refused-{body['id']}"}
            answer = httpx2.post(server.mcp_url, headers=sent, json=body, timeout=30)
            assert "error" in answer.json(), answer.text

    events = usage_events(2)
    assert sorted((e.request_id, e.tool_name, e.success, e.error_code) for e in events) == [
        ("refused-legacy", "memory_stats", False, "validation_failed"),
        ("refused-modern", "memory_stats", False, "validation_failed"),
    ]


@pytest.mark.parametrize("backend", ["in process", "workers", "redis"])
def test_revoking_and_creating_keys_buys_no_calls_beyond_max_keys_allowances(
    cast, settings, request, backend
):
    from accounts import services

    settings.MAX_KEYS_PER_USER = 2  # the dashboard's cap, checked in this process
    env = {"RATE_LIMIT_FREE": "2/hour", "MAX_KEYS_PER_USER": "2"}
    if backend == "redis":
        env["REDIS_URL"] = request.getfixturevalue("redis").url
    workers = 2 if backend == "workers" else None
    with LiveServer(env=env, workers=workers) as server:
        # The normal case: each of Alice's two live keys has its own burst.
        alice = [remember(server, cast.alice_key.raw, n).status_code for n in range(3)]
        bob = [remember(server, cast.bob_key.raw, n + 10).status_code for n in range(3)]
        # Then she revokes a key and makes another, as the dashboard lets her for free.
        key_id, rotated = cast.bob_key.key.id, []
        for n in range(3):
            services.revoke_own_key(user_id=cast.alice.id, key_id=key_id)
            key, raw = services.issue_own_key(user_id=cast.alice.id, max_tier="free", name=f"{n}")
            key_id = key.id
            rotated.append(remember(server, raw, n + 20))

    assert alice == [200, 200, 429]
    assert bob == [200, 200, 429]
    # MAX_KEYS_PER_USER x 2 calls is all her keys get, whichever keys they are.
    assert [answer.status_code for answer in rotated] == [429] * 3
    # Her keys' ceiling refills 4 calls an hour: one every 900 s.
    assert 890 <= int(rotated[-1].headers["retry-after"]) <= 900
    assert rotated[-1].headers["ratelimit-limit"] == "4"


def _post_call(
    server: LiveServer, path: str, key: str, generation: str, sent: dict[str, str | None]
) -> httpx2.Response:
    """POST a memory_stats call with the generation's headers, ``sent`` over them (None: left
    out, httpx2's own Accept too)."""
    body = envelope("tools/call", {"name": "memory_stats", "arguments": {}}, generation)
    wanted = {**headers(key, generation, body), **sent}
    with httpx2.Client(timeout=30) as client:
        del client.headers["accept"]  # httpx2's own */*: the test says what is sent
        kept = {name: value for name, value in wanted.items() if value is not None}
        return client.post(server.url + path, headers=kept, content=json.dumps(body))


# What the SDK refused with 406 after the gate had taken a token and the call
# was metered as validation_failed (README, "Usage": such a request is no call).
UNACCEPTABLE = [None, "text/html", "text/event-stream", "TEXT/HTML;q=1"]


@pytest.mark.parametrize("fast_path", ["true", "false"], ids=["fast path", "sdk path"])
def test_a_request_refused_for_its_media_types_takes_no_token_and_leaves_no_event(cast, fast_path):
    key = cast.alice_key.raw
    with LiveServer(env={"RATE_LIMIT_FREE": "1/min", "MCP_FAST_PATH": fast_path}) as server:
        for path in ("/mcp", "/v1/mcp"):
            for generation in GENERATIONS:
                for accept in UNACCEPTABLE:
                    refused = _post_call(server, path, key, generation, {"Accept": accept})
                    assert refused.status_code == 406, (path, generation, accept, refused.text)
                    assert refused.json()["error"]["message"] == (
                        "Not acceptable: send Accept: application/json, text/event-stream."
                    )
                typed = {"Content-Type": "text/plain"}
                unsupported = _post_call(server, path, key, generation, typed)
                assert unsupported.status_code == 415, (path, generation)
        # The one call the minute allows is still there, then no more.
        answers = [_post_call(server, "/mcp", key, LEGACY, {}) for _ in range(2)]

    assert [answer.status_code for answer in answers] == [200, 429]
    events = usage_events(2)
    assert [(e.tool_name, e.success, e.error_code) for e in events] == [
        ("memory_stats", True, None),
        ("memory_stats", False, "rate_limited"),
    ]


@pytest.mark.parametrize("fast_path", ["true", "false"], ids=["fast path", "sdk path"])
def test_a_json_media_type_in_capitals_is_served_on_both_generations(cast, fast_path):
    # Media types are case-insensitive (RFC 9110 8.3.1). The gate and the
    # 2026-era transport took these; the 2025-era one refused them with 415,
    # after the gate had taken a token and metered the call.
    key = cast.alice_key.raw
    spellings = ["APPLICATION/JSON", "Application/Json; charset=UTF-8"]
    with LiveServer(env={"RATE_LIMIT_FREE": "4/min", "MCP_FAST_PATH": fast_path}) as server:
        answers = [
            (generation, _post_call(server, "/mcp", key, generation, {"Content-Type": typed}))
            for generation in GENERATIONS
            for typed in spellings
        ]
        limited = _post_call(server, "/mcp", key, LEGACY, {})

    for generation, answer in answers:
        assert answer.status_code == 200, (generation, answer.text)
        assert "error" not in answer.json(), (generation, answer.text)
        assert answer.json()["result"]["isError"] is False, (generation, answer.text)
    assert limited.status_code == 429
    events = usage_events(5)
    assert [(e.success, e.error_code) for e in events] == [(True, None)] * 4 + [
        (False, "rate_limited")
    ]
