"""Errors in our words on /mcp, /agent/mcp and /v1/mcp, over a real MCP client and raw HTTP.

Each case is one that spoke the validation library's language, or said two
things for one refusal: a class name ("instance of Document"), "Field
required", "Unable to parse input string as an integer", union location
syntax (``metadata_filter.team.str``), an empty list of accepted arguments,
two wordings for 406 and for 415, an OAuth token called an API key, and a
/v1/mcp error naming ``id`` where the argument is ``memory_id`` (and an id
that is none of ours is MEMORY_NOT_FOUND there, as seed 001 says). The fuzz
suites (test_fuzz_tools.py, test_fuzz_http.py) hold every other refusal to
the same words.
"""

from __future__ import annotations

import gzip
import json

import httpx2
import pytest

from tests import fuzz
from tests.clients import MODES, call, raw_call, structured
from tests.test_protected_resource import mint

pytestmark = pytest.mark.slow


def refusal(url: str, secret: str, tool: str, arguments: dict, mode: str = "legacy") -> str:
    """Call ``tool`` with the SDK's client and return the refusal's message, checked."""
    result = call(url, secret, tool, arguments, mode)
    assert result.is_error, structured(result)
    code, message = fuzz.error_of(structured(result))
    assert code == "validation_failed", structured(result)
    fuzz.check_wording(message, arguments)
    return message


@pytest.fixture
def token(live, cast, agents) -> str:
    """Alice's writer agent's OAuth access token for /agent/mcp."""
    return mint(cast.alice, agents.writer, live.url + "/agent/mcp")


@pytest.mark.parametrize("mode", MODES)
def test_a_document_that_is_not_an_object_is_described_without_a_class_name(live, token, mode):
    message = refusal(live.url + "/agent/mcp", token, "memory_add", {"document": "x"}, mode)

    assert message == "document must be an object with content and path."


@pytest.mark.parametrize(
    ("document", "named"),
    [
        ({"content": "Runbook\x00", "path": "ops/runbook.md"}, "document.content "),
        ({"content": "Runbook", "path": "ops/\x00runbook.md"}, "document.path "),
        ({"content": "Runbook", "path": " "}, "document.path is required"),
    ],
)
def test_a_documents_field_is_named_within_the_document(live, token, document, named):
    # It was named as if it were the call's own content or path argument.
    message = refusal(live.url + "/agent/mcp", token, "memory_add", {"document": document})

    assert message.startswith(named)


def test_a_missing_argument_is_named_and_said_to_be_required(live, cast):
    assert refusal(live.mcp_url, cast.alice_key.raw, "recall", {}) == "query is required."
    assert (
        refusal(live.url + "/v1/mcp", cast.alice_key.raw, "delete_memory", {})
        == "memory_id is required."
    )


def test_a_required_argument_sent_as_null_is_said_to_be_required(live, cast):
    # It was asked for as text of at most 64 characters, as if null were a wrong type.
    v1 = live.url + "/v1/mcp"
    arguments = {"memory_id": None, "content": "Deploys go to eu-west-1."}

    assert refusal(v1, cast.alice_key.raw, "update_memory", arguments) == "memory_id is required."
    assert refusal(live.mcp_url, cast.alice_key.raw, "recall", {"query": None}) == (
        "query is required."
    )


def test_a_number_too_long_to_parse_is_asked_for_as_a_whole_number_in_range(live, cast):
    arguments = {"query": "launch date", "limit": "9" * 5000}

    message = refusal(live.mcp_url, cast.alice_key.raw, "recall", arguments)

    assert message == "limit must be a whole number between 1 and 50."


@pytest.mark.parametrize("mode", MODES)
def test_a_metadata_filter_value_is_located_by_its_key_not_by_union_branches(live, cast, mode):
    arguments = {"query": "launch date", "metadata_filter": {"team": ["platform", "infra"]}}

    message = refusal(live.mcp_url, cast.alice_key.raw, "recall", arguments, mode)

    assert message == "metadata_filter['team'] must be text, a number, true or false, or null."


def test_a_message_in_a_conversation_is_located_by_its_position(live, cast):
    messages = [
        {"role": "user", "content": "Which region do we deploy to?"},
        {"role": "assistant", "content": "eu-west-1, since March."},
        {"role": "user"},
        {"role": "user", "content": 42},
    ]

    message = refusal(live.mcp_url, cast.alice_key.raw, "remember", {"messages": messages})

    assert message == (
        "messages[2].content is required. "
        "messages[3].content must be text of 1 to 50,000 characters."
    )


