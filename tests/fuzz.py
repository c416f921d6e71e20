"""Hypothesis strategies and invariants for fuzzing /mcp over HTTP.

The argument space comes from the tool schemas the server publishes
(``tools/list``), not from a list kept here, so a tool or an argument added
later is fuzzed without edits. Each argument is drawn either from its schema
(so calls get past validation and reach the services) or as arbitrary JSON
(so they do not), and calls sometimes carry arguments no tool declares.

How many cases run: the ``ci`` profile by default (bounded, for CI), or
``--fuzz-cases N`` per test (``bench/fuzz.py`` runs 10,000+).
"""

from __future__ import annotations

import json
import os
import re
import string
import unicodedata
from collections import Counter
from collections.abc import Callable
from typing import Any

import httpx2
from hypothesis import strategies as st

from core.errors import CODES

MODERN = "2026-07-28"
LEGACY = "2025-11-25"
GENERATIONS = [LEGACY, MODERN]

# Words that only a library's own error output contains.
LIBRARY_TEXT = re.compile(
    r"pydantic|input_value|input_type|For further information|errors\.pydantic\.dev"
    r"|Traceback|psycopg|django\.|File \"|line \d+, in ",
)
# The validation library's phrasing, type and class names, and location syntax
# (union branch tags such as ``metadata_filter.team.str``): never in our words.
VALIDATION_TEXT = re.compile(
    r"Input should|Field required|valid dictionary|instance of|Unable to parse|type="
    r"|String should|List should|Dictionary should|should have at|Extra inputs|Value error"
    r"|validation error|exceeded maximum size|fractional part|\b(literal|list|dict)\["
    r"|\b(Document|Message|NoneType|BaseModel)\b|\.(str|int|float|bool|none)\b",
)
VOCABULARY = {*CODES, "rate_limited"}
# Seed 001's codes at /v1/mcp, which carry ours in details.recall_code.
V1_CODES = {
    "INVALID_PARAMETERS",
    "MEMORY_NOT_FOUND",
    "RATE_LIMIT_EXCEEDED",
    "QUOTA_EXCEEDED",
    "CONFLICT",
    "MEM0_API_ERROR",
    "CONFIRMATION_INVALID",
    "CONFIRMATION_EXPIRED",
}
UUID = re.compile(r"[0-9a-fA-F]{8}-?([0-9a-fA-F]{4}-?){3}[0-9a-fA-F]{12}")

NAMESPACES = ["default", "fuzz", "a:b/c@d.e-f_g"]

# Requests sent by test, and what came back, for the summary at the end of the run.
CASES: Counter[str] = Counter()
OUTCOMES: Counter[str] = Counter()


def headers(key: str, generation: str, message: object = None) -> dict[str, str]:
    """Headers a client of ``generation`` sends with ``message``: 2026-era ones name the method."""
    sent = {
        "Authorization": f"Bearer {key}",
        "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": generation,
    }
    if generation == MODERN and isinstance(message, dict):
        method = message.get("method")
        params = message.get("params")
        name = params.get("name") if isinstance(params, dict) else None
        if isinstance(method, str) and _printable(method):
            sent["Mcp-Method"] = method
        if method == "tools/call" and isinstance(name, str) and _printable(name):
            sent["Mcp-Name"] = name
    return sent


def _printable(value: str) -> bool:
    return value.isascii() and value.isprintable() and value == value.strip()


def envelope(method: str, params: dict[str, Any], generation: str, call_id: Any = 1) -> dict:
    """A JSON-RPC request as a stateless client of ``generation`` sends it."""
    if generation == MODERN:
        params = {
            **params,
            "_meta": {
                "io.modelcontextprotocol/protocolVersion": MODERN,
                "io.modelcontextprotocol/clientCapabilities": {},
                "io.modelcontextprotocol/clientInfo": {"name": "fuzz", "version": "1"},
            },
        }
    return {"jsonrpc": "2.0", "id": call_id, "method": method, "params": params}


def published_tools(mcp_url: str, key: str, generation: str) -> list[dict[str, Any]]:
    body = envelope("tools/list", {}, generation)
    response = httpx2.post(mcp_url, headers=headers(key, generation, body), json=body, timeout=60)
    response.raise_for_status()
    return response.json()["result"]["tools"]


# Values -----------------------------------------------------------------------------------

# Text with what breaks naive code: NUL, lone surrogates are impossible in
# JSON from Python, but control characters, combining marks, CRLF, RTL
# marks, emoji and very long runs are not.
awkward_text = st.one_of(
    st.text(max_size=40),
    st.text(alphabet=st.characters(codec="utf-8"), max_size=200),
    st.sampled_from(
        [
            "",
            " ",
            "\x00",
            "a\x00b",
            "\r\n\r\n",
            "e\u0301",
            "\u202eevil",
            "</memory><script>x</script>",
            "' OR 1=1 --",
            "%s%s%n",
            "\ufeff",
            "🙂" * 10,
        ]
    ),
    st.builds(lambda c, n: c * n, st.sampled_from(["a", "é", "[", " "]), st.integers(1, 60_000)),
)

