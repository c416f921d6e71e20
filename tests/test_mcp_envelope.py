"""What /mcp answers to bodies that are not one well-formed JSON-RPC message.

Every refusal is a JSON-RPC error body in our words, never a 500, a plain-text
page or a library's validation dump.
"""

from __future__ import annotations

import json

import httpx2
import pytest
from mcp_types import UnsupportedProtocolVersionErrorData
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS, MODERN_PROTOCOL_VERSIONS

from core import tenancy
from memories.models import Memory
from tests.conftest import usage_events
from tests.fuzz import GENERATIONS, LEGACY, MODERN, envelope, headers

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


def test_a_number_too_long_to_read_is_called_that_not_invalid_json(live, cast):
    # Valid JSON that Python will not convert; it was "the body is not valid JSON".
    body = json.dumps(remember_body("x")).replace('"x"', "9" * 5000).encode()

    response = post(live, cast.alice_key.raw, body)

    assert response.status_code == 400
    error = refusal(response)
    assert error["code"] == -32700
    assert error["message"].startswith("Parse error: a number in the body has more digits")


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


def test_a_lone_surrogate_escape_is_refused_as_no_text_answering_the_request(live, cast):
    # A lone surrogate escape: valid JSON to Python's json module, not to
    # pydantic-core's. It was a parse error with id null, which a client
    # cannot match to its request (over stdio it waited for ever).
    body = json.dumps(remember_body("x")).replace('"x"', '"a\\ud800b"').encode()
    response = post(live, cast.alice_key.raw, body)

    assert response.status_code == 400
    assert response.json()["id"] == json.loads(body)["id"]
    error = refusal(response)
    assert error["code"] == -32602
    assert error["message"].startswith("Text must be valid Unicode")
    assert error["data"]["error"]["code"] == "validation_failed"
    # Refused before a call was read from it: no call, so no usage event (README, "Usage").
    assert usage_events(timeout=0.5) == []


@pytest.mark.parametrize(
    "body",
    [
        b'{"jsonrpc":"2.0","id":"\\ud800","method":"ping"}',
        b'{"jsonrpc":"2.0","id":"a\\uDFFFb","method":"tools/call",'
        b'"params":{"name":"memory_stats","arguments":{}}}',
        b'{"jsonrpc":"1.0","id":"\\udbff","method":"ping"}',
    ],
    ids=["ping", "tools/call", "jsonrpc 1.0"],
)
def test_an_id_holding_half_a_surrogate_pair_is_answered_with_a_null_id(live, cast, body):
    # The refusal echoed the id, "\ud800": no text, which a strict client
    # cannot decode. An id the server cannot use is answered with null.
    for generation in GENERATIONS:
        sent = headers(cast.alice_key.raw, generation, json.loads(body))
        response = post(live, cast.alice_key.raw, body, **sent)

        assert response.status_code == 400, generation
        # All text, as a strict client decodes it: no half of a pair anywhere.
        json.dumps(response.json(), ensure_ascii=False).encode("utf-8")
        assert response.json()["id"] is None
        assert refusal(response)["data"]["error"]["code"] == "validation_failed"
    assert usage_events(timeout=0.5) == []


@pytest.mark.parametrize("method", ["tools/call", "tools/list", "ping"])
def test_a_request_with_a_null_id_is_refused_and_runs_nothing(live, cast, method):
    # MCP request ids MUST NOT be null; a 2025-era server took this for a
    # notification: 202, the call metered as a success, and nothing run.
    params = {"name": "remember", "arguments": {"content": "null id"}}
    for generation in GENERATIONS:
        body = {
            **envelope(method, params if method == "tools/call" else {}, generation),
            "id": None,
        }
        sent = headers(cast.alice_key.raw, generation, body)
        response = post(live, cast.alice_key.raw, json.dumps(body).encode(), **sent)

        assert response.status_code == 400, generation
        assert response.json()["id"] is None
        error = refusal(response)
        assert error["code"] == -32600
        assert error["data"]["error"]["code"] == "validation_failed"
    with tenancy.operator():
        assert not Memory.objects.exists()
    assert usage_events(timeout=0.5) == []


MALFORMED_RESPONSES = {
    "result without an id": {"jsonrpc": "2.0", "result": {}},
    "result with a null id": {"jsonrpc": "2.0", "id": None, "result": {}},
    "result not an object": {"jsonrpc": "2.0", "id": 1, "result": 5},
    "error a string": {"jsonrpc": "2.0", "id": 1, "error": "x"},
    "error code a string": {"jsonrpc": "2.0", "id": 1, "error": {"code": "x", "message": "m"}},
    "error code a boolean": {"jsonrpc": "2.0", "id": 1, "error": {"code": True, "message": "m"}},
    "error without a message": {"jsonrpc": "2.0", "id": 1, "error": {"code": -32600}},
    "both result and error": {
        "jsonrpc": "2.0",
        "id": 1,
        "result": {},
        "error": {"code": -32600, "message": "m"},
    },
}
WELL_FORMED_RESPONSES = {
    "result": {"jsonrpc": "2.0", "id": 1, "result": {}},
    "error": {"jsonrpc": "2.0", "id": "a", "error": {"code": -32601, "message": "No."}},
    "error with a null id": {
        "jsonrpc": "2.0",
        "id": None,
        "error": {"code": -32700, "message": "Parse error"},
    },
}


