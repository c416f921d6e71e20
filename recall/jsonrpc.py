"""JSON-RPC envelopes at /mcp: what the gate accepts, and every refusal's body.

The gate parses each body once (``parse``) and refuses, in its own words,
anything that is not a single JSON-RPC 2.0 message, and a 2025-era request
under a protocol version header this server does not speak (``check_version``):
the SDK's own refusals quote pydantic's validation dump (union member names,
the echoed input, the pydantic version and a URL), and word an unknown header
as a missing 2026-era ``params._meta`` envelope. ``Clean`` rewrites whatever
error the SDK still answers with (a wrong ``Accept``, a string pydantic-core
refuses that Python's parser takes) into the same shape, so no library text
and no plain-text body ever reaches a client. A 406 or 415 gets one message
whichever layer refused it (the gate, or either of the SDK's transports).
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

from mcp_types import (
    CLIENT_CAPABILITIES_META_KEY,
    CLIENT_INFO_META_KEY,
    LOG_LEVEL_META_KEY,
    PROTOCOL_VERSION_META_KEY,
)
from mcp_types import methods as mcp_methods
from mcp_types.version import (
    HANDSHAKE_PROTOCOL_VERSIONS,
    LATEST_HANDSHAKE_VERSION,
    MODERN_PROTOCOL_VERSIONS,
)
from pydantic import ValidationError

from core import errors, safejson, wording

Send = Callable[[Mapping[str, Any]], Awaitable[None]]

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
# MCP's codes (2026-07-28) for a header that disagrees with the body, and
# for a request that needs a client capability it did not declare.
HEADER_MISMATCH = -32020
MISSING_CAPABILITY = -32021
# MCP's code (2026-07-28) for a protocol version the server does not speak;
# its data names the versions it does, which clients retry with.
UNSUPPORTED_PROTOCOL_VERSION = -32022
# Refusals by the gate, outside the SDK's own codes.
RPC_UNAUTHORIZED = -32050
RPC_RATE_LIMITED = -32051
RPC_REFUSED = -32052
RPC_UNAVAILABLE = -32053


class Invalid(Exception):
    """A body the gate refuses with 400: a JSON-RPC code and a message for the caller."""

    def __init__(
        self,
        message: str,
        *,
        rpc_code: int = INVALID_REQUEST,
        call_id: Any = None,
        data: Mapping[str, Any] | None = None,
    ):
        super().__init__(message)
        self.message = message
        self.rpc_code = rpc_code
        self.call_id = call_id
        self.data = data

    def body(self) -> dict[str, Any]:
        return refusal("validation_failed", self.message, self.call_id, self.rpc_code, self.data)


def refusal(
    code: str,
    message: str,
    call_id: Any = None,
    rpc_code: int = RPC_REFUSED,
    data: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A JSON-RPC error body, so MCP clients surface the message, carrying our error shape.

    ``data`` joins our shape in the error's data: keys a protocol defines there.
    """
    return {
        "jsonrpc": "2.0",
        "id": call_id,
        "error": {
            "code": rpc_code,
            "message": message,
            "data": {**errors.body(code, message), **(data or {})},
        },
    }


def parse(body: bytes) -> dict[str, Any]:
    """Return the one JSON-RPC message in ``body``, or raise ``Invalid`` saying what is wrong."""
    try:
        message = safejson.loads(body)
    except safejson.TooLong:
        raise Invalid(
            "Parse error: a number in the body has more digits than this server reads"
            f" ({sys.get_int_max_str_digits():,}).",
            rpc_code=PARSE_ERROR,
        ) from None
    except ValueError:
        raise Invalid(
            "Parse error: the body is not valid JSON (or is nested too deeply).",
            rpc_code=PARSE_ERROR,
        ) from None
    if isinstance(message, list):
        raise Invalid("Batches are not supported: send one JSON-RPC message per request.")
    if not isinstance(message, dict):
        raise Invalid("The body must be a JSON-RPC 2.0 message: a JSON object.")
    if message.get("id") is not None and not _valid_id(message["id"]):
        raise Invalid("id must be a string or an integer.")
    call_id = _usable_id(message.get("id"))
    if message.get("jsonrpc") != "2.0":
        raise Invalid('jsonrpc must be "2.0".', call_id=call_id)
    if _SURROGATE_ESCAPE.search(body) and _holds_surrogate(message):
        # Valid JSON, and Python reads it, but it is no text: a lone half of
        # a UTF-16 pair (a JavaScript string cut inside an emoji). The SDK
        # refused it as a parse error without the id, and stdio clients
        # waited for an answer that never came.
        raise Invalid(
            "Text must be valid Unicode: a string holds half of a UTF-16 surrogate pair"
            " (an escape from \\ud800 to \\udfff without its other half).",
            rpc_code=INVALID_PARAMS,
            call_id=call_id,
        )
    if "method" in message:
        _check_request(message, call_id)
    else:
        _check_response(message, call_id)
    return message


