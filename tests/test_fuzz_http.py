"""Property-based fuzzing of /mcp's envelope, headers and raw bodies, on both generations.

Whatever arrives, the answer is never a 5xx, always JSON (or a 202 for a
notification), and any refusal is a JSON-RPC error without library text.
"""

from __future__ import annotations

import json

import httpx2
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests import fuzz

pytestmark = pytest.mark.slow

METHODS = [
    "initialize",
    "ping",
    "tools/list",
    "tools/call",
    "resources/list",
    "prompts/list",
    "notifications/initialized",
    "subscriptions/listen",
    "completion/complete",
    "logging/setLevel",
]

ids = st.one_of(st.integers(), st.text(max_size=20), st.none(), st.booleans(), st.floats())
messages = st.fixed_dictionaries(
    {},
    optional={
        "jsonrpc": st.one_of(st.just("2.0"), fuzz.json_values),
        "id": ids,
        "method": st.one_of(st.sampled_from(METHODS), st.text(max_size=30), fuzz.json_values),
        "params": st.one_of(
            st.fixed_dictionaries(
                {},
                optional={
                    "name": st.one_of(st.sampled_from(["remember", "recall"]), fuzz.json_values),
                    "arguments": fuzz.json_values,
                    "_meta": fuzz.json_values,
                    "protocolVersion": fuzz.json_values,
                    "cursor": fuzz.json_values,
                },
            ),
            fuzz.json_values,
        ),
        "result": fuzz.json_values,
        "error": fuzz.json_values,
    },
)

header_values = st.one_of(
    # What HTTP/1.1 can carry at all: printable ASCII, no surrounding spaces.
    st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=60).map(
        str.strip
    ),
    st.sampled_from(["", "application/json", "text/plain", "*/*", "null", "2025-11-25"]),
)
header_names = st.sampled_from(
    [
        "Content-Type",
        "Accept",
        "MCP-Protocol-Version",
        "Origin",
        "X-Request-ID",
        "Mcp-Session-Id",
        "Authorization",
        "Last-Event-ID",
        "Content-Encoding",
        "X-Forwarded-Proto",
    ]
)

raw_bodies = st.one_of(
    st.binary(max_size=300),
    st.builds(lambda depth: b"[" * depth + b"]" * depth, st.integers(0, 5000)),
    st.builds(lambda depth: b'{"a":' * depth + b"1" + b"}" * depth, st.integers(0, 3000)),
    messages.map(lambda m: json.dumps(m).encode()).flatmap(
        lambda encoded: st.integers(0, len(encoded)).map(lambda cut: encoded[:cut])
    ),
    st.sampled_from([b"\xff\xfe", b'"\\ud800"', b"1e999999", b"-", b"{}" * 1000, b"[" * 99]),
)


@pytest.fixture
def post(live, cast):
    with httpx2.Client(timeout=120) as client:

        def send(body: bytes, generation: str, extra: dict[str, str] | None = None, message=None):
            headers = {**fuzz.headers(cast.alice_key.raw, generation, message), **(extra or {})}
            return client.post(live.mcp_url, content=body, headers=headers)

        yield send


@pytest.mark.parametrize("generation", fuzz.GENERATIONS)
def test_no_json_rpc_envelope_fails_badly(post, generation, fuzz_settings):
    @fuzz_settings
    @given(message=st.one_of(messages, st.lists(messages, max_size=3), fuzz.json_values))
    def one(message):
        fuzz.check_response(post(json.dumps(message).encode(), generation, message=message))

    one()


@pytest.mark.parametrize("generation", fuzz.GENERATIONS)
def test_no_raw_body_fails_badly(post, generation, fuzz_settings):
    @fuzz_settings
    @given(body=raw_bodies)
    def one(body):
        fuzz.check_response(post(body, generation))

    one()


def test_no_headers_fail_badly(post, fuzz_settings):
    @fuzz_settings
    @given(
        extra=st.dictionaries(header_names, header_values, max_size=4),
        generation=st.sampled_from(fuzz.GENERATIONS),
    )
    def one(extra, generation):
        message = fuzz.envelope("tools/call", {"name": "list_memories"}, generation)
        fuzz.check_response(post(json.dumps(message).encode(), generation, extra, message))

    one()