def test_a_response_needs_an_id_and_exactly_one_of_result_or_error(live, cast):
    for label, body in MALFORMED_RESPONSES.items():
        response = post(live, cast.alice_key.raw, json.dumps(body).encode())

        assert response.status_code == 400, label
        error = refusal(response)
        assert error["code"] == -32600, label
        assert error["message"] != "Invalid request parameters.", label
        assert error["data"]["error"]["code"] == "validation_failed", label
    for label, body in WELL_FORMED_RESPONSES.items():
        response = post(live, cast.alice_key.raw, json.dumps(body).encode())

        assert response.status_code == 202, label


def test_an_unsupported_envelope_version_keeps_the_versions_clients_negotiate_with(live, cast):
    body = envelope("tools/list", {}, MODERN)
    body["params"]["_meta"]["io.modelcontextprotocol/protocolVersion"] = "2027-01-01"
    sent = {**headers(cast.alice_key.raw, MODERN, body), "MCP-Protocol-Version": "2027-01-01"}
    response = post(live, cast.alice_key.raw, json.dumps(body).encode(), **sent)

    assert response.status_code == 400
    error = refusal(response)
    assert error["code"] == -32022
    assert error["data"]["error"]["code"] == "validation_failed"
    # What the SDK's own client reads to retry at a version both sides speak.
    data = UnsupportedProtocolVersionErrorData.model_validate(error["data"])
    assert (data.supported, data.requested) == (list(MODERN_PROTOCOL_VERSIONS), "2027-01-01")


@pytest.mark.parametrize("version", ["2025-11-26", "1999-01-01", ""])
def test_an_unsupported_version_header_is_named_in_the_refusal(live, cast, version):
    initialize = {
        "protocolVersion": LEGACY,
        "capabilities": {},
        "clientInfo": {"name": "t", "version": "1"},
    }
    supported = [*HANDSHAKE_PROTOCOL_VERSIONS, *MODERN_PROTOCOL_VERSIONS]
    for method, params in (("ping", None), ("initialize", initialize)):
        body: dict = {"jsonrpc": "2.0", "id": 7, "method": method}
        if params is not None:
            body["params"] = params
        sent = {"MCP-Protocol-Version": version}
        response = post(live, cast.alice_key.raw, json.dumps(body).encode(), **sent)

        assert response.status_code == 400, method
        assert response.json()["id"] == 7
        error = refusal(response)
        assert error["code"] == -32022
        assert error["message"].startswith(
            "Unsupported protocol version in the MCP-Protocol-Version"
        )
        assert "_meta" not in error["message"]
        assert all(known in error["message"] for known in supported)
        data = UnsupportedProtocolVersionErrorData.model_validate(error["data"])
        assert (data.supported, data.requested) == (supported, version)

    # A 2026-era envelope under the same header is the SDK's to answer.
    body = envelope("tools/list", {}, MODERN)
    sent = {**headers(cast.alice_key.raw, MODERN, body), "MCP-Protocol-Version": version}
    response = post(live, cast.alice_key.raw, json.dumps(body).encode(), **sent)

    assert response.status_code == 400
    assert refusal(response)["code"] == -32020  # the header and the envelope disagree


@pytest.mark.parametrize(
    "meta",
    [None, {"io.modelcontextprotocol/protocolVersion": MODERN}],
    ids=["no _meta", "half a _meta"],
)
def test_a_2026_request_without_its_envelope_is_told_in_our_words(live, cast, meta):
    # The SDK's own sentences reached the client, quoting its constants.
    body = envelope("tools/call", {"name": "memory_stats", "arguments": {}}, MODERN)
    if meta is None:
        del body["params"]["_meta"]
    else:
        body["params"]["_meta"] = meta
    response = post(
        live,
        cast.alice_key.raw,
        json.dumps(body).encode(),
        **headers(cast.alice_key.raw, MODERN, body),
    )

    assert response.status_code == 400
    error = refusal(response)
    assert error["code"] == -32602
    assert error["message"] == (
        "Invalid params: with this protocol version every request carries params._meta"
        " holding io.modelcontextprotocol/protocolVersion"
        " and io.modelcontextprotocol/clientCapabilities."
    )
    assert error["data"]["error"]["code"] == "validation_failed"
