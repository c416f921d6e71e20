"""The HTTP front door of /mcp: routing, Host and Origin, auth, request ids, usage events."""

from __future__ import annotations

import httpx2
import pytest
from django.utils import timezone

from accounts.models import ApiKey
from core import tenancy
from tests.clients import call, calls, raw_call
from tests.conftest import usage_events
from tests.support import LiveServer

pytestmark = pytest.mark.slow


def test_health_answers_without_the_database(live):
    response = httpx2.get(f"{live.url}/health")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}


def test_ready_reports_the_database_and_the_model(live):
    response = httpx2.get(f"{live.url}/ready")
    assert response.status_code == 200
    assert response.json() == {
        "status": "ready",
        "checks": {"database": "ok", "embedder": "ok"},
        "usage_events": {"queued": 0, "held": 0, "dropped": 0},
    }


@pytest.mark.parametrize("path", ["/mcp", "/mcp/"])
def test_post_mcp_answers_directly_without_a_redirect(live, cast, path):
    response = raw_call(live.url + path, cast.alice_key.raw, "list_memories", {})
    assert response.status_code == 200
    assert response.json()["result"]["structuredContent"]["memories"] == []


def test_get_and_delete_are_refused_with_405(live, cast):
    headers = {"Authorization": f"Bearer {cast.alice_key.raw}"}
    for method in ("GET", "DELETE"):
        response = httpx2.request(method, live.mcp_url, headers=headers)
        assert response.status_code == 405
        assert response.headers["allow"] == "POST"


@pytest.mark.parametrize(
    "authorization",
    [
        None,
        "",
        "Bearer",
        "Basic dXNlcjpwYXNz",
        "Bearer recall_live_short",
        "Bearer recall_live_" + "A" * 32,  # well formed, unknown
    ],
)
def test_it_refuses_missing_malformed_and_unknown_keys(live, authorization):
    headers = {"Content-Type": "application/json"}
    if authorization is not None:
        headers["Authorization"] = authorization
    response = httpx2.post(live.mcp_url, headers=headers, content=b"{}")

    assert response.status_code == 401
    assert response.headers["www-authenticate"].startswith('Bearer realm="recall"')
    body = response.json()
    assert body["error"]["data"]["error"]["code"] == "unauthorized"
    # The same words whether or not a key exists.
    assert body["error"]["message"] == (
        "Missing or invalid API key. Send Authorization: Bearer recall_live_..."
    )


def test_it_refuses_a_revoked_key(live, cast):
    with tenancy.operator():
        ApiKey.objects.filter(id=cast.bob_key.key.id).update(revoked_at=timezone.now())

    assert raw_call(live.mcp_url, cast.bob_key.raw, "list_memories", {}).status_code == 401
    assert raw_call(live.mcp_url, cast.alice_key.raw, "list_memories", {}).status_code == 200


def test_the_request_id_is_echoed_and_recorded(live, cast):
    response = raw_call(
        live.mcp_url,
        cast.alice_key.raw,
        "list_memories",
        {},
        headers={"X-Request-ID": "trace-42.a"},
    )
    generated = raw_call(live.mcp_url, cast.alice_key.raw, "list_memories", {})
    injected = raw_call(
        live.mcp_url,
        cast.alice_key.raw,
        "list_memories",
        {},
        headers={"X-Request-ID": 'evil" id with spaces'},
    )

    assert response.headers["x-request-id"] == "trace-42.a"
    assert len(generated.headers["x-request-id"]) == 32
    assert injected.headers["x-request-id"] != 'evil" id with spaces'
    events = usage_events(3)
    assert [e.request_id for e in events] == [
        "trace-42.a",
        generated.headers["x-request-id"],
        injected.headers["x-request-id"],
    ]


def test_every_tool_call_leaves_exactly_one_usage_event(live, cast):
    results = calls(
        live.mcp_url,
        cast.alice_key.raw,
        [
            ("remember", {"content": "one"}),
            ("remember", {"content": "one"}),  # deduplicated: still a call
            ("recall", {"query": "one"}),
            ("recall", {"query": "x", "limit": 99}),  # validation error: still a call
            ("list_memories", {}),
            ("update_memory", {"id": "00000000-0000-4000-8000-000000000000", "metadata": {}}),
            ("forget", {"mode": "by_query", "query": "one"}),
        ],
    )
    call(live.mcp_url, cast.bob_key.raw, "list_memories", {})

    events = usage_events(8)
    assert len(events) == 8
    assert [e.tool_name for e in events] == [
        "remember",
        "remember",
        "recall",
        "recall",
        "list_memories",
        "update_memory",
        "forget",
        "list_memories",
    ]
    assert [e.error_code for e in events] == [
        None,
        None,
        None,
        "validation_failed",
        None,
        "not_found",
        None,
        None,
    ]
    assert [e.success for e in events] == [r.is_error is False for r in results] + [True]
    assert {e.user_id for e in events} == {cast.alice.id}
    assert [e.api_key_id for e in events] == [cast.alice_key.key.id] * 7 + [cast.bob_key.key.id]
    assert all(e.tokens_consumed == 1 and e.latency_ms >= 0 for e in events)
    # Events are the user's own rows: row-level security applies to them.
    with tenancy.tenant(cast.charlie.id):
        from billing.models import UsageEvent

        assert UsageEvent.objects.count() == 0


