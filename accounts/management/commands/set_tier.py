from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from accounts import services, tiers


class Command(BaseCommand):
    help = (
        "Set a user's tier, and every one of their keys' (rate limit and memory quota). "
        "Unlimited is for the operator's own accounts; billing webhooks never change it."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("email")
        parser.add_argument("tier", choices=tiers.VALUES)

    def handle(self, *args: Any, **options: Any) -> None:
        user = services.find_user(email=options["email"])
        if user is None:
            raise CommandError(f"No user with email {options['email']}.")
        services.set_user_tier(user_id=user.id, tier=options["tier"])
        self.stdout.write(f"{user.email} and their keys are now {options['tier']}.")