@pytest.mark.parametrize(
    ("path", "tool"),
    [("/mcp", "memory_stats"), ("/v1/mcp", "cache_stats"), ("/agent/mcp", "memory_filters")],
)
def test_an_argument_to_a_tool_that_takes_none_is_refused_saying_so(live, cast, token, path, tool):
    secret = token if path == "/agent/mcp" else cast.alice_key.raw

    message = refusal(live.url + path, secret, tool, {"x": 1})

    assert message == f"Unknown argument 'x'. {tool} takes no arguments."


def test_an_unknown_argument_is_refused_with_the_arguments_the_tool_takes(live, cast):
    arguments = {"query": "launch date", "namespce": "work"}

    message = refusal(live.mcp_url, cast.alice_key.raw, "recall", arguments)

    assert message == (
        "Unknown argument 'namespce'. recall takes: query, namespace, limit, threshold, mode, "
        "metadata_filter, priority, created_after, created_before, include_superseded, as_of."
    )


@pytest.mark.parametrize(
    ("tool", "arguments"),
    [
        ("delete_memory", {}),
        ("get_memory_history", {}),
        ("update_memory", {"content": "Deploys go to eu-west-1."}),
    ],
)
def test_v1_names_the_memory_id_argument_by_its_own_name(live, cast, tool, arguments):
    url = live.url + "/v1/mcp"

    message = refusal(url, cast.alice_key.raw, tool, {"memory_id": 17, **arguments})
    # Seed 001's ids are opaque strings: one that is no id of ours names no memory.
    opaque = call(url, cast.alice_key.raw, tool, {"memory_id": "not-a-uuid", **arguments})

    assert message == "memory_id must be text of at most 64 characters."
    assert fuzz.error_of(structured(opaque))[0] == "not_found"
    assert structured(opaque)["code"] == "MEMORY_NOT_FOUND"


# HTTP refusals ----------------------------------------------------------------------------

ENDPOINTS = ["/mcp", "/agent/mcp", "/v1/mcp"]
NOT_ACCEPTABLE = "Not acceptable: send Accept: application/json, text/event-stream."
UNSUPPORTED = "Unsupported media type: send Content-Type: application/json."


def post(url: str, secret: str, generation: str, **headers: str) -> httpx2.Response:
    body = fuzz.envelope("tools/list", {}, generation)
    sent = {**fuzz.headers(secret, generation, body), **headers}
    return httpx2.post(url, headers=sent, content=json.dumps(body), timeout=30)


def refused(response: httpx2.Response, status: int) -> str:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    error = response.json()["error"]
    assert error["data"]["error"]["message"] == error["message"]
    fuzz.check_wording(error["message"])
    return error["message"]


@pytest.mark.parametrize("generation", fuzz.GENERATIONS)
@pytest.mark.parametrize("path", ENDPOINTS)
def test_an_unacceptable_accept_header_gets_one_wording_from_either_sdk_path(
    live, cast, token, path, generation
):
    secret = token if path == "/agent/mcp" else cast.alice_key.raw

    for accept in ("text/html", "text/event-stream"):
        response = post(live.url + path, secret, generation, Accept=accept)

        assert refused(response, 406) == NOT_ACCEPTABLE
        assert response.json()["error"]["data"]["error"]["code"] == "validation_failed"


@pytest.mark.parametrize("path", ENDPOINTS)
def test_a_body_that_is_not_json_gets_one_wording(live, cast, token, path):
    secret = token if path == "/agent/mcp" else cast.alice_key.raw

    for content_type in ("text/plain", "application/json-patch+json", ""):
        response = post(live.url + path, secret, fuzz.LEGACY, **{"Content-Type": content_type})

        assert refused(response, 415) == UNSUPPORTED


@pytest.mark.parametrize("path", ["/mcp", "/v1/mcp"])
def test_an_expired_or_unknown_oauth_token_is_called_a_token_where_keys_work_too(
    live, cast, agents, path
):
    expired = mint(cast.alice, agents.writer, live.url + path, expires_in=-60)

    for bearer in (expired, "not-a-token-we-issued"):
        response = raw_call(live.url + path, bearer, "list_memories", {})

        message = refused(response, 401)
        assert message == (
            "Invalid or expired OAuth access token for this endpoint: connect again to get one."
        )
        assert 'error="invalid_token"' in response.headers["www-authenticate"]


def test_an_expired_token_at_the_agent_endpoint_gets_the_same_words(live, cast, agents):
    expired = mint(cast.alice, agents.writer, live.url + "/agent/mcp", expires_in=-60)

    response = raw_call(live.url + "/agent/mcp", expired, "memory_filters", {})

    assert refused(response, 401) == (
        "Invalid or expired OAuth access token for this endpoint: connect again to get one."
    )


@pytest.mark.parametrize("path", ["/mcp", "/v1/mcp"])
def test_an_unknown_api_key_is_still_called_an_api_key(live, path):
    response = raw_call(live.url + path, "recall_live_" + "A" * 32, "list_memories", {})

    assert refused(response, 401) == (
        "Missing or invalid API key. Send Authorization: Bearer recall_live_..."
    )