# An escape of half a surrogate pair, which only a JSON body can carry.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_SURROGATE = re.compile("[\ud800-\udfff]")


def _holds_surrogate(value: Any) -> bool:
    """Whether a string in ``value``, a key included, holds a lone surrogate (a pair was
    joined into one character when parsed)."""
    if isinstance(value, str):
        return _SURROGATE.search(value) is not None
    if isinstance(value, dict):
        return any(_holds_surrogate(key) or _holds_surrogate(item) for key, item in value.items())
    if isinstance(value, list):
        return any(_holds_surrogate(item) for item in value)
    return False


def _check_request(message: dict[str, Any], call_id: Any) -> None:
    if not isinstance(message["method"], str) or not message["method"]:
        raise Invalid("method must be a non-empty string.", call_id=call_id)
    # MCP: a request id MUST NOT be null. The SDK's 2025-era transport took
    # one for a notification: 202, and the request never ran.
    if "id" in message and call_id is None:
        raise Invalid("id must be a string or an integer, not null (a notification has no id).")
    if "params" in message and not isinstance(message["params"], dict):
        raise Invalid("params must be a JSON object.", rpc_code=INVALID_PARAMS, call_id=call_id)


def _check_response(message: dict[str, Any], call_id: Any) -> None:
    """Refuse a response that is not one JSON-RPC 2.0 allows (section 5)."""
    has_result, has_error = "result" in message, "error" in message
    if not has_result and not has_error:
        raise Invalid("A JSON-RPC request needs a method.", call_id=call_id)
    if has_result and has_error:
        raise Invalid("A JSON-RPC response has a result or an error, not both.", call_id=call_id)
    # Only an error may answer a request whose id could not be read: with null.
    if "id" not in message or (has_result and call_id is None):
        raise Invalid("A JSON-RPC response needs the id of the request it answers.")
    if has_result and not isinstance(message["result"], dict):
        raise Invalid("result must be a JSON object.", call_id=call_id)
    error = message.get("error")
    if has_error and not (
        isinstance(error, dict)
        and _valid_code(error.get("code"))
        and isinstance(error.get("message"), str)
    ):
        raise Invalid(
            "error must be an object with an integer code and a string message.",
            call_id=call_id,
        )


def _valid_id(value: object) -> bool:
    return isinstance(value, str | int) and not isinstance(value, bool)


