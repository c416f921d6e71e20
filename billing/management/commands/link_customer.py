from __future__ import annotations

import re
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from accounts import services as accounts_services
from billing import services
from core import tenancy
from core.errors import RecallError

# Stripe's customer ids: "cus_" and letters and digits.
CUSTOMER = re.compile(r"cus_[A-Za-z0-9]{1,250}")


class Command(BaseCommand):
    help = (
        "Link a Stripe customer to a user, as a completed checkout would: the customer's "
        "subscriptions then set the user's tier, and later events follow them. For a checkout "
        "refused with 409 (the payer's email belongs to a user linked to another customer); "
        "resend the refused event from Stripe's dashboard afterwards."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("email")
        parser.add_argument("customer", help="the Stripe customer id, cus_…")
        parser.add_argument(
            "--move",
            action="store_true",
            help="move a customer linked to another user (who loses the tier it pays for)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        customer = options["customer"]
        if not CUSTOMER.fullmatch(customer):
            raise CommandError(f"{customer!r} is not a Stripe customer id (cus_…).")
        user = accounts_services.find_user(email=options["email"])
        if user is None:
            raise CommandError(f"No user with email {options['email']}.")
        try:
            with tenancy.operator():
                holder = services.customer_holder(customer_id=customer)
                if holder is not None and holder != user.id and not options["move"]:
                    other = accounts_services.get_user(user_id=holder)
                    raise CommandError(
                        f"{customer} is linked to {other.email if other else holder}; "
                        "--move moves it (and the tier its subscriptions pay for)."
                    )
                services.link_stripe_customer(customer_id=customer, user_id=str(user.id))
        except RecallError as exc:
            raise CommandError(exc.message) from None
        tier = accounts_services.get_user(user_id=user.id)
        self.stdout.write(
            f"{customer} is linked to {user.email}; their tier is {tier.tier if tier else '?'}."
        )
