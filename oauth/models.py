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

from django.db import models
from oauth2_provider import models as toolkit


def _agent() -> models.ForeignKey:
    return models.ForeignKey(
        "accounts.Agent",
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        null=True,
        blank=True,
        related_name="+",
    )


class Application(toolkit.AbstractApplication):
    class Meta(toolkit.AbstractApplication.Meta):
        swappable = "OAUTH2_PROVIDER_APPLICATION_MODEL"
        db_table = "oauth_applications"


class Grant(toolkit.AbstractGrant):
    agent = _agent()

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
