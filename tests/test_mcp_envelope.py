"""What /mcp answers to bodies that are not one well-formed JSON-RPC message.

Every refusal is a JSON-RPC error body in our words, never a 500, a plain-text
page or a library's validation dump.
"""

from __future__ import annotations

import json

import httpx2
import pytest

from core import tenancy
from memories.models import Memory
from tests.conftest import usage_events

pytestmark = pytest.mark.slow

HEADERS = {
    "Content-Type": "application/json",
    "Accept": "application/json, text/event-stream",
    "MCP-Protocol-Version": "2025-11-25",
}
LIBRARY_TEXT = ("pydantic", "input_value", "For further information", "validation error")


def post(live, key: str, body: bytes, **headers: str) -> httpx2.Response:
    return httpx2.post(
        live.mcp_url,
        headers={**HEADERS, "Authorization": f"Bearer {key}", **headers},
        content=body,
        timeout=30,
    )


def refusal(response: httpx2.Response) -> dict:
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    assert body["jsonrpc"] == "2.0"
    error = body["error"]
    assert isinstance(error["code"], int)
    assert not any(mark in error["message"] for mark in LIBRARY_TEXT), error["message"]
    return error


def remember_body(content: str) -> dict:
    return {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": "remember", "arguments": {"content": content}},
    }


@pytest.mark.parametrize("depth", [978, 979, 5000])
def test_a_deeply_nested_body_gets_a_parse_error_not_a_500(live, cast, depth):
    response = post(live, cast.alice_key.raw, b"[" * depth + b"]" * depth)

    assert response.status_code == 400
    assert refusal(response)["code"] == -32700


def test_deeply_nested_arguments_get_a_parse_error_and_store_nothing(live, cast):
    metadata = "{" + '"a":{' * 500 + '"b":1' + "}" * 501
    body = json.dumps(remember_body("nested")).replace('"nested"}', '"nested", "metadata": X}')
    response = post(live, cast.alice_key.raw, body.replace("X", metadata).encode())

    assert response.status_code == 400
    assert refusal(response)["code"] == -32700
    with tenancy.operator():
        assert not Memory.objects.exists()


@pytest.mark.parametrize(
    "body",
    [
        [{"jsonrpc": "2.0", "id": 1, "method": "tools/list"}],
        {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": [1, 2]},
        {"jsonrpc": "2.0", "id": 1},
        {"jsonrpc": "1.0", "id": 1, "method": "tools/list"},
        {"jsonrpc": "2.0", "id": [1], "method": "tools/list"},
        {"jsonrpc": "2.0", "id": True, "method": "tools/list"},
        {"jsonrpc": "2.0", "id": 1, "method": 7},
        "tools/list",
        None,
    ],
    ids=[
        "batch",
        "params list",
        "no method",
        "jsonrpc 1.0",
        "id list",
        "id bool",
        "method int",
        "string",
        "null",
    ],
)
def test_a_malformed_envelope_gets_a_short_json_rpc_error_of_our_own(live, cast, body):
    response = post(live, cast.alice_key.raw, json.dumps(body).encode())

    assert response.status_code == 400
    error = refusal(response)
    assert error["code"] in (-32600, -32602)
    assert error["data"]["error"]["code"] == "validation_failed"
    assert len(error["message"]) < 120


def test_a_batch_of_tool_calls_runs_none_of_them(live, cast):
    response = post(live, cast.alice_key.raw, json.dumps([remember_body("batched")]).encode())

    assert response.status_code == 400
    with tenancy.operator():
        assert not Memory.objects.exists()
    assert usage_events(timeout=0.5) == []


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", ""])
def test_a_wrong_content_type_gets_a_json_rpc_refusal(live, cast, content_type):
    body = json.dumps(remember_body("typed")).encode()
    response = post(live, cast.alice_key.raw, body, **{"Content-Type": content_type})

    assert response.status_code == 415
    assert refusal(response)["data"]["error"]["code"] == "validation_failed"


def test_a_refused_accept_header_gets_a_json_rpc_refusal(live, cast):
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}).encode()
    response = post(live, cast.alice_key.raw, body, Accept="text/html")

    assert response.status_code == 406
    assert refusal(response)["data"]["error"]["code"] == "validation_failed"


def test_a_string_python_parses_but_the_sdk_does_not_gets_our_parse_error(live, cast):
    # A lone surrogate escape: valid to Python's json module, not to pydantic-core's.
    body = json.dumps(remember_body("x")).replace('"x"', '"a\\ud800b"').encode()
    response = post(live, cast.alice_key.raw, body)

    assert response.status_code == 400
    error = refusal(response)
    assert error["code"] == -32700
    assert "line 1 column" not in error["message"]
