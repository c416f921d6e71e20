"""Connections: what a user has authorized, as the dashboard's Connected apps page shows it.

A connection is one approval on the consent page: one client, acting as one
of the user's agents, holding one chain of rotated refresh tokens (the
toolkit's token family). Revoking it revokes the whole family and deletes
its access tokens, so the resource refuses them at once: nothing caches an
OAuth token.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from urllib.parse import urlsplit

from django.db.models import Max, Min

from accounts import services as accounts_services
from core.errors import NotFound
from oauth.models import Application, RefreshToken


def find_application(*, client_id: str) -> Application | None:
    """Return the registered client with this id, or None."""
    return Application.objects.filter(client_id=client_id).first()


@dataclass(frozen=True)
class Connection:
    id: uuid.UUID
    client_name: str
    client_origin: str
    registration: str
    agent_id: uuid.UUID | None
    agent_name: str
    connected_at: datetime
    last_refreshed_at: datetime


def describe_client(application: Application) -> tuple[str, str, str]:
    """Return a client's name, where it came from, and how it registered, for people to read.

    A metadata-document client came from its document's host; a dynamically
    registered one is known only by where it asked to be sent back.
    """
    if application.registration_source == Application.RegistrationSource.CIMD:
        return (
            application.name or urlsplit(application.client_id).hostname or "Unnamed client",
            urlsplit(application.client_id).netloc,
            "metadata document",
        )
    redirects = application.redirect_uris.split()
    origin = urlsplit(redirects[0]).netloc if redirects else ""
    how = (
        "dynamic registration"
        if application.registration_source == Application.RegistrationSource.DCR
        else "registered by an operator"
    )
    return application.name or "Unnamed client", origin, how


def list_connections(*, user_id: uuid.UUID | str) -> list[Connection]:
    """Return the user's live connections, most recently connected first."""
    live = (
        RefreshToken.objects.filter(user_id=user_id, revoked__isnull=True)
        .exclude(token_family__isnull=True)
        .select_related("application")
    )
    families = {token.token_family: token for token in live}
    if not families:
        return []
    spans = {
        row["token_family"]: (row["first"], row["last"])
        for row in RefreshToken.objects.filter(user_id=user_id, token_family__in=families)
        .values("token_family")
        .annotate(first=Min("created"), last=Max("created"))
    }
    agents = {agent.id: agent.name for agent in accounts_services.list_agents(user_id=user_id)}
    connections = []
    for family, token in families.items():
        name, origin, how = describe_client(token.application)
        first, last = spans[family]
        connections.append(
            Connection(
                id=family,
                client_name=name,
                client_origin=origin,
                registration=how,
                agent_id=token.agent_id,
                agent_name=agents.get(token.agent_id, "") if token.agent_id else "",
                connected_at=first,
                last_refreshed_at=last,
            )
        )
    return sorted(connections, key=lambda c: c.connected_at, reverse=True)


def revoke_connection(*, user_id: uuid.UUID | str, connection_id: uuid.UUID | str) -> None:
    """End a connection: its refresh tokens are revoked and its access tokens deleted."""
    try:
        family = uuid.UUID(str(connection_id))
    except ValueError:
        raise NotFound("No such connection.") from None
    if not RefreshToken.objects.filter(
        user_id=user_id, token_family=family, revoked__isnull=True
    ).exists():
        raise NotFound("No such connection.")
    RefreshToken.revoke_family(family)
