from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from accounts import services, tiers
from core.errors import RecallError


class Command(BaseCommand):
    help = "Issue an API key for a user and print it. The key is shown this once only."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("email", help="The user who will own the key.")
        parser.add_argument("--name", default="", help="A label, e.g. the agent or machine.")
        parser.add_argument("--tier", choices=tiers.VALUES, help="Defaults to the user's own tier.")
        parser.add_argument(
            "--agent", help="One of the user's agents, by name: the key sees only its memories."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        user = services.find_user(email=options["email"])
        if user is None:
            raise CommandError(f"No user with email {options['email']}.")
        try:
            key, raw = services.issue_key(
                user=user, name=options["name"], tier=options["tier"], agent=options["agent"]
            )
        except RecallError as error:
            raise CommandError(error.message) from None
        self.stdout.write(raw)
        self.stderr.write(
            f"Issued key {key.prefix}… ({key.tier}) for {user.email}"
            + (f" as agent {key.agent.name}" if key.agent else "")
            + f", id {key.id}. "
            "Store it now: it cannot be shown again."
        )
