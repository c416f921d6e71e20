"""The authorization server's endpoints, under the names the toolkit's metadata view expects.

The RFC 8414 metadata document is at the root (the issuer has no path); the
endpoints it lists live under ``/oauth/``.
"""

from __future__ import annotations

from django.urls import path
from oauth2_provider import views as toolkit

from oauth.registration import RegistrationManagementView, RegistrationView
from oauth.views import ConsentView, JsonRevokeView, JsonTokenView

app_name = "oauth2_provider"

urlpatterns = [
    path(
        ".well-known/oauth-authorization-server",
        toolkit.OAuthServerMetadataView.as_view(),
        name="oauth-server-metadata",
    ),
    path("oauth/authorize/", ConsentView.as_view(), name="authorize"),
    path("oauth/token/", JsonTokenView.as_view(), name="token"),
    path("oauth/revoke/", JsonRevokeView.as_view(), name="revoke-token"),
    # Open to anyone unless OAUTH_DYNAMIC_REGISTRATION is off (then 404); checked and
    # limited per client address (oauth/registration.py).
    path("oauth/register/", RegistrationView.as_view(), name="dcr-register"),
    # RFC 7592: a registered client reads, updates or deletes its own registration.
    path(
        "oauth/register/<str:client_id>/",
        RegistrationManagementView.as_view(),
        name="dcr-register-management",
    ),
]