json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    awkward_text,
)
json_values = st.recursive(
    json_scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=5), st.dictionaries(st.text(max_size=10), children, max_size=5)
    ),
    max_leaves=20,
)


def from_schema(schema: dict[str, Any], defs: dict[str, Any]) -> st.SearchStrategy[Any]:
    """Values that satisfy a JSON Schema, for the subset pydantic publishes."""
    if "$ref" in schema:
        return from_schema(defs[schema["$ref"].rsplit("/", 1)[-1]], defs)
    if "anyOf" in schema:
        return st.one_of(*(from_schema(option, defs) for option in schema["anyOf"]))
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    if "const" in schema:
        return st.just(schema["const"])
    kind = schema.get("type")
    if kind == "string":
        return _strings(schema)
    if kind == "integer":
        return st.integers(schema.get("minimum"), schema.get("maximum"))
    if kind == "number":
        return st.floats(
            schema.get("minimum"), schema.get("maximum"), allow_nan=False, allow_infinity=False
        )
    if kind == "array":
        return st.lists(from_schema(schema.get("items", {}), defs), max_size=5)
    if kind == "object":
        values = schema.get("additionalProperties")
        inner = from_schema(values, defs) if isinstance(values, dict) else json_values
        return st.dictionaries(st.text(max_size=12), inner, max_size=schema.get("maxProperties", 6))
    return {"boolean": st.booleans(), "null": st.none()}.get(str(kind), json_values)


def _strings(schema: dict[str, Any]) -> st.SearchStrategy[str]:
    low, high = schema.get("minLength", 0), schema.get("maxLength", 200)
    if "pattern" in schema:
        return st.one_of(
            st.sampled_from(NAMESPACES),
            st.from_regex(schema["pattern"], fullmatch=True).filter(
                lambda s: low <= len(s) <= high
            ),
        )
    return st.one_of(
        st.text(min_size=low, max_size=min(high, 300)),
        awkward_text.filter(lambda s: low <= len(s) <= high),
    )


def arguments(tool: dict[str, Any], known_ids: list[str]) -> st.SearchStrategy[dict[str, Any]]:
    """Arguments for ``tool``: mostly schema-shaped, sometimes wrong, sometimes undeclared."""
    schema = tool["inputSchema"]
    defs = schema.get("$defs", {})
    properties: dict[str, Any] = schema.get("properties", {})
    required = set(schema.get("required", []))

    def value(name: str, prop: dict[str, Any]) -> st.SearchStrategy[Any]:
        shaped = from_schema(prop, defs)
        if name in ("id", "memory_id"):
            # Ids stored earlier in the run, drawn as an index so the draw itself
            # does not depend on how many there are.
            stored = st.integers(0, 10_000).map(
                lambda n: known_ids[n % len(known_ids)] if known_ids else "no-such-id"
            )
            shaped = st.one_of(shaped, stored, stored)
        return shaped

    shaped = st.fixed_dictionaries(
        {name: value(name, prop) for name, prop in properties.items() if name in required},
        optional={
            name: value(name, prop) for name, prop in properties.items() if name not in required
        },
    )
    # One declared argument replaced by any JSON at all.
    mistyped = (
        st.tuples(shaped, st.sampled_from(sorted(properties)), json_values).map(
            lambda drawn: {**drawn[0], drawn[1]: drawn[2]}
        )
        if properties
        else shaped
    )
    undeclared = st.tuples(
        shaped,
        st.dictionaries(
            st.text(string.ascii_lowercase + "_", min_size=1, max_size=12).filter(
                lambda name: name not in properties
            ),
            json_values,
            min_size=1,
            max_size=2,
        ),
    ).map(lambda drawn: {**drawn[1], **drawn[0]})
    # Mostly calls that pass validation and reach the services.
    return st.one_of(*[shaped] * 6, mistyped, undeclared)


def normalized(content: str) -> str:
    """The README's promise: NFC, line endings to \\n, surrounding whitespace trimmed."""
    text = unicodedata.normalize("NFC", content).replace("\r\n", "\n").replace("\r", "\n")
    return text.strip()


# Invariants ------------------------------------------------------------------------------


