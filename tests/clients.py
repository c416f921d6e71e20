"""Ways to talk to a live server in tests: the SDK's Python client, and raw HTTP."""

from __future__ import annotations

import json
from typing import Any

import anyio
import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp_types import CallToolResult

MODES = ["legacy", "2026-07-28"]  # protocol 2025-11-25 with initialize, and 2026-07-28


def transport(url: str, key: str | None, headers: dict[str, str] | None = None):
    all_headers = dict(headers or {})
    if key is not None:
        all_headers["Authorization"] = f"Bearer {key}"
    http = httpx2.AsyncClient(headers=all_headers, timeout=httpx2.Timeout(60, read=120))
    return streamable_http_client(url, http_client=http)


def session(url: str, key: str | None, mode: str = "legacy", **kwargs: Any) -> Client:
    return Client(transport(url, key, kwargs.pop("headers", None)), mode=mode, **kwargs)


def call(
    url: str, key: str, tool: str, arguments: dict[str, Any], mode: str = "legacy"
) -> CallToolResult:
    [result] = calls(url, key, [(tool, arguments)], mode)
    return result


def calls(
    url: str, key: str, requests: list[tuple[str, dict[str, Any]]], mode: str = "legacy"
) -> list[CallToolResult]:
    async def run() -> list[CallToolResult]:
        async with session(url, key, mode) as client:
            return [await client.call_tool(tool, arguments) for tool, arguments in requests]

    return anyio.run(run)


def list_tools(url: str, key: str, mode: str = "legacy") -> tuple[str, list[Any]]:
    async def run() -> tuple[str, list[Any]]:
        async with session(url, key, mode) as client:
            return client.protocol_version, (await client.list_tools()).tools

    return anyio.run(run)


def raw_call(
    url: str,
    key: str | None,
    tool: str,
    arguments: dict[str, Any],
    *,
    headers: dict[str, str] | None = None,
    call_id: int = 1,
) -> httpx2.Response:
    """POST one stateless 2025-11-25 tools/call, no handshake, and return the HTTP response."""
    all_headers = {
        "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": "2025-11-25",
        **(headers or {}),
    }
    if key is not None:
        all_headers["Authorization"] = f"Bearer {key}"
    body = {
        "jsonrpc": "2.0",
        "id": call_id,
        "method": "tools/call",
        "params": {"name": tool, "arguments": arguments},
    }
    return httpx2.post(url, headers=all_headers, content=json.dumps(body), timeout=60)


def structured(result: CallToolResult) -> dict[str, Any]:
    return result.structured_content or {}


def text(result: CallToolResult) -> str:
    return "".join(block.text for block in result.content if block.type == "text")
