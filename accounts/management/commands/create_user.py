from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from accounts import services, tiers
from core.errors import RecallError


class Command(BaseCommand):
    help = "Create a user who can hold API keys and sign in to the dashboard."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("email")
        parser.add_argument("--tier", default="free", choices=tiers.VALUES)
        parser.add_argument(
            "--password", help="Dashboard password. Without it the user cannot sign in yet."
        )
        parser.add_argument("--staff", action="store_true", help="May use the operator admin.")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            user = services.create_user(
                email=options["email"],
                password=options["password"],
                tier=options["tier"],
                is_staff=options["staff"],
                is_superuser=options["staff"],
            )
        except RecallError as error:
            raise CommandError(error.message) from None
        self.stdout.write(f"Created user {user.email} ({user.tier}), id {user.id}.")
        if not user.has_usable_password():
            # Password reset mails only users who have a password, so say how to give one.
            self.stdout.write(
                f"{user.email} has no password, so cannot sign in to the dashboard yet. "
                f"Set one with `recall manage changepassword {user.email}`, or in the admin "
                "(/admin/, Users). API keys work without one."
            )