def check_response(response: httpx2.Response) -> dict[str, Any] | None:
    """Assert what every answer from /mcp must be; return the JSON-RPC body, if any."""
    test = os.environ.get("PYTEST_CURRENT_TEST", "?").split(" ")[0].rsplit("::", 1)[-1]
    CASES[test] += 1
    assert response.status_code < 500, (response.status_code, response.text[:500])
    OUTCOMES[f"http {response.status_code}"] += 1
    if response.status_code == 202:  # a notification, accepted
        return None
    assert response.headers.get("content-type", "").startswith("application/json"), (
        response.status_code,
        response.headers.get("content-type"),
        response.text[:200],
    )
    body = response.json()
    assert isinstance(body, dict) and body.get("jsonrpc") == "2.0", body
    if "error" in body:
        error = body["error"]
        assert isinstance(error["code"], int), error
        assert isinstance(error["message"], str) and error["message"], error
        assert not LIBRARY_TEXT.search(json.dumps(error)), error
        assert not VALIDATION_TEXT.search(error["message"]), error
        ours = (
            (error.get("data") or {}).get("error") if isinstance(error.get("data"), dict) else None
        )
        if ours is not None:
            assert isinstance(ours.get("code"), str), error
    else:
        assert response.status_code == 200, response.status_code
        assert "result" in body, body
    return body


def check_tool_result(
    body: dict[str, Any], arguments: object = None, schema: object = None
) -> dict[str, Any] | None:
    """Assert a tools/call answer is a result or a refusal in our words; return its content.

    A refusal's code is from the vocabulary (never ``internal_error``), and its
    message is in our words (``check_wording``) about ``arguments``, the call's,
    whose tool takes ``schema``.
    """
    if "error" in body:
        OUTCOMES[f"tools/call: JSON-RPC error {body['error']['code']}"] += 1
        check_wording(body["error"]["message"], arguments, schema)
        return None
    result = body["result"]
    structured = result.get("structuredContent")
    text = "".join(block.get("text", "") for block in result.get("content", []))
    if result.get("isError"):
        assert isinstance(structured, dict), result
        code, message = error_of(structured)
        assert code in VOCABULARY, structured
        assert code != "internal_error", structured
        # The text block is the error as JSON: the message again, with its
        # quotes escaped, so the caller's own names are set aside the same way.
        assert not LIBRARY_TEXT.search(_set_aside(text, arguments, json.dumps)), text[:300]
        check_wording(message, arguments, schema)
        OUTCOMES[f"tools/call: {code}"] += 1
        return None
    assert isinstance(structured, dict), result
    OUTCOMES["tools/call: success"] += 1
    return structured


def error_of(structured: dict[str, Any]) -> tuple[str, str]:
    """Return a tool error's code (ours) and message, in either endpoint's shape."""
    error = structured["error"]
    if isinstance(error, dict):  # {"error": {"code", "message"}}
        assert set(error) == {"code", "message"}, error
        return error["code"], error["message"]
    # Seed 001's shape at /v1/mcp: {"error": message, "code": CODE, "details": {recall_code}}.
    assert isinstance(error, str), structured
    assert structured["code"] in V1_CODES, structured
    return structured["details"]["recall_code"], error


def check_wording(message: str, arguments: object = None, schema: object = None) -> None:
    """Assert ``message`` is in our words, and echoes no value of ``arguments``.

    Names the caller chose (argument names, metadata_filter keys) may be
    quoted back, so their quoted forms are set aside first; ids may be too. Any other
    string value of six or more characters, that the tool's ``schema`` does
    not itself contain (an enum member, say), must not appear.
    """
    assert isinstance(message, str) and message.strip(), message
    names = set(_keys(arguments))
    plain = _set_aside(message, arguments)
    assert not LIBRARY_TEXT.search(plain), message
    assert not VALIDATION_TEXT.search(plain), message
    published = json.dumps(schema) if schema is not None else ""
    for value in _texts(arguments):
        shown = value.strip()
        if len(shown) < 6 or UUID.fullmatch(shown) or shown in published or shown in names:
            continue
        assert shown not in plain, ("a value was echoed", shown[:80], message[:300])


def _set_aside(text: str, arguments: object, encode: Callable[[str], str] = str) -> str:
    """Return ``text`` without the caller's own names as the server quotes them back.

    An argument the caller named ``input_type`` is its word, not the
    validation library's, when a refusal names it. ``encode`` is how the
    quoted name appears in ``text`` (``json.dumps`` inside a JSON text block).
    """
    for name in sorted(set(_keys(arguments)), key=len, reverse=True):
        # As the server quotes them: repr, cut to 64 characters.
        quoted = repr(name[:64])
        text = text.replace(encode(quoted)[1:-1] if encode is not str else quoted, "''")
    return text


def _keys(value: object) -> list[str]:
    if isinstance(value, dict):
        return [str(key) for key in value] + [k for item in value.values() for k in _keys(item)]
    if isinstance(value, list):
        return [k for item in value for k in _keys(item)]
    return []


def _texts(value: object) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for item in value.values() for s in _texts(item)]
    if isinstance(value, list):
        return [s for item in value for s in _texts(item)]
    return []
