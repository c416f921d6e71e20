"""Per-request values that travel with the request into worker threads.

The HTTP gate sets them before handing a request to the MCP server; anyio
and the SDK carry context variables into the tasks and threads they start.
The authenticated caller travels the same way, in ``accounts.auth.current``.
"""

from __future__ import annotations

import re
import uuid
from contextvars import ContextVar

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
