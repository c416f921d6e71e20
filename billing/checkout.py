"""Stripe Checkout and the customer portal, for the dashboard's Plan page.

Both are offered only when ``STRIPE_SECRET_KEY`` and ``STRIPE_PRICE_TO_TIER``
are set. Nothing here changes a tier: Stripe reports the outcome to the
webhook, which does (see billing/services/).
"""

from __future__ import annotations

import hashlib
import logging
from typing import TYPE_CHECKING

import stripe
from django.conf import settings

from accounts import tiers
from accounts.models import User
from billing import services
from core import tenancy
from core.errors import RecallError, ValidationFailed

if TYPE_CHECKING:
    from stripe.params.checkout import SessionCreateParams

logger = logging.getLogger(__name__)


UNAVAILABLE = "Payments are unavailable right now. Try again shortly."
# Where a checkout or portal session sends the browser: Stripe's own pages.
# (An account with a custom domain for them needs that domain here too.)
PAGES = ("https://checkout.stripe.com", "https://billing.stripe.com")


class PaymentsUnavailable(RecallError):
    code = "payments_unavailable"
    http_status = 503


def is_configured() -> bool:
    return bool(settings.STRIPE_SECRET_KEY and settings.STRIPE_PRICE_TO_TIER)


def prices_by_tier() -> dict[str, str]:
    """Return one price per paid tier, cheapest tier first."""
    found: dict[str, str] = {}
    for price, tier in settings.STRIPE_PRICE_TO_TIER.items():
        found.setdefault(tier, price)
    return dict(sorted(found.items(), key=lambda item: tiers.rank(item[0])))


def client() -> stripe.StripeClient:
    # A client of our own rather than stripe's module globals, so the API
    # base (tests point it at a local fake) never leaks into other code.
    return stripe.StripeClient(
        settings.STRIPE_SECRET_KEY,
        base_addresses={"api": settings.STRIPE_API_BASE},
        max_network_retries=1,
    )


def customer_id(user: User) -> str | None:
    return services.stripe_customer_id(user_id=user.pk)


def start_checkout(*, user: User, tier: str, success_url: str, cancel_url: str) -> str:
    """Create a Checkout session for ``tier`` and return the URL to send the user to."""
    price = prices_by_tier().get(tier)
    if price is None:
        raise ValidationFailed(f"The {tier} tier cannot be bought here.")
    params: SessionCreateParams = {
        "mode": "subscription",
        "line_items": [{"price": price, "quantity": 1}],
        # Both carry the user: the session's for checkout.session.completed,
        # the subscription's for subscription events that arrive first.
        "client_reference_id": str(user.id),
        "subscription_data": {"metadata": {"recall_user_id": str(user.id)}},
        "success_url": success_url,
        "cancel_url": cancel_url,
    }
    try:
        params["customer"] = customer_id(user) or _new_customer(user)
        session = client().v1.checkout.sessions.create(params=params)
    except stripe.StripeError as exc:
        logger.warning("stripe checkout failed", extra={"error": type(exc).__name__})
        raise PaymentsUnavailable(UNAVAILABLE) from None
    if not session.url:
        # Only embedded-mode sessions come without one; this one is hosted.
        logger.warning("stripe checkout returned no url")
        raise PaymentsUnavailable(UNAVAILABLE)
    return session.url


def _new_customer(user: User) -> str:
    """Make the user's Stripe customer and link it, before their first checkout.

    Checkout given only an email makes a customer of its own per session:
    two checkouts started before either finished (two tabs) made two, and
    the second's link replaced the first's, so "Manage billing" never showed
    the first subscription. The idempotency key (Stripe keeps one a day)
    makes the two tabs' requests one customer.
    """
    # The email in the key too: Stripe refuses a key sent again with other
    # parameters, which would fail every checkout for a day after a change.
    email = hashlib.sha256(user.email.encode()).hexdigest()[:16]
    created = client().v1.customers.create(
        params={"email": user.email, "metadata": {"recall_user_id": str(user.id)}},
        options={"idempotency_key": f"recall-customer-{user.id}-{email}"},
    )
    with tenancy.operator():
        holder = services.customer_holder(customer_id=created.id)
        if holder is not None and str(holder) != str(user.id):
            # The key's day-long memory handed back a customer that has since
            # been linked to someone else: never take it from them.
            logger.warning(
                "stripe returned a customer linked to another user; not linked",
                extra={"stripe_customer": created.id, "user_id": str(user.id)},
            )
            raise PaymentsUnavailable(UNAVAILABLE)
        services.link_stripe_customer(customer_id=created.id, user_id=str(user.id))
    return created.id


def portal_url(*, user: User, return_url: str) -> str:
    """Create a customer-portal session and return its URL."""
    known = customer_id(user)
    if not known:
        raise ValidationFailed("There is no subscription to manage yet.")
    try:
        session = client().v1.billing_portal.sessions.create(
            params={"customer": known, "return_url": return_url}
        )
    except stripe.StripeError as exc:
        logger.warning("stripe portal failed", extra={"error": type(exc).__name__})
        raise PaymentsUnavailable(UNAVAILABLE) from None
    return session.url
