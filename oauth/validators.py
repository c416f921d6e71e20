"""The toolkit's request validator, taught agents and Recall's resources.

* The consent page passes the chosen agent as a credential; it lands on the
  authorization code, then on every token issued from the code and every
  token rotated from those. A refresh never changes the agent.
* A token may be bound only to one of Recall's own protected resources
  (RFC 8707 ``resource``): a token for somewhere else is refused when asked
  for, and the resource server refuses a token bound to another resource.
* A token is always bound to one: a token request without ``resource``
  gets the resource of its code (every code names one: the consent page
  binds a request without one to ``/mcp``) or of its refresh token, and
  ``invalid_target`` when those name none, rather than a token that every
  endpoint would refuse.
* A code presented with a wrong or missing PKCE verifier is spent: it is
  deleted, so whoever holds a stolen code gets one guess, not as many as
  the code's lifetime allows, and the right verifier after it is refused too.
* An exchanged code is kept, spent, until it expires: a second use (a
  stolen code, used before or after its owner) is refused and revokes the
  token family the first use started (RFC 6749 section 4.1.2).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
from typing import Any

from django.db import transaction
from django.utils import timezone
from oauth2_provider.oauth2_validators import OAuth2Validator
from oauthlib.oauth2.rfc6749 import errors

from oauth import resources
from oauth.models import AccessToken, Grant, RefreshToken

logger = logging.getLogger(__name__)


class Validator(OAuth2Validator):
    def _validate_resource_uris(self, request: Any, resource_uris: list[str]) -> None:
        super()._validate_resource_uris(request, resource_uris)
        if len(resource_uris) > 1:
            # A token is bound to exactly one endpoint (README): naming two made
            # one token good at both.
            raise errors.CustomOAuth2Error(
                error="invalid_target",
                description="Name one resource: a token is for one MCP endpoint.",
                request=request,
            )
        unknown = [uri for uri in resource_uris if not resources.is_known(uri)]
        if unknown:
            raise errors.CustomOAuth2Error(
                error="invalid_target",
                description=(
                    f"This server issues tokens only for its own MCP endpoints "
                    f"({', '.join(resources.identifiers())}), not for {unknown[0]!r}."
                ),
                request=request,
            )

    def validate_scopes(
        self,
        client_id: str,
        scopes: list[str],
        client: Any,
        request: Any,
        *args: Any,
        **kwargs: Any,
    ) -> bool:
        # "memory memory" is one scope: stored as asked, the token's scope said it twice.
        scopes[:] = dict.fromkeys(scopes)
        return bool(super().validate_scopes(client_id, scopes, client, request, *args, **kwargs))

    def _check_and_set_request_resource(self, request: Any) -> None:
        super()._check_and_set_request_resource(request)
        if not request.resource:
            raise errors.CustomOAuth2Error(
                error="invalid_target",
                description=(
                    "This grant names no resource, so its token would be accepted nowhere. "
                    "Start a new authorization naming one of "
                    f"{', '.join(resources.identifiers())} as its resource."
                ),
                request=request,
            )

    def _create_authorization_code(self, request: Any, code: Any, expires: Any = None) -> Grant:
        self._validate_resource_uris(request, getattr(request, "resource", None) or [])
        grant = super()._create_authorization_code(request, code, expires)
        grant.agent_id = getattr(request, "agent_id", None)
        grant.save(update_fields=["agent"])
        return grant

    def validate_code(
        self, client_id: str, code: str, client: Any, request: Any, *args: Any, **kwargs: Any
    ) -> bool:
        spent = list(
            Grant.objects.filter(code=code, application=client, spent_at__isnull=False).values_list(
                "token_family", flat=True
            )[:1]
        )
        if spent:
            _revoke(spent[0], "an authorization code was used a second time")
            return False
        valid = super().validate_code(client_id, code, client, request, *args, **kwargs)
        if valid and not request.user.is_active:
            return False  # deactivated since it approved: no new token
        if valid:
            request.agent_id = (
                Grant.objects.filter(code=code, application=client)
                .values_list("agent_id", flat=True)
                .first()
            )
        return valid

    def invalidate_authorization_code(
        self, client_id: str, code: str, request: Any, *args: Any, **kwargs: Any
    ) -> None:
        # Kept, spent, rather than deleted: its second use must find what it issued.
        family = getattr(request, "token_family", None)
        spent = Grant.objects.filter(
            code=code, application=request.client, spent_at__isnull=True
        ).update(spent_at=timezone.now(), token_family=family)
        if not spent:
            # Another exchange of the same code won the race: both uses are refused.
            first = (
                Grant.objects.filter(code=code, application=request.client)
                .values_list("token_family", flat=True)
                .first()
            )
            _revoke(first, "an authorization code was used a second time")
            _revoke(family, "an authorization code was used a second time")
            raise errors.InvalidGrantError(request=request)

    def get_code_challenge(self, code: str, request: Any) -> str | None:
        grant = Grant.objects.filter(code=code, application=request.client).first()
        if grant is None or not grant.code_challenge:
            return None
        # Read before the grant may go: oauthlib asks for it after this.
        request.code_challenge_method = grant.code_challenge_method or None
        verifier = request.code_verifier
        # As bytes: compare_digest refuses text that is not ASCII, and a challenge is
        # stored as the authorization request sent it.
        if not isinstance(verifier, str) or not hmac.compare_digest(
            _s256(verifier).encode(), str(grant.code_challenge).encode()
        ):
            grant.delete()  # oauthlib refuses the request: invalid_grant, or the verifier missing
        return str(grant.code_challenge)

    def get_code_challenge_method(self, code: str, request: Any) -> str | None:
        method = getattr(request, "code_challenge_method", None)
        if method is not None:
            return str(method)
        return super().get_code_challenge_method(code, request)

    def save_bearer_token(self, token: Any, request: Any, *args: Any, **kwargs: Any) -> None:
        instance = getattr(request, "refresh_token_instance", None)
        if request.grant_type != "refresh_token" or instance is None:
            return super().save_bearer_token(token, request, *args, **kwargs)
        # Two uses of one refresh token at once both passed its check; the
        # second then found it rotated by the first, and the toolkit's answer
        # for that (the access token the first got) failed on a token stored
        # hashed: a 500. It is a reuse: refused, and its family revoked.
        with transaction.atomic():
            row = (
                RefreshToken.objects.select_for_update()
                .filter(pk=instance.pk)
                .values_list("revoked", "token_family")
                .first()
            )
            if row is not None and row[0] is None:
                return super().save_bearer_token(token, request, *args, **kwargs)
        _revoke(row[1] if row else instance.token_family, "a refresh token was used twice")
        raise errors.InvalidGrantError(request=request)

    def validate_refresh_token(
        self, refresh_token: str, client: Any, request: Any, *args: Any, **kwargs: Any
    ) -> bool:
        # Asked before the toolkit's check, which revokes a replayed token's family
        # and with it the access tokens that show a newer one replaced it.
        replaced = _replaced_family(refresh_token)
        valid = super().validate_refresh_token(refresh_token, client, request, *args, **kwargs)
        if not valid and replaced is not None:
            logger.warning(
                "oauth: tokens revoked",
                extra={
                    "reason": "a refresh token was used after a newer one replaced it",
                    "token_family": str(replaced),
                },
            )
        if valid and not request.user.is_active:
            return False  # a deactivated user's connections get no new token
        if valid:
            request.agent_id = request.refresh_token_instance.agent_id
        return valid

    def _create_access_token(
        self, expires: Any, request: Any, token: Any, source_refresh_token: Any = None
    ) -> AccessToken:
        access = super()._create_access_token(expires, request, token, source_refresh_token)
        AccessToken.objects.filter(pk=access.pk).update(agent_id=request.agent_id)
        access.agent_id = request.agent_id
        return access

    def _create_refresh_token(
        self, request: Any, refresh_token_code: str, access_token: Any, previous_refresh_token: Any
    ) -> RefreshToken:
        refresh = super()._create_refresh_token(
            request, refresh_token_code, access_token, previous_refresh_token
        )
        RefreshToken.objects.filter(pk=refresh.pk).update(agent_id=request.agent_id)
        refresh.agent_id = request.agent_id
        request.token_family = refresh.token_family
        return refresh


def _replaced_family(refresh_token: str) -> Any:
    """The family of a refresh token a newer one replaced (it was spent on an access
    token, then revoked by the rotation), or None.

    Presented again, it is the likeliest sign of a stolen token, and the toolkit
    revokes its connection without a word (a reused code is logged already:
    review146). A token revoked with its connection (disconnected on the
    dashboard, or by the client) was replaced by nothing: no replay (review148).
    Told as the toolkit tells them, by the access token it was spent on, not by
    the servers' clocks (review152).
    """
    checksum = hashlib.sha256(refresh_token.encode("utf-8")).hexdigest()
    spent = (
        RefreshToken.objects.filter(token_checksum=checksum, revoked__isnull=False)
        .values_list("pk", "token_family")
        .first()
    )
    if spent is None or spent[1] is None:
        return None
    if not AccessToken.objects.filter(source_refresh_token_id=spent[0]).exists():
        return None
    return spent[1]


def _revoke(family: Any, why: str) -> None:
    """Revoke every refresh token of ``family`` and delete their access tokens."""
    if family is None:
        return
    RefreshToken.revoke_family(family)
    logger.warning("oauth: tokens revoked", extra={"reason": why, "token_family": str(family)})


def _s256(verifier: str) -> str:
    """The S256 challenge of ``verifier`` (RFC 7636 section 4.2), the only method offered."""
    digest = hashlib.sha256(verifier.encode("ascii", "replace")).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")