def post_call(url: str, secret: str, params: dict) -> dict:
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params}
    headers = {
        "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": "2025-11-25",
        "Authorization": f"Bearer {secret}",
    }
    response = httpx2.post(url, headers=headers, content=json.dumps(body), timeout=60)
    assert response.status_code == 200, response.text
    return response.json()["result"]


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        ({}, "name is required: the tool to call, as text."),
        ({"name": 1, "arguments": {}}, "name is required: the tool to call, as text."),
        ({"name": "ab\u0000cd", "arguments": {}}, "Unknown tool 'ab\ufffdcd'."),
        ({"name": "recall", "arguments": {"qu\u0000ery": 1}}, "Unknown argument 'qu\ufffdery'."),
    ],
    ids=["no name", "a number", "a NUL", "an argument's NUL"],
)
def test_a_missing_or_unprintable_name_is_worded_without_python(live, cast, params, expected):
    # It said "Unknown tool 'None'", or quoted a NUL as '\\x00'.
    from tests.conftest import usage_events

    result = post_call(live.mcp_url, cast.alice_key.raw, params)

    code, message = fuzz.error_of(result["structuredContent"])
    assert code == "validation_failed"
    assert message.startswith(expected)
    assert "None" not in message and "\\x" not in message
    # The call leaves its usage event, whatever the name was.
    [event] = usage_events(1, user_id=cast.alice.id)
    assert event.success is False and "\x00" not in event.tool_name


def send(url: str, secret: str, body: dict, **headers: str) -> httpx2.Response:
    sent = {
        "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream",
        "Authorization": f"Bearer {secret}",
        **headers,
    }
    return httpx2.post(url, headers=sent, content=json.dumps(body), timeout=60)


@pytest.mark.parametrize(
    ("method", "params", "expected"),
    [
        (
            "initialize",
            None,
            "Invalid params for 'initialize': it takes protocolVersion, capabilities and"
            " clientInfo ({name, version}).",
        ),
        (
            "completion/complete",
            {},
            "Invalid params for 'completion/complete': it takes ref and argument ({name, value}).",
        ),
        ("resources/read", {}, "Invalid params for 'resources/read': it takes uri."),
        (
            "bogus/method",
            {},
            "Method not found: 'bogus/method' is not a method this server serves.",
        ),
    ],
)
@pytest.mark.parametrize("path", ["/mcp", "/v1/mcp"])
def test_a_refusal_the_2025_transport_answers_with_200_is_in_our_words(
    live, cast, path, method, params, expected
):
    # It was {"code": -32602, "message": "Invalid request parameters", "data": ""}:
    # the SDK's words, and no error code where every other refusal has one.
    body = {"jsonrpc": "2.0", "id": 7, "method": method}
    if params is not None:
        body["params"] = params
    headers = {} if method == "initialize" else {"MCP-Protocol-Version": fuzz.LEGACY}

    response = send(live.url + path, cast.alice_key.raw, body, **headers)

    assert refused(response, 200) == expected
    assert response.json()["id"] == 7
    assert response.json()["error"]["data"]["error"]["code"] == "validation_failed"


def test_a_missing_method_header_is_called_missing_not_a_mismatch(live, cast):
    body = fuzz.envelope("tools/list", {}, fuzz.MODERN)

    response = send(live.mcp_url, cast.alice_key.raw, body, **{"MCP-Protocol-Version": fuzz.MODERN})

    assert refused(response, 400) == (
        "The Mcp-Method header is missing: with this protocol version every request sends it,"
        " holding the request's method."
    )


def test_a_method_header_that_disagrees_with_the_body_is_called_a_mismatch_in_our_words(live, cast):
    # It was the SDK's "mcp-method header does not match the request body's method".
    body = fuzz.envelope("tools/list", {}, fuzz.MODERN)
    sent = {"MCP-Protocol-Version": fuzz.MODERN, "Mcp-Method": "ping"}

    response = send(live.mcp_url, cast.alice_key.raw, body, **sent)

    assert refused(response, 400) == (
        "The Mcp-Method header does not match the body: it must hold the request's method."
    )


def test_a_compressed_body_is_refused_as_an_encoding_we_do_not_read(live, cast):
    body = gzip.compress(json.dumps(fuzz.envelope("tools/list", {}, fuzz.LEGACY)).encode())
    sent = {**fuzz.headers(cast.alice_key.raw, fuzz.LEGACY), "Content-Encoding": "gzip"}

    response = httpx2.post(live.mcp_url, headers=sent, content=body, timeout=30)

    assert refused(response, 415) == "Unsupported content encoding: send the body uncompressed."