def _valid_code(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _usable_id(value: object) -> Any:
    """``value`` if a response can carry it back, else None: an id of the wrong type, or a
    string that is no text (it holds half of a surrogate pair, which echoed would make the
    refusal itself undecodable to a strict client)."""
    if not _valid_id(value) or (isinstance(value, str) and _SURROGATE.search(value)):
        return None
    return value


def call_id(message: dict[str, Any]) -> Any:
    return _usable_id(message.get("id"))


# Every version the SDK serves: the initialize handshake's, then the 2026-era ones.
SUPPORTED_VERSIONS = (*HANDSHAKE_PROTOCOL_VERSIONS, *MODERN_PROTOCOL_VERSIONS)


def check_version(header: str | None, message: dict[str, Any]) -> None:
    """Refuse a 2025-era request whose ``MCP-Protocol-Version`` header is not a version we speak.

    The SDK hands an unknown header to its 2026-era entry, whose refusal says
    ``params._meta`` lacks the 2026-era envelope: true, and no help to a client
    that never sends one. A request carrying that envelope (the SDK words
    this case itself), a notification and a response are left to the SDK.
    """
    if header is None or header in SUPPORTED_VERSIONS:
        return
    if "method" not in message or "id" not in message:
        return
    params = message.get("params")
    meta = params.get("_meta") if isinstance(params, dict) else None
    if isinstance(meta, dict) and PROTOCOL_VERSION_META_KEY in meta:
        return
    # The header's value stays out of the message: it is the client's text.
    raise Invalid(
        "Unsupported protocol version in the MCP-Protocol-Version header: "
        f"this server supports {', '.join(SUPPORTED_VERSIONS)}.",
        rpc_code=UNSUPPORTED_PROTOCOL_VERSION,
        call_id=message["id"],
        data={"supported": list(SUPPORTED_VERSIONS), "requested": header},
    )


# One wording for each refusal of a request's media types, whichever layer
# refuses it: the gate (Content-Type), the SDK's two transports (Accept).
NOT_ACCEPTABLE = "Not acceptable: send Accept: application/json, text/event-stream."
UNSUPPORTED_MEDIA_TYPE = "Unsupported media type: send Content-Type: application/json."
UNSUPPORTED_ENCODING = "Unsupported content encoding: send the body uncompressed."

# Refusals the SDK words acceptably keep their message; anything that could be
# library output is replaced by the generic message for its JSON-RPC code.
_GENERIC = {
    PARSE_ERROR: "Parse error: the body is not valid JSON.",
    INVALID_REQUEST: "Invalid request: send one JSON-RPC 2.0 message as application/json.",
    INVALID_PARAMS: "Invalid request parameters.",
}
_BY_STATUS = {
    400: "Bad request: send one JSON-RPC 2.0 message as application/json.",
    404: "Not found.",
    406: NOT_ACCEPTABLE,
    415: UNSUPPORTED_MEDIA_TYPE,
}
# Statuses whose refusal has one wording, whatever the SDK's message says.
_WORDED = (406, 415)
_LIBRARY_MARKS = ("pydantic", "input_value", "input_type", "http://", "https://", "Traceback")


def clean_message(message: object, rpc_code: int) -> str:
    text = message if isinstance(message, str) else ""
    plain = (
        text
        and rpc_code != PARSE_ERROR
        and len(text) <= 200
        and "\n" not in text
        and not any(mark in text for mark in _LIBRARY_MARKS)
    )
    return text if plain else _GENERIC.get(rpc_code, "Invalid request.")


_LEVELS = "debug, info, notice, warning, error, critical, alert or emergency"
# What each method's params hold, for a refusal of them: the SDK says only
# "Invalid request parameters".
_PARAMS_TAKEN = {
    "initialize": "protocolVersion, capabilities and clientInfo ({name, version})",
    "completion/complete": "ref and argument ({name, value})",
    "logging/setLevel": f"level: {_LEVELS}",
    "resources/read": "uri",
    "resources/subscribe": "uri",
    "resources/unsubscribe": "uri",
    "prompts/get": "name",
    "tools/call": "name and arguments",
}
# What each key of params._meta the SDK reads must hold, for a refusal that names it.
_META_TAKES = {
    PROTOCOL_VERSION_META_KEY: "text: the protocol version",
    CLIENT_CAPABILITIES_META_KEY: "an object: the client's capabilities, each an object",
    CLIENT_INFO_META_KEY: "an object with the client's name and version, as text",
    LOG_LEVEL_META_KEY: f"one of {_LEVELS}",
    "progressToken": "a string or an integer",
}
# The 2026-era headers that must repeat the body, and what each repeats.
_REPEATED = {
    b"mcp-protocol-version": "MCP-Protocol-Version: the protocol version in params._meta",
    b"mcp-method": "Mcp-Method: the request's method",
    b"mcp-name": "Mcp-Name: the tool's name, on a tools/call",
}
# A successful status's body is read for an error only when this small.
_SMALL = 4096


class Clean:
    """Wrap ``send`` so that every error response the SDK starts is rewritten in our shape.

    Successful responses pass through untouched and unbuffered; an error
    response (status 400 and up) is small, so it is held until complete, then
    sent as a JSON-RPC error body carrying ``{"error": {"code", "message"}}``
    (with a -32022's ``supported`` and ``requested`` beside it). The 2025-era
    transport answers some refusals with status 200 (params it cannot read, a
    method it does not serve): a small JSON body that holds an ``error`` is
    rewritten the same way, its status kept.

    ``request`` (the parsed message) and ``headers`` (the request's) let a
    refusal name the method and the header it is about.
    """

    def __init__(
        self,
        send: Send,
        request: Mapping[str, Any] | None = None,
        headers: Iterable[tuple[bytes, bytes]] = (),
    ) -> None:
        self.send = send
        self.request = request or {}
        self.headers = headers  # read only for a refusal, never on an answer
        self.held: Mapping[str, Any] | None = None
        self.chunks: list[bytes] = []
        self.ok: Mapping[str, Any] | None = None

    async def __call__(self, message: Mapping[str, Any]) -> None:
        if message["type"] == "http.response.start":
            if message.get("status", 200) >= 400:
                self.held = message
                return
            if _is_json(message):
                self.ok = message  # sent with its first body chunk
                return
        if self.ok is not None and message["type"] == "http.response.body":
            await self._send_ok(message)
            return
        if self.held is None or message["type"] != "http.response.body":
            await self.send(message)
            return
        self.chunks.append(message.get("body", b""))
        if message.get("more_body"):
            return
        await self._send_clean()

    async def _send_ok(self, message: Mapping[str, Any]) -> None:
        start, self.ok = self.ok, None
        assert start is not None
        raw = message.get("body", b"")
        if message.get("more_body") or len(raw) > _SMALL or b'"error"' not in raw:
            await self.send(start)
            await self.send(message)
            return
        self.held, self.chunks = start, [raw]
        await self._send_clean()

    async def _send_clean(self) -> None:
        assert self.held is not None
        status = self.held["status"]
        raw = b"".join(self.chunks)
        try:
            sent = safejson.loads(raw)
        except ValueError:
            sent = None
        method = self.request.get("method")
        names = {name.lower() for name, _ in self.headers}
        params = self.request.get("params")
        ours = error_body(sent, method, names, status, params) if isinstance(sent, dict) else None
        if status in _WORDED:
            # As the gate words its own 415: the same code, message and body.
            rid = call_id(sent) if isinstance(sent, dict) else None
            body = refusal("validation_failed", _BY_STATUS[status], rid)
        elif ours is not None:
            body = ours
        elif status < 400:
            await self.send(self.held)
            await self.send({"type": "http.response.body", "body": raw})
            return
        else:
            text = _BY_STATUS.get(status, "Request refused.")
            body = refusal("validation_failed", text, None, INVALID_REQUEST)
        payload = json.dumps(body).encode()
        kept = [
            (name, value)
            for name, value in self.held.get("headers", [])
            if name.lower() not in (b"content-type", b"content-length")
        ]
        await self.send(
            {
                **self.held,
                "headers": [
                    *kept,
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(payload)).encode()),
                ],
            }
        )
        await self.send({"type": "http.response.body", "body": payload})


