from __future__ import annotations

from django.apps import AppConfig


class OAuthConfig(AppConfig):
    name = "oauth"
    label = "oauth"
    verbose_name = "OAuth connections"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from core import housekeeping
        from oauth import services

        housekeeping.register("oauth", services.clear_expired)
