"""Rate limits over stdio: the admission ``recall stdio`` installs in front of the tools.

Over HTTP the gate admits every tool call before the server sees it
(``recall/asgi.py``); a stdio process has no gate, so ``recall/stdio.py``
installs this middleware on its server instead. It asks the same
``accounts.admission`` rule, and refuses a call the key's rate limit does
not admit with the catalogue's own error result, recording the refusal's
usage event, before the call is logged or run.
"""

from __future__ import annotations

from typing import Any

from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.mcpserver import MCPServer

from accounts import admission, auth
from core import context, usage
from memories.mcp import server as servers
from memories.mcp.runtime import Shape


def install(server: MCPServer, failure: Shape) -> None:
    """Admit ``server``'s tool calls by the key's rate limit, ahead of observing them."""

    async def admit_stdio_calls(
        ctx: ServerRequestContext[Any, Any], call_next: CallNext
    ) -> HandlerResult:
        caller = auth.current.get()
        if ctx.method != "tools/call" or caller is None:
            return await call_next(ctx)
        # Each stdio call gets its request id here, which the observer keeps.
        rid_token = None
        if not context.request_id.get():
            rid_token = context.request_id.set(context.new_request_id())
        try:
            name = (ctx.params or {}).get("name")
            tool = name if isinstance(name, str) else ""
            admitted = await admission.aadmit(
                caller, tool=tool, request_id=context.request_id.get()
            )
            if admitted.error is None:
                return await call_next(ctx)
            if admitted.event is not None:
                usage.record(admitted.event)
            return servers.error_result(ctx, admitted.error, failure)
        finally:
            if rid_token is not None:
                context.request_id.reset(rid_token)

    chain = server.middleware
    # Just outside observe_tool_calls: a refused call is neither logged nor run.
    chain.insert(chain.index(servers.observer(server)), admit_stdio_calls)
