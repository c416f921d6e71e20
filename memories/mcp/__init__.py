"""The MCP face of memories: three tool catalogues on one server factory and runtime.

* ``server``: builds each endpoint's server and the middleware every call
  passes through (arguments checked once, logs, usage events);
* ``runtime``: the ``@tool`` decorator every tool body runs under, and the
  result and error shapes;
* ``arguments``: the argument types the catalogues share;
* ``tools`` (``/mcp``), ``agent_tools`` (``/agent/mcp``, seed 003) and
  ``v1_tools`` (``/v1/mcp``, seed 001): adapters from a tool's arguments to
  ``memories.services`` and back;
* ``stdio``: the rate-limit admission ``recall stdio`` installs, where no
  HTTP gate stands in front of the tools.
"""

from __future__ import annotations

from memories.mcp.server import (
    INSTRUCTIONS,
    build_agent_server,
    build_server,
    build_v1_server,
    withdraw_unserved_capabilities,
)

__all__ = [
    "INSTRUCTIONS",
    "build_agent_server",
    "build_server",
    "build_v1_server",
    "withdraw_unserved_capabilities",
]
