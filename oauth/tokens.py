"""Access tokens on the resource side: who a bearer token acts for, and for which endpoint.

``Verifier`` is the MCP SDK's ``TokenVerifier`` for one of Recall's protected
resources. It finds the token by its SHA-256 (tokens are stored hashed),
refuses it when it is unknown, revoked (revocation deletes access tokens),
expired or its user is inactive, and reports the resource the token is
bound to, so that the SDK's ``BearerAuthBackend`` refuses a token issued for
another resource. The caller it describes is the token's user acting as the
token's agent.
"""

from __future__ import annotations

import hashlib
import uuid
from dataclasses import dataclass

from django.utils import timezone
from mcp.server.auth.provider import AccessToken as VerifiedToken

from accounts.auth import AuthContext
from core import offloop
from oauth import resources
from oauth.models import AccessToken

# Our tokens are the toolkit's: random URL-safe strings. Anything longer is not one.
MAX_TOKEN_LENGTH = 255


@dataclass(frozen=True)
class Bearer:
    """What the database says about a live access token."""

    user_id: uuid.UUID
    tier: str
    agent_id: uuid.UUID | None
    client_id: str
    scopes: list[str]
    expires_at: int
    resources: list[str]


def look_up(raw: str) -> Bearer | None:
    """Return the live token ``raw``, or None (unknown, revoked, expired, or its user inactive)."""
    if not raw or len(raw) > MAX_TOKEN_LENGTH:
        return None
    checksum = hashlib.sha256(raw.encode("utf-8")).hexdigest()
    token = (
        AccessToken.objects.select_related("user", "application")
        .filter(token_checksum=checksum)
        .first()
    )
    if token is None or token.expires <= timezone.now():
        return None
    # Only the consent page mints tokens for the MCP endpoints, always for a
    # user and an agent. A registration's access token (RFC 7592) has neither.
    if token.user is None or token.agent_id is None or not token.user.is_active:
        return None
    return Bearer(
        user_id=token.user_id,
        tier=token.user.tier,
        agent_id=token.agent_id,
        client_id=token.application.client_id,
        scopes=token.scope.split(),
        expires_at=int(token.expires.timestamp()),
        resources=list(token.resource or []),
    )


class Verifier:
    """The MCP SDK's ``TokenVerifier`` for the endpoint at ``path``."""

    def __init__(self, path: str) -> None:
        self.path = path

    async def verify_token(self, token: str) -> VerifiedToken | None:
        bearer = await offloop.run(look_up, token)
        if bearer is None:
            return None
        mine = resources.identifier(self.path)
        bound = [uri for uri in bearer.resources if resources.same(uri, mine)]
        # A token bound to no resource is bound to none of ours: it is refused
        # as surely as one bound to another endpoint.
        resource = mine if bound else (bearer.resources[0] if bearer.resources else None)
        return VerifiedToken(
            token=token,
            client_id=bearer.client_id,
            scopes=bearer.scopes,
            expires_at=bearer.expires_at,
            resource=resource,
            subject=str(bearer.user_id),
            claims={"tier": bearer.tier, "agent_id": str(bearer.agent_id)},
        )


def caller(verified: VerifiedToken) -> AuthContext:
    """Return the ``AuthContext`` a verified token acts as."""
    claims = verified.claims or {}
    return AuthContext(
        user_id=uuid.UUID(str(verified.subject)),
        api_key_id=None,
        tier=str(claims["tier"]),
        agent_id=uuid.UUID(str(claims["agent_id"])),
    )
