"""Keys and rate limits over stdio: the admission ``recall stdio`` installs before the tools.

Over HTTP the gate authenticates and admits every tool call before the
server sees it (``recall/asgi.py``); a stdio process has no gate, so
``recall/stdio.py`` installs this middleware on its server instead. Each
call checks the process's key again, as each HTTP request does: a key
revoked since the process started is refused (``unauthorized``), and a
tier changed since applies to the call. Then it asks the same
``accounts.admission`` rule, and refuses a call the key's rate limit does
not admit with the catalogue's own error result, recording the refusal's
usage event, before the call is logged or run.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.mcpserver import MCPServer

from accounts import admission, auth
from core import context, errors, usage
from core.errors import Unauthorized, Unavailable
from memories.mcp import server as servers
from memories.mcp.runtime import Shape

logger = logging.getLogger(__name__)

REVOKED = (
    "The API key this process acts as (RECALL_API_KEY) is no longer live: it was revoked,"
    " or its user was removed. Set a live key in the client's configuration and restart it."
)
OUTAGE = "The database cannot be reached to check this process's API key; nothing was run."


def install(server: MCPServer, failure: Shape, raw_key: str) -> None:
    """Check the key and admit ``server``'s tool calls by its rate limit, ahead of
    observing them."""
    told = threading.Event()

    async def admit_stdio_calls(
        ctx: ServerRequestContext[Any, Any], call_next: CallNext
    ) -> HandlerResult:
        if ctx.method != "tools/call" or auth.current.get() is None:
            return await call_next(ctx)
        try:
            caller = await auth.aauthenticate(raw_key)
        except Exception as exc:
            if not errors.is_outage(exc):
                raise
            return servers.error_result(ctx, Unavailable(OUTAGE), failure)
        if caller is None:
            if not told.is_set():
                told.set()
                logger.warning("stdio: the API key this process acts as is no longer live")
            return servers.error_result(ctx, Unauthorized(REVOKED), failure)
        # Each stdio call gets its request id here, which the observer keeps.
        rid_token = None
        if not context.request_id.get():
            rid_token = context.request_id.set(context.new_request_id())
        caller_token = auth.current.set(caller)
        try:
            tool = usage.tool_label((ctx.params or {}).get("name"), servers.tool_names(server))
            admitted = await admission.aadmit(
                caller, tool=tool, request_id=context.request_id.get()
            )
            if admitted.error is None:
                return await call_next(ctx)
            if admitted.event is not None:
                usage.record(admitted.event)
            return servers.error_result(ctx, admitted.error, failure)
        finally:
            auth.current.reset(caller_token)
            if rid_token is not None:
                context.request_id.reset(rid_token)

    chain = server.middleware
    # Just outside observe_tool_calls: a refused call is neither logged nor run.
    chain.insert(chain.index(servers.observer(server)), admit_stdio_calls)
