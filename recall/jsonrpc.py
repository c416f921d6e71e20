"""JSON-RPC envelopes at /mcp: what the gate accepts, and every refusal's body.

The gate parses each body once (``parse``) and refuses, in its own words,
anything that is not a single JSON-RPC 2.0 message (``problem``): the SDK's
own refusals quote pydantic's validation dump (union member names, the
echoed input, the pydantic version and a URL). ``Clean`` rewrites whatever
error the SDK still answers with (a wrong ``Accept``, a string pydantic-core
refuses that Python's parser takes) into the same shape, so no library text
and no plain-text body ever reaches a client.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from core import errors, safejson

Send = Callable[[Mapping[str, Any]], Awaitable[None]]

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
INVALID_PARAMS = -32602
# Refusals by the gate, outside the SDK's own codes.
RPC_UNAUTHORIZED = -32050
RPC_RATE_LIMITED = -32051
RPC_REFUSED = -32052
RPC_UNAVAILABLE = -32053


class Invalid(Exception):
    """A body the gate refuses with 400: a JSON-RPC code and a message for the caller."""

    def __init__(self, message: str, *, rpc_code: int = INVALID_REQUEST, call_id: Any = None):
        super().__init__(message)
        self.message = message
        self.rpc_code = rpc_code
        self.call_id = call_id

    def body(self) -> dict[str, Any]:
        return refusal("validation_failed", self.message, self.call_id, self.rpc_code)


def refusal(
    code: str, message: str, call_id: Any = None, rpc_code: int = RPC_REFUSED
) -> dict[str, Any]:
    """A JSON-RPC error body, so MCP clients surface the message, carrying our error shape."""
    return {
        "jsonrpc": "2.0",
        "id": call_id,
        "error": {
            "code": rpc_code,
            "message": message,
            "data": errors.body(code, message),
        },
    }


def parse(body: bytes) -> dict[str, Any]:
    """Return the one JSON-RPC message in ``body``, or raise ``Invalid`` saying what is wrong."""
    try:
        message = safejson.loads(body)
    except ValueError:
        raise Invalid(
            "Parse error: the body is not valid JSON (or is nested too deeply).",
            rpc_code=PARSE_ERROR,
        ) from None
    if isinstance(message, list):
        raise Invalid("Batches are not supported: send one JSON-RPC message per request.")
    if not isinstance(message, dict):
        raise Invalid("The body must be a JSON-RPC 2.0 message: a JSON object.")
    call_id = message.get("id")
    if not _valid_id(call_id):
        raise Invalid("id must be a string or an integer.")
    if message.get("jsonrpc") != "2.0":
        raise Invalid('jsonrpc must be "2.0".', call_id=call_id)
    if "method" in message:
        if not isinstance(message["method"], str) or not message["method"]:
            raise Invalid("method must be a non-empty string.", call_id=call_id)
        if "params" in message and not isinstance(message["params"], dict):
            raise Invalid("params must be a JSON object.", rpc_code=INVALID_PARAMS, call_id=call_id)
    elif "result" not in message and "error" not in message:
        raise Invalid("A JSON-RPC request needs a method.", call_id=call_id)
    return message


def _valid_id(value: object) -> bool:
    return value is None or (isinstance(value, str | int) and not isinstance(value, bool))


def call_id(message: dict[str, Any]) -> Any:
    value = message.get("id")
    return value if _valid_id(value) else None


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
    406: "Not acceptable: accept application/json.",
    415: "Unsupported media type: send Content-Type: application/json.",
}
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


class Clean:
    """Wrap ``send`` so that every error response the SDK starts is rewritten in our shape.

    Successful responses pass through untouched and unbuffered; an error
    response (status 400 and up) is small, so it is held until complete, then
    sent as a JSON-RPC error body carrying ``{"error": {"code", "message"}}``.
    """

    def __init__(self, send: Send) -> None:
        self.send = send
        self.held: Mapping[str, Any] | None = None
        self.chunks: list[bytes] = []

    async def __call__(self, message: Mapping[str, Any]) -> None:
        if message["type"] == "http.response.start" and message.get("status", 200) >= 400:
            self.held = message
            return
        if self.held is None or message["type"] != "http.response.body":
            await self.send(message)
            return
        self.chunks.append(message.get("body", b""))
        if message.get("more_body"):
            return
        await self._send_clean()

    async def _send_clean(self) -> None:
        assert self.held is not None
        status = self.held["status"]
        raw = b"".join(self.chunks)
        try:
            sent = safejson.loads(raw)
        except ValueError:
            sent = None
        error = sent.get("error") if isinstance(sent, dict) else None
        if isinstance(error, dict) and isinstance(error.get("code"), int):
            rpc_code = error["code"]
            text = clean_message(error.get("message"), rpc_code)
            body = refusal("validation_failed", text, call_id(sent), rpc_code)
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