def test_a_call_of_a_tool_its_endpoint_lacks_is_recorded_as_unknown(live, cast):
    # Each made-up name was recorded as sent: one more line in the user's
    # usage legend and the admin's tool filter for every name a client chose.
    key = cast.alice_key.raw
    calls(
        live.mcp_url,
        key,
        [("no_such_tool", {}), ("x" * 500, {}), ("add_memory", {}), ("memory_stats", {})],
    )
    call(live.url + "/v1/mcp", key, "add_memory", {"content": "one"})

    events = usage_events(5)
    assert [(e.tool_name, e.error_code) for e in events] == [
        ("unknown", "validation_failed"),
        ("unknown", "validation_failed"),
        ("unknown", "validation_failed"),  # seed 001's, not /mcp's
        ("memory_stats", None),
        ("add_memory", None),
    ]


def test_listing_tools_is_not_a_tool_call(live, cast):
    from tests.clients import list_tools

    list_tools(live.mcp_url, cast.alice_key.raw)
    call(live.mcp_url, cast.alice_key.raw, "list_memories", {})
    assert len(usage_events(1)) == 1


@pytest.mark.django_db(transaction=True)
def test_host_and_origin_follow_allowed_hosts(cast):
    env = {"ALLOWED_HOSTS": "recall.example.com,.tenant.example.org,127.0.0.1"}
    with LiveServer(env=env) as server:

        def post(host: str, origin: str | None = None, proto: str | None = None) -> int:
            headers = {"Host": host}
            if origin:
                headers["Origin"] = origin
            if proto:  # as a TLS-terminating proxy on 127.0.0.1 says
                headers["X-Forwarded-Proto"] = proto
            return raw_call(
                server.mcp_url, cast.alice_key.raw, "list_memories", {}, headers=headers
            ).status_code

        assert post("recall.example.com") == 200
        assert post("recall.example.com:8443") == 200
        assert post("eu.tenant.example.org") == 200
        assert post("evil.example.net") == 421
        assert post("recall.example.com", origin="http://recall.example.com") == 200
        assert post("recall.example.com", "https://recall.example.com", proto="https") == 200
        assert post("recall.example.com:8443", origin="http://recall.example.com:8443") == 200
        assert post("recall.example.com", origin="https://evil.example.net") == 403
        # Same origin means same scheme, host and port.
        assert post("recall.example.com", origin="https://recall.example.com") == 403
        assert post("recall.example.com", origin="http://recall.example.com:1") == 403
        assert post("recall.example.com:8443", origin="http://recall.example.com") == 403
        assert post("recall.example.com", origin="http://eu.tenant.example.org") == 403
        assert post("recall.example.com", origin="null") == 403


def test_an_origin_on_another_scheme_or_port_of_this_host_is_refused(live, cast):
    port = live.url.rsplit(":", 1)[1]
    for origin in (f"https://127.0.0.1:{port}", "http://127.0.0.1:1", "https://localhost:1"):
        response = raw_call(
            live.mcp_url, cast.alice_key.raw, "list_memories", {}, headers={"Origin": origin}
        )
        assert response.status_code == 403, origin
        assert response.json()["error"]["data"]["error"]["code"] == "validation_failed"
    same = raw_call(
        live.mcp_url, cast.alice_key.raw, "list_memories", {}, headers={"Origin": live.url}
    )
    assert same.status_code == 200


@pytest.mark.django_db(transaction=True)
def test_last_used_at_is_flushed_when_the_server_stops(cast):
    with LiveServer() as server:
        call(server.mcp_url, cast.alice_key.raw, "list_memories", {})
        before = timezone.now()
    with tenancy.operator():
        key = ApiKey.objects.get(id=cast.alice_key.key.id)
        untouched = ApiKey.objects.get(id=cast.bob_key.key.id)
    assert key.last_used_at is not None and key.last_used_at <= before
    assert untouched.last_used_at is None


