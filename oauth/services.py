"""Clients and connections, as the consent page and the Connected apps page show them.

A connection is one approval on the consent page: one client, acting as one
of the user's agents, holding one chain of rotated refresh tokens (the
toolkit's token family). Revoking it revokes the whole family and deletes
its access tokens, so the resource refuses them at once: nothing caches an
OAuth token.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.db.models import Max, Min, Q, QuerySet
from django.utils import timezone

from accounts import services as accounts_services
from accounts.models import Agent
from core import storable
from core.errors import NotFound
from oauth.models import AccessToken, Application, Grant, RefreshToken
from oauth.resources import same as same_resource

# Each kind is deleted this many rows at a time, each batch its own statement.
CLEAR_BATCH = 1000


def clear_expired(*, now: datetime | None = None) -> dict[str, int]:
    """Delete the codes and tokens no request can use any more; how many of each.

    * Authorization codes past their expiry, spent or not (a spent one is kept
      until then: its second use revokes what the first issued).
    * Refresh tokens whose access token expired a refresh token's lifetime ago,
      and revoked ones a lifetime after their revocation: until then a replay
      of one must find it, to revoke its family. One whose access token was
      revoked alone (RFC 7009) goes at once: the toolkit refuses it.
    * Access tokens past their expiry that no refresh token holds (a refresh
      token whose access token is gone is refused, so those stay with it).

    And, first, the clients registered or fetched that nobody approved in a day.
    """
    moment = now or timezone.now()
    lifetime = timedelta(seconds=settings.OAUTH_REFRESH_TOKEN_TTL_SECONDS)
    delete_expired_registrations(now=moment)
    return {
        "codes": _in_batches(Grant.objects.filter(expires__lt=moment)),
        "refresh_tokens": _in_batches(
            RefreshToken.objects.filter(
                Q(revoked__lte=moment - lifetime)
                | Q(revoked__isnull=True, access_token__expires__lte=moment - lifetime)
                # Its access token revoked (RFC 7009): refused, and never a replay to catch.
                | Q(revoked__isnull=True, access_token__isnull=True)
            )
        ),
        "access_tokens": _in_batches(
            AccessToken.objects.filter(refresh_token__isnull=True, expires__lt=moment)
        ),
    }


def _in_batches(rows: QuerySet[Any]) -> int:
    total = 0
    while True:
        batch = list(rows.values_list("pk", flat=True)[:CLEAR_BATCH])
        if not batch:
            return total
        rows.model.objects.filter(pk__in=batch).delete()
        total += len(batch)
        if len(batch) < CLEAR_BATCH:
            return total


def find_application(*, client_id: str) -> Application | None:
    """Return the registered client with this id, or None (also for one no column holds:
    a NUL or a lone surrogate, as a sign-in's ``next`` may carry)."""
    if storable.problem(client_id) is not None:
        return None
    return Application.objects.filter(client_id=client_id).first()


def delete_expired_registrations(*, now: datetime) -> None:
    """Delete the dynamic registrations nobody approved in time."""
    Application.objects.expired_registrations(now).delete()


def registration_times(*, address: str | None, since: datetime) -> list[datetime]:
    """Return when ``address`` (None: an unknown address) registered clients since ``since``."""
    same: dict[str, object] = (
        {"registered_from": address} if address else {"registered_from__isnull": True}
    )
    return list(
        Application.objects.filter(
            registration_source=Application.RegistrationSource.DCR, created__gte=since, **same
        )
        .order_by("created")
        .values_list("created", flat=True)
    )


def note_registered_from(*, client_id: str, address: str | None) -> None:
    """Record the address a client registered from (its registrations are counted by it)."""
    Application.objects.filter(client_id=client_id).update(registered_from=address)


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


@dataclass(frozen=True)
class Client:
    """A client as people should read it: its name, where it came from, and how far that holds."""

    name: str
    origin: str
    registration: str
    # True when the name comes from a document at an https address the client
    # controls (a metadata document) or from an operator; False when the
    # client said it about itself when it registered.
    verified: bool


def describe_client(application: Application) -> Client:
    """Return a client's name, where it came from, and how it registered, for people to read.

    A metadata-document client came from its document's host; a dynamically
    registered one is known only by where it asked to be sent back.
    """
    name = " ".join((application.name or "").split())
    if application.registration_source == Application.RegistrationSource.CIMD:
        return Client(
            name=name or urlsplit(application.client_id).hostname or "Unnamed client",
            origin=urlsplit(application.client_id).netloc,
            registration="metadata document",
            verified=True,
        )
    redirects = application.redirect_uris.split()
    origin = ""
    if redirects:
        parts = urlsplit(redirects[0])
        origin = parts.netloc or f"{parts.scheme}:"
    dynamic = application.registration_source == Application.RegistrationSource.DCR
    return Client(
        name=name or "Unnamed client",
        origin=origin,
        registration="dynamic registration" if dynamic else "registered by an operator",
        verified=not dynamic,
    )


def agent_name_for(application: Application) -> str:
    """Return the name an agent for this client gets unless the user types another."""
    name = " ".join((application.name or "").split())
    if not name:
        name = describe_client(application).origin or "assistant"
    return name[: accounts_services.AGENT_NAME_MAX].strip()


def unused_agent_name(name: str, taken: Iterable[str]) -> str:
    """Return ``name``, or ``name 2``, ``name 3``... whichever no agent has (names ignore case)."""
    used = {other.lower() for other in taken}
    candidate, number = name, 1
    while candidate.lower() in used:
        number += 1
        suffix = f" {number}"
        candidate = name[: accounts_services.AGENT_NAME_MAX - len(suffix)].rstrip() + suffix
    return candidate


def connected_agents(
    *, user_id: uuid.UUID | str, application: Application, resources: Sequence[str] = ()
) -> list[Agent]:
    """Return the agents the user's live tokens for ``application`` act as, newest first.

    Tokens that act as no agent, or as one since deleted, count for none;
    with ``resources``, so do tokens not bound to every one of them (approving
    a client for /mcp is not approving it for /agent/mcp's tools).
    """
    agents = accounts_services.list_agents(user_id=user_id)
    return _connected(user_id, application, agents, resources)


def _connected(
    user_id: uuid.UUID | str,
    application: Application,
    agents: list[Agent],
    wanted: Sequence[str] = (),
) -> list[Agent]:
    tokens = (
        AccessToken.objects.filter(
            user_id=user_id,
            application=application,
            expires__gt=timezone.now(),
            agent_id__isnull=False,
        )
        .order_by("-created")
        .values_list("agent_id", "resource")
    )
    agent_ids = [
        agent_id
        for agent_id, bound in tokens
        if all(any(same_resource(uri, have) for have in bound or []) for uri in wanted)
    ]
    by_id = {agent.id: agent for agent in agents}
    return [by_id[agent_id] for agent_id in dict.fromkeys(agent_ids) if agent_id in by_id]


def trusted_client_agent(
    *, user_id: uuid.UUID | str, application: Application
) -> tuple[Agent, bool]:
    """Return the agent a client the operator trusts (no consent page) acts as, and if it is new.

    The agent of the user's newest live token for it, else what Allow alone
    picks on the consent page: the user's agent of the client's name, made
    if there is none.
    """
    agents = accounts_services.list_agents(user_id=user_id)
    connected = _connected(user_id, application, agents)
    if connected:
        return connected[0], False
    return accounts_services.agent_called(user_id=user_id, name=agent_name_for(application))


def mark_approved(*, client_id: str) -> None:
    """Record that a user approved the client: a dynamic registration then no longer expires."""
    Application.objects.filter(client_id=client_id, approved_at__isnull=True).update(
        approved_at=timezone.now()
    )


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
        client = describe_client(token.application)
        first, last = spans[family]
        connections.append(
            Connection(
                id=family,
                client_name=client.name,
                client_origin=client.origin,
                registration=client.registration,
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
