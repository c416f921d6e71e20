from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    # Keys, billing webhooks, sign-in and the dashboard (issue 4).
    path("api/", include("accounts.urls")),
    path("", include("billing.urls")),
    # The OAuth authorization server (consent, token, revocation, metadata).
    path("", include("oauth.urls")),
    path("", include("django.contrib.auth.urls")),
    path("", include("dashboard.urls")),
]
