from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from accounts import services as accounts
from memories import services


class Command(BaseCommand):
    help = (
        "Drop cached query vectors: one user's (and their agents'), or with no email every "
        "tenant's, in this process, in Redis and in every running server listening on the "
        "database. Tenants' own optimize_cache only ever touches their own entries."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("email", nargs="?", help="only this user's entries")

    def handle(self, *args: Any, **options: Any) -> None:
        email = options["email"]
        if email is None:
            removed = services.clear_query_cache()
            self.stdout.write(
                f"Cleared the query cache for every user ({removed} entries {_where()}); "
                "running servers drop theirs now."
            )
            return
        user = accounts.find_user(email=email)
        if user is None:
            raise CommandError(f"No user with email {email}.")
        removed = services.clear_query_cache(user_id=user.id)
        self.stdout.write(
            f"Cleared {user.email}'s cached queries ({removed} entries {_where()}); "
            "running servers drop theirs now."
        )


def _where() -> str:
    return "here and in Redis" if settings.REDIS_URL else "here"
