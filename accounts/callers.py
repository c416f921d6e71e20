"""Who a request acts for, and where the request's handlers find it.

``current`` carries the authenticated caller from the HTTP gate (or the
stdio runner) to the tools; ``accounts/auth.py`` finds the caller.
"""

from __future__ import annotations

import uuid
from contextvars import ContextVar
from dataclasses import dataclass


@dataclass(frozen=True)
class AuthContext:
    """Who a request acts for: a user, through an API key or an OAuth connection.

    ``agent_id`` is set when the caller acts as one of the user's agents (an
    agent-scoped key, or any OAuth connection); every service call then runs
    with that agent's row-level security.
    """

    user_id: uuid.UUID
    api_key_id: uuid.UUID | None
    tier: str
    agent_id: uuid.UUID | None = None
    # The OAuth connection (token family) the caller came through, if any.
    connection_id: uuid.UUID | None = None

    @property
    def rate_key(self) -> str:
        """The token bucket this caller draws from: its key's, or its connection's.

        A token outside any connection (one issued without a refresh token)
        draws from its agent's bucket, never from one shared with strangers.
        """
        if self.api_key_id is not None:
            return f"key:{self.api_key_id}"
        if self.connection_id is not None:
            return f"connection:{self.connection_id}"
        return f"agent:{self.agent_id}" if self.agent_id else f"user:{self.user_id}"


current: ContextVar[AuthContext | None] = ContextVar("recall_auth", default=None)
