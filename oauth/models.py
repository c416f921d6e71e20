"""django-oauth-toolkit's models, swapped in so that every grant and token carries its agent.

Approving a connection binds it to one of the user's agents (the consent
page asks which). The authorization code, and every access and refresh token
issued from it or rotated from those, record that agent, so a token acts as
its agent and nothing else. Tokens are stored hashed (the toolkit's RFC 9700
token storage, see settings): the ``token`` columns stay empty and
``token_checksum`` holds a SHA-256.

The ``agent`` keys are enforced by the database with ON DELETE CASCADE
(migration 0002): deleting an agent ends its connections, even when the
delete comes from a tenant transaction that never loads these rows.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import Any

from django.db import models
from django.utils import timezone
from oauth2_provider import models as toolkit

from oauth import redirects

# A dynamically registered client that no user approves within this long is
# refused, then deleted at the next registration: open registration must not
# let anyone fill the table with clients nobody uses.
UNAPPROVED_REGISTRATION_LIFETIME = timedelta(days=1)


def _agent() -> models.ForeignKey:
    return models.ForeignKey(
        "accounts.Agent",
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        null=True,
        blank=True,
        related_name="+",
    )


class ApplicationManager(models.Manager["Application"]):
    def get_by_natural_key(self, client_id: str) -> Application:
        return self.get(client_id=client_id)

    def expired_registrations(self, now: datetime | None = None) -> models.QuerySet[Application]:
        """Dynamic registrations, and clients stored from a metadata document, that no
        user approved within a day of first being seen. A document's client is
        fetched again when next named (review146: they were kept for ever)."""
        cutoff = (now or timezone.now()) - UNAPPROVED_REGISTRATION_LIFETIME
        return self.filter(
            registration_source__in=(
                Application.RegistrationSource.DCR,
                Application.RegistrationSource.CIMD,
            ),
            approved_at__isnull=True,
            created__lt=cutoff,
        )


class Application(toolkit.AbstractApplication):
    # Where a dynamic registration came from, for the per-address limit.
    registered_from: models.GenericIPAddressField[str | None, str | None] = (
        models.GenericIPAddressField(null=True, blank=True)
    )
    # When a user first approved this client on the consent page.
    approved_at: models.DateTimeField[datetime | None, datetime | None] = models.DateTimeField(
        null=True, blank=True
    )

    objects = ApplicationManager()

    class Meta(toolkit.AbstractApplication.Meta):
        swappable = "OAUTH2_PROVIDER_APPLICATION_MODEL"
        db_table = "oauth_applications"
        indexes = [
            # Used by the registration limit: one address's registrations of the last hour.
            models.Index(fields=["registered_from", "created"], name="oauth_apps_registered_idx"),
        ]

    def is_usable(self, request: Any) -> bool:
        """Refuse a dynamic registration that expired unapproved, everywhere the toolkit looks."""
        return not (
            self.registration_source == self.RegistrationSource.DCR
            and self.approved_at is None
            and self.created is not None
            and self.created < timezone.now() - UNAPPROVED_REGISTRATION_LIFETIME
        )

    def get_allowed_schemes(self) -> list[str]:
        # Native clients come back by their own scheme (cursor://...); the
        # registration checked each one (oauth/redirects.py).
        return ["http", "https", *redirects.private_schemes(self.redirect_uris.split())]


class Grant(toolkit.AbstractGrant):
    """An authorization code. Exchanged, it is kept, spent, until it expires: a second
    use is refused and revokes every token issued from the first (RFC 6749 4.1.2)."""

    agent = _agent()
    spent_at: models.DateTimeField[datetime | None, datetime | None] = models.DateTimeField(
        null=True, blank=True
    )
    # The refresh token family the exchange started; rotation keeps it.
    token_family: models.UUIDField[uuid.UUID | None, uuid.UUID | None] = models.UUIDField(
        null=True, blank=True
    )

    class Meta(toolkit.AbstractGrant.Meta):
        swappable = "OAUTH2_PROVIDER_GRANT_MODEL"
        db_table = "oauth_grants"


class AccessToken(toolkit.AbstractAccessToken):
    agent = _agent()

    class Meta(toolkit.AbstractAccessToken.Meta):
        swappable = "OAUTH2_PROVIDER_ACCESS_TOKEN_MODEL"
        db_table = "oauth_access_tokens"


class RefreshToken(toolkit.AbstractRefreshToken):
    agent = _agent()

    class Meta(toolkit.AbstractRefreshToken.Meta):
        swappable = "OAUTH2_PROVIDER_REFRESH_TOKEN_MODEL"
        db_table = "oauth_refresh_tokens"


class IDToken(toolkit.AbstractIDToken):
    class Meta(toolkit.AbstractIDToken.Meta):
        swappable = "OAUTH2_PROVIDER_ID_TOKEN_MODEL"
        db_table = "oauth_id_tokens"
