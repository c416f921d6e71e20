"""Per-request values that travel with the request into worker threads.

The HTTP gate sets them before handing a request to the MCP server; anyio
and the SDK carry context variables into the tasks and threads they start.
The authenticated caller travels the same way, in ``accounts.auth.current``.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

request_id: ContextVar[str] = ContextVar("recall_request_id", default="")

# Accepted from X-Request-ID as given; anything else is replaced, so that a
# client cannot inject text into log lines or usage rows.
_REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,64}")


def new_request_id(supplied: str | None = None) -> str:
    if supplied and _REQUEST_ID.fullmatch(supplied):
        return supplied
    return uuid.uuid4().hex


# "http" when the HTTP gate has already applied the rate limit, "stdio" when
# the MCP middleware must apply it itself.
transport: ContextVar[str] = ContextVar("recall_transport", default="http")


@dataclass(frozen=True)
class Actor:
    """Who is changing memories: the interface, and the API key when there is one.

    ``tenancy`` hands it to the database as transaction-local settings, and
    the history trigger writes it into every version row.
    """

    client: str  # mcp, v1, agent, stdio, dashboard, worker, import, admin, maintenance
    api_key_id: uuid.UUID | None = None


actor: ContextVar[Actor | None] = ContextVar("recall_actor", default=None)


@contextmanager
def acting_as(client: str, api_key_id: uuid.UUID | None = None) -> Iterator[Actor]:
    """Attribute the memory changes made inside the block to ``client`` (and key)."""
    who = Actor(client[:32], api_key_id)
    token = actor.set(who)
    try:
        yield who
    finally:
        actor.reset(token)