# The SDK's two refusals of a 2026-era request without its envelope.
_ENVELOPE = ("params._meta must be an object", "params._meta is missing")
ENVELOPE_MISSING = (
    "Invalid params: with this protocol version every request carries params._meta"
    f" holding {PROTOCOL_VERSION_META_KEY} and {CLIENT_CAPABILITIES_META_KEY}."
)


def reworded(
    rpc_code: int,
    message: object,
    method: object = None,
    headers: Iterable[bytes] = (),
    params: object = None,
) -> str:
    """The SDK's refusal of a ``method`` request in our words: the method it is about, what
    its params take (or the value of their ``_meta`` that is wrong), the header it lacks (of
    the request's ``headers``, by lowercase name)."""
    named = wording.quoted_name(method) if isinstance(method, str) else None
    if rpc_code == INVALID_PARAMS and message == "Invalid request parameters" and named:
        taken = _PARAMS_TAKEN.get(str(method))
        fault = meta_fault(str(method), params)
        return fault or f"Invalid params for {named}" + (f": it takes {taken}." if taken else ".")
    if rpc_code == INVALID_PARAMS and isinstance(message, str) and message.startswith(_ENVELOPE):
        return ENVELOPE_MISSING
    if rpc_code == METHOD_NOT_FOUND and message == "Method not found" and named:
        return f"Method not found: {named} is not a method this server serves."
    if rpc_code == HEADER_MISMATCH and isinstance(message, str):
        for header, repeats in _REPEATED.items():
            if not message.lower().startswith(header.decode() + " "):
                continue
            shown, what = repeats.split(": ", 1)
            if header not in headers:
                return (
                    f"The {shown} header is missing: with this protocol version every "
                    f"request sends it, holding {what}."
                )
            return f"The {shown} header does not match the body: it must hold {what}."
    return clean_message(message, rpc_code)


