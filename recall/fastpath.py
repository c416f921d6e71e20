"""Answer the requests agents send most without the SDK's per-request transport.

In stateless mode the MCP SDK serves every 2025-era POST by building a
transport, its memory streams, a task group and a JSON-RPC dispatcher, then
tearing them down: about 5 ms of the GIL per call, 43% of the server's
Python time under load (``BENCHMARKS.md``, "Where a request's time goes").
None of it is needed to answer one request with one JSON body.

``FastPath`` answers stateless ``tools/call``, ``tools/list`` and ``ping``
requests of both protocol generations by calling the SDK's own per-request
kernel (``serve_one``) on the same server, so the request runs through the
same middleware (``memories/mcp.py``: validation, logs, usage), the same tool
registry and the same pydantic models as on the SDK's path, and is shaped
for the wire by the same code:

* 2025-11-25 (or no ``MCP-Protocol-Version``): the envelope the SDK's JSON
  transport writes, ``JSONRPCResponse``/``JSONRPCError.model_dump_json(
  by_alias=True, exclude_unset=True)`` in a 200, errors mapped by the
  dispatcher's ladder (``handler_exception_to_error_data``, else code 0);
* 2026-07-28: the SDK's single-exchange entry, step for step, minus the
  request object, security middleware and body read the gate has done.

Anything else goes to the SDK: ``initialize`` and every other method,
notifications, responses, bodies either parser of the SDK would refuse,
unknown protocol versions, an ``Accept`` or ``Content-Type`` the SDK would
question, and modern requests its inbound ladder rejects. Whether a request
is taken is decided before anything is sent, so a refusal here costs only
the check. ``tests/test_fast_path.py`` sends the same requests, for every
tool of every MCP endpoint, through both paths and compares the bytes.

``MCP_FAST_PATH=false`` turns it off.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import pydantic_core
from mcp.server._streamable_http_modern import (
    _mcp_param_rejection,
    _SingleExchangeDispatchContext,
    _to_jsonrpc_response,
    _write,
)
from mcp.server.connection import Connection
from mcp.server.runner import serve_one
from mcp.server.streamable_http import check_accept_headers
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.shared.inbound import (
    InboundLadderRejection,
    classify_inbound_request,
    find_duplicated_routing_header,
)
from mcp.shared.jsonrpc_dispatcher import (
    handler_exception_to_error_data,
    progress_token_from_params,
)
from mcp.shared.message import ServerMessageMetadata
from mcp.shared.transport_context import TransportContext
from mcp_types import (
    DEFAULT_NEGOTIATED_VERSION,
    ErrorData,
    JSONRPCError,
    JSONRPCRequest,
    JSONRPCResponse,
    jsonrpc_message_adapter,
)
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS, MODERN_PROTOCOL_VERSIONS
from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import Response

from core.logging import describe_exception

logger = logging.getLogger("recall.mcp")

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Mapping[str, Any]], Awaitable[None]]

METHODS = frozenset({"tools/call", "tools/list", "ping"})
_LEGACY_TRANSPORT = TransportContext(kind="streamable-http", can_send_request=False)


class FastPath:
    """Answer eligible requests for one MCP server mounted in stateless JSON mode."""

    def __init__(self, sessions: StreamableHTTPSessionManager) -> None:
        if not (sessions.stateless and sessions.json_response):
            raise ValueError("the fast path serves stateless servers with JSON responses only")
        self.sessions = sessions

    async def answer(
        self, scope: Scope, receive: Receive, body: bytes, message: dict[str, Any], send: Send
    ) -> bool:
        """Answer the request and return True, or return False having sent nothing."""
        if message.get("method") not in METHODS or "id" not in message:
            return False
        request = Request(scope, receive)
        headers = request.headers
        # The one media type every check on the SDK's path accepts as it is.
        if headers.get("content-type", "").split(";", 1)[0].strip() != "application/json":
            return False
        if not check_accept_headers(request)[0]:
            return False
        version = headers.get("mcp-protocol-version")
        if version is None or version in HANDSHAKE_PROTOCOL_VERSIONS:
            return await self._legacy(scope, receive, request, body, version, send)
        if version in MODERN_PROTOCOL_VERSIONS:
            return await self._modern(scope, receive, request, body, send)
        return False

    async def _legacy(
        self,
        scope: Scope,
        receive: Receive,
        request: Request,
        body: bytes,
        version: str | None,
        send: Send,
    ) -> bool:
        # The SDK's JSON transport parses and classifies the body this way.
        try:
            parsed = jsonrpc_message_adapter.validate_python(
                pydantic_core.from_json(body), by_name=False
            )
        except (ValueError, ValidationError):
            return False
        if not isinstance(parsed, JSONRPCRequest) or parsed.method not in METHODS:
            return False
        # As the SDK's stateless entry: a born-ready connection at the
        # header's version, a request channel that cannot reach the client.
        connection = Connection.from_envelope(version or DEFAULT_NEGOTIATED_VERSION, None, None)
        context = _SingleExchangeDispatchContext(
            transport=_LEGACY_TRANSPORT,
            request_id=parsed.id,
            message_metadata=ServerMessageMetadata(request_context=request, can_send_request=False),
            progress_token=progress_token_from_params(parsed.params),
        )
        reply: JSONRPCResponse | JSONRPCError
        try:
            result = await serve_one(
                self.sessions.app,
                context,
                parsed.method,
                parsed.params,
                connection=connection,
                lifespan_state=self._lifespan_state(),
            )
            reply = JSONRPCResponse(jsonrpc="2.0", id=parsed.id, result=result)
        except Exception as exc:
            # The 2025-era dispatcher's ladder, code 0 included. memories/mcp.py's
            # contain_failures leaves only MCPError and ValidationError to reach it.
            error = handler_exception_to_error_data(exc)
            if error is None:
                logger.error("request failed", extra=describe_exception(exc))
                error = ErrorData(code=0, message=str(exc))
            reply = JSONRPCError(jsonrpc="2.0", id=parsed.id, error=error)
        response = Response(
            reply.model_dump_json(by_alias=True, exclude_unset=True),
            status_code=200,
            headers={"Content-Type": "application/json"},
        )
        await response(scope, receive, send)
        return True

    async def _modern(
        self, scope: Scope, receive: Receive, request: Request, body: bytes, send: Send
    ) -> bool:
        # The SDK's single-exchange entry, step for step; its refusals stay its own.
        try:
            decoded = json.loads(body)
            parsed = JSONRPCRequest.model_validate(decoded)
        except (ValueError, RecursionError, ValidationError):
            return False
        if find_duplicated_routing_header(request.headers.items()) is not None:
            return False
        verdict = classify_inbound_request(decoded, headers=dict(request.headers))
        if isinstance(verdict, InboundLadderRejection):
            return False
        lifespan_state = self._lifespan_state()
        server = self.sessions.app
        if await _mcp_param_rejection(server, request, parsed, verdict, lifespan_state) is not None:
            return False
        connection = Connection.from_envelope(
            verdict.protocol_version, verdict.client_info, verdict.client_capabilities
        )
        context = _SingleExchangeDispatchContext(
            transport=TransportContext(
                kind="streamable-http", can_send_request=False, headers=request.headers
            ),
            request_id=parsed.id,
            message_metadata=ServerMessageMetadata(request_context=request),
            progress_token=progress_token_from_params(parsed.params),
        )
        reply = await _to_jsonrpc_response(
            parsed.id,
            serve_one(
                server,
                context,
                parsed.method,
                parsed.params,
                connection=connection,
                lifespan_state=lifespan_state,
            ),
        )
        await _write(reply, scope, receive, send)
        return True

    def _lifespan_state(self) -> Any:
        # Entered once by the session manager's run(), as for its own requests.
        return self.sessions._lifespan_state
