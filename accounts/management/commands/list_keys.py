from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from accounts import services


class Command(BaseCommand):
    help = "List API keys (never their secrets), optionally for one user."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("email", nargs="?", help="Only this user's keys.")
        parser.add_argument("--all", action="store_true", help="Include revoked keys.")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["email"] and services.find_user(email=options["email"]) is None:
            # "0 keys." said a typo's user exists and holds none.
            raise CommandError(f"No user with email {options['email']}.")
        rows = services.list_keys(email=options["email"], include_revoked=options["all"])
        for key in rows:
            state = f"revoked {key.revoked_at:%Y-%m-%d}" if key.revoked_at else "live"
            used = f"{key.last_used_at:%Y-%m-%d %H:%M}" if key.last_used_at else "never"
            self.stdout.write(
                f"{key.id}  {key.prefix}…  {key.tier:<7}  {state:<16}  last used {used:<16}  "
                f"{key.user.email}  {key.name}"
            )
        self.stdout.write(f"{len(rows)} key{'' if len(rows) == 1 else 's'}.")
