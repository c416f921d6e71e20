"""The authorization server's endpoints, under the names the toolkit's metadata view expects.

The RFC 8414 metadata document is at the root (the issuer has no path); the
endpoints it lists live under ``/oauth/``.
"""

from __future__ import annotations

from django.urls import path
from oauth2_provider import views as toolkit

from oauth.views import ConsentView

app_name = "oauth2_provider"

urlpatterns = [
    path(
        ".well-known/oauth-authorization-server",
        toolkit.OAuthServerMetadataView.as_view(),
        name="oauth-server-metadata",
    ),
    path("oauth/authorize/", ConsentView.as_view(), name="authorize"),
    path("oauth/token/", toolkit.TokenView.as_view(), name="token"),
    path("oauth/revoke/", toolkit.RevokeTokenView.as_view(), name="revoke-token"),
    # Answers 404 unless OAUTH_DYNAMIC_REGISTRATION is on.
    path("oauth/register/", toolkit.DynamicClientRegistrationView.as_view(), name="dcr-register"),
    # RFC 7592: a registered client reads, updates or deletes its own registration.
    path(
        "oauth/register/<str:client_id>/",
        toolkit.DynamicClientRegistrationManagementView.as_view(),
        name="dcr-register-management",
    ),
]