def meta_fault(method: str, params: object) -> str | None:
    """Which value of ``params._meta`` the SDK refused a ``method`` request's params for, in
    our words; None when the fault is elsewhere (or the SDK's schema finds none).

    The SDK says only "Invalid request parameters", which our wording turns into what the
    params take: name and arguments, of a call that held both. Its own schema, at the
    request's protocol version, finds the key. Only keys the schema names are named: a
    value is never quoted back.
    """
    if not isinstance(params, dict) or params.get("_meta") is None:
        return None
    meta = params["_meta"]
    version = meta.get(PROTOCOL_VERSION_META_KEY) if isinstance(meta, dict) else None
    if version not in MODERN_PROTOCOL_VERSIONS:
        version = LATEST_HANDSHAKE_VERSION  # every 2025-era version reads params alike
    try:
        mcp_methods.validate_client_request(method, str(version), params)
    except ValidationError as invalid:
        faults = [e["loc"][2:] for e in invalid.errors() if e["loc"][:2] == ("params", "_meta")]
    except (KeyError, ValueError):  # a method or version the schema does not hold
        return None
    else:
        return None
    if not faults:
        return None
    if not faults[0]:
        return "Invalid params: params._meta must be an object."
    takes = _META_TAKES.get(str(faults[0][0]))
    if takes is None:
        return "Invalid params: a value in params._meta is not of the type MCP defines for it."
    return f"Invalid params: {faults[0][0]} in params._meta must be {takes}."


def error_body(
    sent: dict[str, Any],
    method: object = None,
    headers: Iterable[bytes] = (),
    status: int | None = None,
    params: object = None,
) -> dict[str, Any] | None:
    """``sent``, a JSON-RPC error the SDK wrote, in our shape (a -32022 keeps the versions
    it names); None if it is not one. ``params`` are the request's, read to name a value of
    their ``_meta`` the SDK refused."""
    error = sent.get("error")
    if not isinstance(error, dict) or not isinstance(error.get("code"), int):
        return None
    rpc_code = error["code"]
    text = reworded(rpc_code, error.get("message"), method, headers, params)
    versions = _negotiation(rpc_code, error.get("data"))
    code = _our_code(rpc_code, error.get("data"), status)
    return refusal(code, text, call_id(sent), rpc_code, versions)


# JSON-RPC codes that say the request was at fault; any other is the server's.
_THE_CALLERS = (
    PARSE_ERROR,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    INVALID_PARAMS,
    HEADER_MISMATCH,
    MISSING_CAPABILITY,
    UNSUPPORTED_PROTOCOL_VERSION,
)
# HTTP statuses the SDK refuses with that say more than their JSON-RPC code:
# too many sessions (-32603), no such session or one stream only (-32600).
_BY_HTTP_STATUS = {503: "unavailable", 404: "not_found", 409: "conflict"}


def _our_code(rpc_code: int, data: object, status: int | None = None) -> str:
    """The error code of ours for an SDK refusal: its own if it carries one of ours, else
    what its HTTP status says (``_BY_HTTP_STATUS``), else validation_failed for the caller's
    mistakes and internal_error for the server's (-32603, a fast path's 0), so that a
    client retries a fault of ours and not its own."""
    given = data.get("error") if isinstance(data, dict) else None
    code = given.get("code") if isinstance(given, dict) else None
    if isinstance(code, str) and code in errors.CODES:
        return code
    # A 2026-era method the server lacks is a 404 too: no memory or job is missing.
    if status in _BY_HTTP_STATUS and rpc_code != METHOD_NOT_FOUND:
        return _BY_HTTP_STATUS[status]
    return "validation_failed" if rpc_code in _THE_CALLERS else "internal_error"


def _is_json(start: Mapping[str, Any]) -> bool:
    for name, value in start.get("headers", []):
        if name.lower() == b"content-type":
            return is_json(bytes(value).decode("latin-1"))
    return False


def is_json(content_type: str | None) -> bool:
    """Whether a Content-Type header names JSON, whatever its parameters."""
    media_type = (content_type or "").split(";", 1)[0].strip().lower()
    return media_type == "application/json"


def _negotiation(rpc_code: int, data: object) -> dict[str, Any] | None:
    """The versions an SDK refusal names, which clients read to retry at one both speak."""
    if rpc_code != UNSUPPORTED_PROTOCOL_VERSION or not isinstance(data, dict):
        return None
    supported, requested = data.get("supported"), data.get("requested")
    if not isinstance(requested, str) or not isinstance(supported, list):
        return None
    if not all(isinstance(version, str) for version in supported):
        return None
    return {"supported": supported, "requested": requested}
