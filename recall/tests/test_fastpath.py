"""Which requests the fast path takes, and which it leaves to the SDK (tests/test_fast_path.py
checks that what it answers is byte for byte the SDK's answer)."""

from __future__ import annotations

import json
from typing import Any

import anyio
import pytest
from mcp.server.transport_security import TransportSecuritySettings

from accounts import auth
from billing import usage
from memories.mcp import build_server
from recall.fastpath import FastPath

LEGACY = {
    "content-type": "application/json",
    "accept": "application/json",
    "mcp-protocol-version": "2025-11-25",
}
MODERN_META = {
    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
    "io.modelcontextprotocol/clientCapabilities": {},
}


def scope_for(headers: dict[str, str]) -> dict[str, Any]:
    return {
        "type": "http",
        "method": "POST",
        "path": "/mcp",
        "headers": [(k.encode(), v.encode()) for k, v in headers.items()],
        "query_string": b"",
        "scheme": "http",
        "server": ("127.0.0.1", 80),
        "client": ("127.0.0.1", 1234),
    }


def ask(message: dict[str, Any], headers: dict[str, str], caller: Any = None) -> tuple[bool, list]:
    """Run one request through a fast path on a fresh server; return (taken, what it sent)."""
    server = build_server()
    server.streamable_http_app(
        streamable_http_path="/mcp",
        stateless_http=True,
        json_response=True,
        transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
    )
    body = json.dumps(message).encode()
    sent: list[Any] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(event: Any) -> None:
        sent.append(event)

    async def run() -> bool:
        async with server.session_manager.run():
            token = auth.current.set(caller)
            try:
                fast = FastPath(server.session_manager)
                return await fast.answer(scope_for(headers), receive, body, message, send)
            finally:
                auth.current.reset(token)

    return anyio.run(run), sent


def request(method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
    message: dict[str, Any] = {"jsonrpc": "2.0", "id": 1, "method": method}
    if params is not None:
        message["params"] = params
    return message


@pytest.mark.parametrize("method", ["ping", "tools/list"])
def test_it_answers_ping_and_tools_list_of_both_generations(method):
    taken, sent = ask(request(method), LEGACY)
    modern = {**LEGACY, "mcp-protocol-version": "2026-07-28", "mcp-method": method}
    taken_modern, sent_modern = ask(request(method, {"_meta": MODERN_META}), modern)

    assert taken and taken_modern
    assert sent[0]["status"] == 200
    for events in (sent, sent_modern):
        assert json.loads(events[1]["body"])["id"] == 1


class Recorder:
    """Keeps usage events in a list, in place of the writer thread and its connection."""

    def __init__(self) -> None:
        self.events: list[usage.Event] = []

    def record(self, event: usage.Event) -> None:
        self.events.append(event)

    def touch_key(self, key_id: Any) -> None:
        pass


@pytest.mark.django_db(transaction=True)
def test_it_answers_a_tool_call_through_the_servers_middleware(cast, settings, monkeypatch):
    # The tool's worker thread then closes its connection as the call ends.
    settings.DATABASES["default"]["CONN_MAX_AGE"] = 0
    recorder = Recorder()
    monkeypatch.setattr(usage, "_recorder", recorder)
    caller = auth.AuthContext(user_id=cast.alice.id, api_key_id=cast.alice_key.key.id, tier="free")
    message = request("tools/call", {"name": "list_memories", "arguments": {}})

    taken, sent = ask(message, LEGACY, caller)

    assert taken
    result = json.loads(sent[1]["body"])["result"]
    assert result["structuredContent"] == {"memories": [], "count": 0, "offset": 0}
    # The same middleware as the SDK's path: one usage event for the call.
    assert [(e.tool_name, e.success) for e in recorder.events] == [("list_memories", True)]


@pytest.mark.parametrize(
    ("message", "headers"),
    [
        (request("initialize", {"protocolVersion": "2025-11-25"}), LEGACY),
        ({"jsonrpc": "2.0", "method": "notifications/initialized"}, LEGACY),
        (request("resources/list"), LEGACY),
        (request("tools/list"), {**LEGACY, "accept": "text/event-stream"}),
        (request("tools/list"), {**LEGACY, "content-type": "Application/JSON"}),
        (request("tools/list"), {**LEGACY, "mcp-protocol-version": "2099-01-01"}),
        # A modern request its inbound ladder refuses: no envelope.
        (request("tools/list"), {**LEGACY, "mcp-protocol-version": "2026-07-28"}),
    ],
    ids=[
        "initialize",
        "notification",
        "another method",
        "no JSON in Accept",
        "odd Content-Type",
        "unknown version",
        "modern without envelope",
    ],
)
def test_it_leaves_everything_else_to_the_sdk_having_sent_nothing(message, headers):
    taken, sent = ask(message, headers)

    assert not taken
    assert sent == []