def test_a_tool_error_result_is_passed_through_as_it_is(live, cast):
    # A small 200 body holding "error" is read (a JSON-RPC error is reworded);
    # a tool's own error result, whose structuredContent has an "error", is not
    # one, and comes back as the tool answered it.
    missing = "00000000-0000-4000-8000-000000000000"
    params = {"name": "update_memory", "arguments": {"id": missing, "content": "x"}}
    body = fuzz.envelope("tools/call", params, fuzz.LEGACY)

    response = send(live.mcp_url, cast.alice_key.raw, body, **{"MCP-Protocol-Version": fuzz.LEGACY})

    assert response.status_code == 200
    assert b'"error"' in response.content and len(response.content) < 4096
    answer = response.json()
    assert "error" not in answer
    assert answer["result"]["isError"] is True
    assert answer["result"]["structuredContent"]["error"]["code"] == "not_found"


@pytest.mark.parametrize(
    "accept",
    ["application/json;q=0, text/event-stream", "application/json; q=0.0, */*, text/event-stream"],
)
def test_an_accept_header_that_refuses_json_gets_406(live, cast, accept):
    response = post(live.mcp_url, cast.alice_key.raw, fuzz.LEGACY, Accept=accept)

    assert refused(response, 406) == NOT_ACCEPTABLE


def test_an_accept_header_that_only_prefers_something_else_is_served(live, cast):
    accept = "text/event-stream, application/json;q=0.1"

    response = post(live.mcp_url, cast.alice_key.raw, fuzz.LEGACY, Accept=accept)

    assert response.status_code == 200
    assert response.json()["result"]["tools"]


@pytest.mark.parametrize("mode", MODES)
def test_an_unknown_field_in_a_message_is_refused_by_name_not_dropped(live, cast, token, mode):
    # "nmae" was dropped and the message stored without its speaker.
    typo = [{"role": "user", "content": "Deploys are on Thursdays.", "nmae": "bob"}]

    assert (
        refusal(live.mcp_url, cast.alice_key.raw, "remember", {"messages": typo}, mode)
        == "messages[0]['nmae'] is not accepted here."
    )
    assert (
        refusal(live.url + "/v1/mcp", cast.alice_key.raw, "add_memory", {"messages": typo}, mode)
        == "messages[0]['nmae'] is not accepted here."
    )
    assert (
        refusal(live.url + "/agent/mcp", token, "memory_add", {"messages": typo}, mode)
        == "messages[0]['nmae'] is not accepted here."
    )


@pytest.mark.parametrize(
    ("meta", "expected"),
    [
        (
            {"io.modelcontextprotocol/clientCapabilities": "x"},
            "Invalid params: io.modelcontextprotocol/clientCapabilities in params._meta must be"
            " an object: the client's capabilities, each an object.",
        ),
        (
            {"io.modelcontextprotocol/clientCapabilities": {"sampling": 5}},
            "Invalid params: io.modelcontextprotocol/clientCapabilities in params._meta must be"
            " an object: the client's capabilities, each an object.",
        ),
        (
            {"io.modelcontextprotocol/clientInfo": 5},
            "Invalid params: io.modelcontextprotocol/clientInfo in params._meta must be an"
            " object with the client's name and version, as text.",
        ),
        (
            {"io.modelcontextprotocol/logLevel": "loud"},
            "Invalid params: io.modelcontextprotocol/logLevel in params._meta must be one of"
            " debug, info, notice, warning, error, critical, alert or emergency.",
        ),
        (
            {"progressToken": [1]},
            "Invalid params: progressToken in params._meta must be a string or an integer.",
        ),
    ],
    ids=[
        "capabilities text",
        "a capability a number",
        "client info a number",
        "log level",
        "token",
    ],
)
@pytest.mark.parametrize("path", ["/mcp", "/v1/mcp"])
def test_a_malformed_value_in_the_envelope_is_named_not_called_bad_params(
    live, cast, path, meta, expected
):
    # It was "Invalid params for 'tools/call': it takes name and arguments.", of
    # a call that held both: the fault was in params._meta.
    tool = {"/mcp": "memory_stats", "/v1/mcp": "cache_stats"}[path]
    body = fuzz.envelope("tools/call", {"name": tool, "arguments": {}}, fuzz.MODERN)
    body["params"]["_meta"].update(meta)
    sent = fuzz.headers(cast.alice_key.raw, fuzz.MODERN, body)

    response = httpx2.post(live.url + path, headers=sent, content=json.dumps(body), timeout=30)

    assert refused(response, 400) == expected
    assert response.json()["id"] == 1
    assert response.json()["error"]["code"] == -32602
    assert response.json()["error"]["data"]["error"]["code"] == "validation_failed"
