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

    @property
    def rate_key(self) -> str:
        """The token bucket this caller draws from: its key's, or its user's OAuth bucket.

        Every OAuth connection of a user shares one bucket, whatever client,
        agent, approval or refresh its token came from. Registration is open
        and a user may approve as many connections as they like, so a bucket
        per token, connection, client or agent would multiply the tier's rate
        without bound. A key made to replace a revoked one starts with a full
        bucket of its own, so a key's calls also draw from ``ceiling_key``.

        One bucket per tier, as the ceiling's: a user who upgrades because
        their bucket ran dry gets the new tier's full allowance at once, not
        the empty bucket refilling at the new rate.
        """
        if self.api_key_id is not None:
            return f"key:{self.api_key_id}:{self.tier}"
        return f"oauth:{self.user_id}:{self.tier}"

    @property
    def ceiling_key(self) -> str | None:
        """The bucket all of a user's keys of this tier draw from too, or None (OAuth).

        Its capacity and rate are ``MAX_KEYS_PER_USER`` times the tier's: as
        many allowances as the user may hold live keys. Live keys alone never
        exhaust it, but revoked keys' calls stay counted in it, so revoking
        and creating keys in a loop buys nothing beyond that. One bucket per
        tier, because a bucket keeps one capacity and rate: a user whose keys
        have several tiers gets that bound for each of them.
        """
        if self.api_key_id is None:
            return None
        return f"keys:{self.user_id}:{self.tier}"


current: ContextVar[AuthContext | None] = ContextVar("recall_auth", default=None)