def test_an_oversized_body_is_refused(live, cast):
    response = raw_call(live.mcp_url, cast.alice_key.raw, "remember", {"content": "x" * 1_100_000})
    assert response.status_code == 413
    assert response.json()["error"]["data"]["error"]["code"] == "validation_failed"


def test_a_declared_length_over_the_cap_is_refused_before_a_byte_is_read(live, cast):
    """review135: /mcp read on, waiting for bytes that never came, and answered 408 at
    the request deadline (30 s); Django's pages refused such a request at once."""
    import socket
    from urllib.parse import urlsplit

    url = urlsplit(live.mcp_url)
    with socket.create_connection((url.hostname, url.port), timeout=10) as sock:
        sock.sendall(
            f"POST {url.path} HTTP/1.1\r\nHost: {url.netloc}\r\n"
            f"Authorization: Bearer {cast.alice_key.raw}\r\n"
            "Content-Type: application/json\r\nAccept: application/json\r\n"
            "Content-Length: 2000000\r\n\r\n"
            '{"jsonrpc":"2.0","id":1,"method":"ping"}'.encode()
        )
        answer = b""
        while b"\r\n\r\n" not in answer:
            part = sock.recv(65536)  # times out (10 s) rather than waiting for 30
            if not part:
                break
            answer += part
    assert answer.startswith(b"HTTP/1.1 413"), answer[:80]


@pytest.mark.parametrize(
    ("name", "first", "second"),
    [
        ("Authorization", None, "Bearer recall_live_" + "A" * 32),
        ("Origin", "http://127.0.0.1", "http://evil.example"),
        ("MCP-Protocol-Version", "2025-11-25", "2025-06-18"),
    ],
)
def test_a_header_that_may_come_once_and_comes_twice_is_refused(live, cast, name, first, second):
    """review135: the first copy was read and the second ignored; a proxy that reads
    the last would decide otherwise."""
    first = first or f"Bearer {cast.alice_key.raw}"
    headers = [
        ("Content-Type", "application/json"),
        ("Accept", "application/json"),
        ("Authorization", f"Bearer {cast.alice_key.raw}"),
        ("MCP-Protocol-Version", "2025-11-25"),
    ]
    headers = [(k, v) for k, v in headers if k != name] + [(name, first), (name, second)]
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call"}
    body["params"] = {"name": "list_memories", "arguments": {}}
    response = httpx2.post(live.mcp_url, headers=headers, json=body)

    assert response.status_code == 400
    error = response.json()["error"]["data"]["error"]
    assert error == {
        "code": "validation_failed",
        "message": f"The {name.title()} header may be sent once.",
    }


def _raw_request(live, target: str, host: str, body: bytes = b"", key: str = "") -> bytes:
    """Send one request with ``target`` as written on the request line; return the answer."""
    import socket
    from urllib.parse import urlsplit

    url = urlsplit(live.url)
    head = f"POST {target} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n"
    if body:
        head += f"Authorization: Bearer {key}\r\nContent-Type: application/json\r\n"
        head += f"Accept: application/json\r\nContent-Length: {len(body)}\r\n"
    with socket.create_connection((url.hostname, url.port), timeout=10) as sock:
        sock.sendall(head.encode() + b"\r\n" + body)
        answer = b""
        while part := sock.recv(65536):
            answer += part
    return answer


def test_a_target_in_absolute_form_reaches_its_route(live, cast):
    """review135: ``POST http://host/mcp HTTP/1.1`` (a client behind a forward proxy)
    reached Django as the path ``http://host/mcp`` and got a 404; HTTP/1.1 servers
    must accept the absolute form (RFC 9112, 3.2.2)."""
    netloc = live.url.split("//", 1)[1]
    body = b'{"jsonrpc":"2.0","id":1,"method":"tools/call",'
    body += b'"params":{"name":"list_memories","arguments":{}}}'
    answer = _raw_request(live, f"http://{netloc}/mcp", "ignored.example", body, cast.alice_key.raw)
    assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
    assert b'"memories"' in answer

    # The target's authority is the host the checks read, not the Host header.
    foreign = _raw_request(live, "http://evil.example.net/mcp", netloc, body, cast.alice_key.raw)
    assert foreign.startswith(b"HTTP/1.1 421"), foreign[:200]

    # Credentials in the target are refused in our words.
    with_user = _raw_request(live, f"http://user:pw@{netloc}/mcp", netloc, body, "k")
    assert with_user.startswith(b"HTTP/1.1 400"), with_user[:200]
    assert b'"validation_failed"' in with_user
    assert b"pw" not in with_user.split(b"\r\n\r\n", 1)[1]
