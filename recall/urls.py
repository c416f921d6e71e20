from django.contrib import admin
from django.urls import include, path

from dashboard.views import SignOutView
from oauth.views import SignInView

urlpatterns = [
    path("admin/", admin.site.urls),
    # Keys, billing webhooks, sign-in and the dashboard (issue 4).
    path("api/", include("accounts.urls")),
    path("", include("billing.urls")),
    # The OAuth authorization server (consent, token, revocation, metadata).
    path("", include("oauth.urls")),
    # Django's sign-in, with a form-action for an authorization request that
    # skips the consent page; the rest of the account pages as they are.
    path("login/", SignInView.as_view(), name="login"),
    # Signing out takes a POST; a link or a typed address asks first (Django
    # answered its GET with an empty 405, which a browser shows as an error).
    path("logout/", SignOutView.as_view(), name="logout"),
    path("", include("django.contrib.auth.urls")),
    path("", include("dashboard.urls")),
]
