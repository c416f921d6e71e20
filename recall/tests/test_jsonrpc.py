"""The JSON-RPC envelope's refusals in our shape: which error code each SDK refusal gets."""

from __future__ import annotations

import pytest

from recall import jsonrpc


def sdk_error(code: int, message: str, data: object = "") -> dict:
    return {"jsonrpc": "2.0", "id": 4, "error": {"code": code, "message": message, "data": data}}


@pytest.mark.parametrize(
    ("code", "message", "ours"),
    [
        (-32602, "Invalid request parameters", "validation_failed"),
        (-32601, "Method not found", "validation_failed"),
        (-32600, "Invalid request", "validation_failed"),
        # The server's own faults: a client must not read them as its mistake.
        (-32603, "Internal server error", "internal_error"),
        (0, "boom", "internal_error"),
    ],
)
def test_an_sdk_refusal_gets_the_code_of_whose_fault_it_is(code, message, ours):
    body = jsonrpc.error_body(sdk_error(code, message), "tools/call")

    assert body is not None
    assert body["id"] == 4
    assert body["error"]["code"] == code
    assert body["error"]["data"]["error"]["code"] == ours


def test_a_code_of_ours_the_refusal_carries_is_kept():
    carried = {"error": {"code": "unavailable", "message": "The database is unavailable."}}

    body = jsonrpc.error_body(sdk_error(-32603, "The database is unavailable.", carried))

    assert body is not None
    assert body["error"]["data"]["error"]["code"] == "unavailable"


def test_a_result_is_not_an_error():
    assert jsonrpc.error_body({"jsonrpc": "2.0", "id": 1, "result": {}}) is None


@pytest.mark.parametrize(
    ("status", "ours"), [(503, "unavailable"), (404, "not_found"), (409, "conflict")]
)
def test_an_http_status_that_says_more_than_the_json_rpc_code_decides(status, ours):
    body = jsonrpc.error_body(sdk_error(-32600, "Session not found"), status=status)

    assert body is not None
    assert body["error"]["data"]["error"]["code"] == ours


@pytest.mark.parametrize(
    "body",
    [
        b'{"jsonrpc":"2.0","id":"\\ud800","method":"ping"}',
        b'{"jsonrpc":"2.0","id":"x\\udc00","method":"ping"}',
        b'{"jsonrpc":"1.0","id":"\\ud800","method":"ping"}',
    ],
)
def test_an_id_that_is_no_text_is_answered_with_null(body):
    # It was echoed: "\ud800", a refusal a strict client cannot decode.
    with pytest.raises(jsonrpc.Invalid) as refused:
        jsonrpc.parse(body)

    assert refused.value.body()["id"] is None
    assert jsonrpc.call_id({"id": "\ud800"}) is None
    assert jsonrpc.call_id({"id": "\U0001f600"}) == "\U0001f600"


def test_a_refusal_of_params_names_the_value_of_their_meta_that_is_wrong():
    envelope = {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
    }
    bad = {**envelope, "io.modelcontextprotocol/clientInfo": 5}
    params = {"name": "memory_stats", "arguments": {}, "_meta": bad}

    assert jsonrpc.reworded(-32602, "Invalid request parameters", "tools/call", (), params) == (
        "Invalid params: io.modelcontextprotocol/clientInfo in params._meta must be an object"
        " with the client's name and version, as text."
    )
    # Elsewhere than _meta, the fault is told as before: what the params take.
    fine = {"name": 5, "_meta": envelope}
    assert jsonrpc.reworded(-32602, "Invalid request parameters", "tools/call", (), fine) == (
        "Invalid params for 'tools/call': it takes name and arguments."
    )
    assert jsonrpc.meta_fault("tools/call", {"name": "x", "_meta": "x"}) == (
        "Invalid params: params._meta must be an object."
    )
