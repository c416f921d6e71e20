"""Billing: tiers from Stripe and MCPize, and usage events: written, counted and summarised.

Webhook handlers are operator functions: they run in ``tenancy.operator()``
because changing a tier rewrites every one of the user's API keys, which are
tenant rows. Each delivery is claimed in ``WebhookEvent`` inside the same
transaction that applies it, so a replay does nothing and a delivery that
fails half-way leaves no claim behind and can be retried.

How a Stripe subscription becomes a tier
    Each subscription's newest state is kept in ``Subscription``. A user's
    tier is the best tier among their subscriptions whose status still grants
    one (``GRANTING``), or free when none does: so a deleted, unpaid or
    expired subscription drops the user to free, and the end of an old
    subscription does not undo a newer one. Stripe does not deliver events in
    order; an event older (by its ``created`` time) than the newest one
    applied to its subscription changes nothing. Events created in the same
    second are applied in arrival order, except that nothing revives a
    subscription that has ended and nothing takes one back to "incomplete",
    its first state.

    Prices map to tiers through ``STRIPE_PRICE_TO_TIER``. A subscription
    whose price is not in the map is stored but does not change the tier
    while it is active: it is logged, for an operator to add the price.

Billing sets only the tiers it sells (``tiers.BILLABLE``). A user an operator
has put on the Unlimited tier keeps it whatever Stripe or MCPize say; the
delivery is recorded and logged, and the operator changes the tier by hand.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import psycopg
from django.conf import settings
from django.db import IntegrityError, connection

from accounts import services as accounts_services
from accounts import tiers
from accounts.models import User
from billing.models import (
    BillingAccount,
    Subscription,
    UsageEvent,
    WebhookEvent,
    WebhookRejection,
)
from core import storable, tenancy
from core.errors import Conflict, NotFound, ValidationFailed
from core.usage import Event

logger = logging.getLogger(__name__)

# Statuses under which a subscription still grants its tier. past_due is
# Stripe's retry period after a failed payment; unpaid is where it ends up.
GRANTING = frozenset({"active", "trialing", "past_due"})
# Statuses a subscription never leaves.
ENDED = frozenset({"canceled", "incomplete_expired"})

SUBSCRIPTION_EVENTS = (
    "customer.subscription.created",
    "customer.subscription.updated",
    "customer.subscription.deleted",
)


def claim_delivery(*, source: str, event_id: str, event_type: str = "") -> bool:
    """Record a webhook delivery as handled; return False if it was handled before.

    Call inside the transaction that applies the delivery. A concurrent
    duplicate waits on the unique constraint until the first commits.
    """
    _, created = WebhookEvent.objects.get_or_create(
        source=source, event_id=event_id[:255], defaults={"event_type": event_type[:100]}
    )
    return created


def record_rejection(
    *, source: str, reason: str, status: int, event_id: object = None, event_type: object = None
) -> None:
    """Keep a signed delivery we refused, for the admin (operator path); never fails the caller.

    ``event_id`` and ``event_type`` are whatever the body held: scrubbed and
    cut to fit, since they may be exactly what was wrong.
    """
    try:
        with tenancy.operator():
            WebhookRejection.objects.create(
                source=source,
                event_id=storable.scrub(event_id, max_length=255),
                event_type=storable.scrub(event_type, max_length=100),
                reason=storable.scrub(reason, max_length=255),
                status=status,
            )
    except Exception as exc:
        logger.error(
            "could not record a refused webhook delivery",
            extra={"source": source, "error": type(exc).__name__},
        )
    logger.warning("webhook delivery refused", extra={"source": source, "reason": reason})


def _lock(name: str) -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 2))", [name])


# Stripe -------------------------------------------------------------------------


def tier_for_price(price_id: str) -> str | None:
    return settings.STRIPE_PRICE_TO_TIER.get(price_id)


def handle_stripe_event(event: dict[str, Any]) -> str:
    """Apply a verified Stripe event once (operator path). Return what happened, for the log.

    An event that cannot be applied (a checkout for no user we know) raises a
    ``RecallError`` and writes nothing: it is not recorded as handled either.
    """
    kind = event.get("type", "")
    handler = _STRIPE_HANDLERS.get(kind)
    if handler is None:
        return "ignored"
    obj = (event.get("data") or {}).get("object") or {}
    if kind == "customer.subscription.deleted":
        obj = {**obj, "status": "canceled"}
    created = datetime.fromtimestamp(int(event.get("created") or 0), UTC)
    with tenancy.operator():
        if not claim_delivery(source="stripe", event_id=event["id"], event_type=kind):
            return "duplicate"
        outcome = handler(obj, event["id"], created)
    logger.info(
        "stripe event handled", extra={"event_id": event["id"], "type": kind, "outcome": outcome}
    )
    return outcome


def _checkout_completed(session: dict[str, Any], event_id: str, created: datetime) -> str:
    customer_id = session.get("customer")
    if not customer_id:
        return "no_customer"
    email = (session.get("customer_details") or {}).get("email") or session.get("customer_email")
    user = link_stripe_customer(
        customer_id=customer_id, user_id=session.get("client_reference_id"), email=email
    )
    # Subscriptions that came before the link set the tier now: one with a
    # price missing from the map leaves this delivery to be sent again.
    if _held_by_unknown_prices(user.id, event_id, subject=customer_id):
        return "unknown_price"
    return "linked"


def link_stripe_customer(
    *, customer_id: str, user_id: str | None = None, email: str | None = None
) -> User:
    """Link a Stripe customer to the user Checkout was for (operator path).

    Finds the user by ``client_reference_id`` (our user id), falling back to
    the email address. Subscriptions that arrived before the link get the
    user now, and the user's tier follows them.

    An email is what the payer typed (a Payment Link, a session made in
    Stripe's dashboard), not proof of the account: it never moves a user
    already linked to another customer, whose "Manage billing" would then
    open a stranger's billing. Such a checkout is refused (``Conflict``), as
    is one for no user we know (``NotFound``): the delivery is then not
    recorded as handled, so once the operator has made or linked the user,
    Stripe's retry (or "Resend" in its dashboard) applies it.
    """
    # Our checkout names the user; else a link the operator made stands (it
    # is how a refused checkout is settled before it is sent again); else
    # the payer's email.
    user = _user_by_id(user_id) or _user_for_customer(customer_id)
    if user is None:
        user = _user_by_email(email)
        if user is not None and _linked_elsewhere(user, customer_id):
            logger.warning(
                "stripe checkout matched by email to a user linked to another customer; not linked",
                extra={"stripe_customer": customer_id, "user_id": str(user.id)},
            )
            raise Conflict(
                "the payer's email belongs to a user already linked to another Stripe customer;"
                " link this customer to the right user (recall link-customer EMAIL CUSTOMER),"
                " then resend the event"
            )
    if user is None:
        logger.warning(
            "stripe checkout for an unknown user", extra={"stripe_customer": customer_id}
        )
        raise NotFound(
            "no user matches this checkout (neither its client_reference_id nor the payer's"
            " email); create or link the user, then resend the event"
        )
    _lock(f"stripe-customer:{customer_id}")
    # A customer belongs to one user; a re-used customer moves to the new one,
    # and the tier its subscriptions gave the user it leaves goes with it.
    previous = BillingAccount.objects.filter(stripe_customer_id=customer_id).exclude(user=user)
    # The users this customer's live subscriptions pay for: the one it was
    # linked to, or one who checked out as another customer since
    # (``_former_user``). An ended one paid for nothing a user holds now.
    paid = set(
        Subscription.objects.filter(
            customer_id=customer_id, user__isnull=False, status__in=GRANTING
        )
        .exclude(user=user)
        .values_list("user_id", flat=True)
    )
    left = set(previous.values_list("user_id", flat=True)) | paid
    # Each user's billing lock before their account's row, as MCPize's
    # deliveries take them: the other order deadlocked with one.
    for who in sorted([*left, user.id], key=str):
        _lock(f"billing-user:{who}")
    previous.update(stripe_customer_id=None)
    linked = BillingAccount.objects.filter(user=user)
    former = linked.values_list("stripe_customer_id", flat=True).first()
    if former and former != customer_id:
        # Its subscriptions stay the user's (``_former_user``), but "Manage
        # billing" opens the new customer's portal only.
        logger.warning(
            "stripe: a user linked to one customer checked out as another; the new one is linked",
            extra={
                "stripe_customer": customer_id,
                "former_stripe_customer": former,
                "user_id": str(user.id),
            },
        )
    BillingAccount.objects.update_or_create(user=user, defaults={"stripe_customer_id": customer_id})
    Subscription.objects.filter(customer_id=customer_id).update(user=user)
    for who in sorted([*left, user.id], key=str):  # locks in one order
        # A tier the customer never paid for (an operator's) stays.
        sync_tier(user_id=who, lost_customer=who in paid)
    return user


def _goes_back(stored: str, arriving: str) -> bool:
    """Whether a status arriving in the same second as the stored one would go back in time.

    Nothing revives a subscription that has ended, and "incomplete" is only
    ever a new subscription's first state: Checkout's "created" (incomplete)
    and "updated" (active) share a second and may arrive in either order.
    """
    if stored in ENDED:
        return arriving not in ENDED
    return arriving == "incomplete" and stored != "incomplete"


def _linked_elsewhere(user: User, customer_id: str) -> bool:
    """Whether ``user`` is already linked to a Stripe customer other than ``customer_id``."""
    return (
        BillingAccount.objects.filter(user=user, stripe_customer_id__isnull=False)
        .exclude(stripe_customer_id=customer_id)
        .exists()
    )


def _subscription_changed(sub: dict[str, Any], event_id: str, created: datetime) -> str:
    sub_id = sub.get("id")
    customer_id = sub.get("customer")
    if not sub_id or not customer_id:
        raise ValidationFailed("data.object must have an id and a customer")
    status = sub.get("status") or "canceled"
    _lock(f"stripe-customer:{customer_id}")
    current = Subscription.objects.filter(id=sub_id).first()
    if current is not None and (
        created < current.event_created
        or (created == current.event_created and _goes_back(current.status, status))
    ):
        logger.info(
            "stale stripe event ignored",
            extra={"event_id": event_id, "subscription": sub_id, "applied": current.event_id},
        )
        return "stale"

    price_id = _best_price(_price_ids(sub))
    user = _user_for_customer(customer_id)
    if user is None:
        # Our Checkout sessions tag the subscription with the user, so an
        # event that beats checkout.session.completed here still finds them.
        user = _user_by_id((sub.get("metadata") or {}).get("recall_user_id"))
        if user is not None:
            _lock(f"billing-user:{user.id}")  # before the account's row, as everywhere
            BillingAccount.objects.get_or_create(
                user=user, defaults={"stripe_customer_id": customer_id}
            )
    if user is None:
        # The customer's other subscriptions name its user where its link no
        # longer does: the user checked out again as another customer, and a
        # subscription begun on the first one still pays for them.
        user = (current.user if current is not None else None) or _former_user(customer_id)
    Subscription.objects.update_or_create(
        id=sub_id,
        defaults={
            "customer_id": customer_id,
            "user": user,
            "status": status,
            "price_id": price_id,
            "event_id": event_id,
            "event_created": created,
        },
    )
    if user is None:
        # Checkout's own event links the customer; the tier follows then (and
        # that event is the one held back if this price is missing from the map).
        if status in GRANTING and tier_for_price(price_id) is None:
            logger.warning(
                "a stripe price is not in STRIPE_PRICE_TO_TIER; its customer is not linked yet",
                extra={"prices": [price_id], "subscription": sub_id},
            )
        return "unlinked"
    sync_tier(user_id=user.id)
    if _held_by_unknown_prices(user.id, event_id, subject=sub_id):
        return "unknown_price"
    return "applied"


def _held_by_unknown_prices(user_id: uuid.UUID, event_id: str, *, subject: str) -> bool:
    """Whether a live subscription of the user has a price missing from the map.

    The tier the delivery leaves may then be wrong, whichever subscription's
    price is unknown: it is not handled yet (its claim is given back), so once
    the operator adds the price to the map, Stripe's "Resend" on it sets the tier.
    """
    unmapped = _stripe_tier(user_id)[1]
    if not unmapped:
        return False
    WebhookEvent.objects.filter(source="stripe", event_id=event_id[:255]).delete()
    logger.warning(
        "a live stripe price is not in STRIPE_PRICE_TO_TIER; the tier may rise, not fall",
        extra={"prices": unmapped, "subject": subject, "user_id": str(user_id)},
    )
    return True


_STRIPE_HANDLERS: dict[str, Callable[[dict[str, Any], str, datetime], str]] = {
    "checkout.session.completed": _checkout_completed,
    **dict.fromkeys(SUBSCRIPTION_EVENTS, _subscription_changed),
}


def sync_tier(*, user_id: uuid.UUID | str, lost_customer: bool = False) -> str | None:
    """Set the user's tier from their Stripe subscriptions (operator path). Return the new tier.

    Leaves the tier alone for a user with no subscriptions (an operator may
    have set it), unless ``lost_customer``: their Stripe customer, and with it
    every subscription, has just moved to another user. A tier MCPize bills
    the user for stands beside it: the higher of the two. While a live
    subscription has an unmapped price, what it grants is unknown: the tier
    may rise to what the known sources grant, and never falls.
    """
    # One lock per user for both sources: each reads the other's tier.
    _lock(f"billing-user:{user_id}")
    billed, unmapped = _stripe_tier(user_id)
    if billed is None and lost_customer:
        billed = tiers.Tier.FREE.value
    if billed is None:
        return None
    best = _higher(billed, _mcpize_tier(user_id))
    user = accounts_services.get_user(user_id=user_id)
    if user is not None and not tiers.is_billable(user.tier):
        _leave_operator_grant(user, source="stripe", billed=best)
        return None
    if user is not None and unmapped and tiers.rank(best) <= tiers.rank(user.tier):
        return None
    if user is not None and user.tier != best:
        accounts_services.set_user_tier(user_id=user_id, tier=best)
        logger.info(
            "tier changed by stripe", extra={"user_id": str(user_id), "from": user.tier, "to": best}
        )
    return best


def _stripe_tier(user_id: uuid.UUID | str) -> tuple[str | None, list[str]]:
    """The tier the user's Stripe subscriptions grant (None with none), and the prices of
    live ones that no tier is mapped to (which that tier then leaves out)."""
    subscriptions = list(Subscription.objects.filter(user_id=user_id))
    if not subscriptions:
        return None, []
    best = tiers.Tier.FREE.value
    unmapped: set[str] = set()
    for sub in subscriptions:
        if sub.status not in GRANTING:
            continue
        tier = tier_for_price(sub.price_id)
        if tier is None:
            unmapped.add(sub.price_id)
        else:
            best = _higher(best, tier)
    return best, sorted(unmapped)


def _mcpize_tier(user_id: uuid.UUID | str) -> str | None:
    """The tier MCPize last said it bills the user for, if it ever did."""
    billed = (
        BillingAccount.objects.filter(user_id=user_id).values_list("mcpize_tier", flat=True).first()
    )
    return billed or None


def _higher(tier: str, other: str | None) -> str:
    return other if other is not None and tiers.rank(other) > tiers.rank(tier) else tier


def _price_ids(sub: dict[str, Any]) -> list[str]:
    items = ((sub.get("items") or {}).get("data")) or []
    found = [((item.get("price") or {}).get("id")) for item in items]
    if not found and sub.get("plan"):
        found = [sub["plan"].get("id")]
    return [price for price in found if isinstance(price, str)]


def _best_price(price_ids: Iterable[str]) -> str:
    """Return the price of the highest tier, or the first price if none is mapped."""
    prices = list(price_ids)
    mapped = [p for p in prices if tier_for_price(p)]
    if mapped:
        return max(mapped, key=lambda p: tiers.rank(tier_for_price(p) or "free"))
    return prices[0] if prices else ""


def customer_holder(*, customer_id: str) -> uuid.UUID | None:
    """The user a Stripe customer is linked to, if any (operator path)."""
    return (
        BillingAccount.objects.filter(stripe_customer_id=customer_id)
        .values_list("user_id", flat=True)
        .first()
    )


def _former_user(customer_id: str) -> User | None:
    """The user of the customer's latest subscription that has one, if no account links it."""
    found = (
        Subscription.objects.filter(customer_id=customer_id, user__isnull=False)
        .select_related("user")
        .order_by("-event_created")
        .first()
    )
    return found.user if found else None


def _user_for_customer(customer_id: str) -> User | None:
    account = (
        BillingAccount.objects.select_related("user").filter(stripe_customer_id=customer_id).first()
    )
    return account.user if account else None


def _user_by_id(value: object) -> User | None:
    try:
        user_id = uuid.UUID(str(value))
    except ValueError:
        return None
    return accounts_services.get_user(user_id=user_id)


def _user_by_email(email: object) -> User | None:
    if not isinstance(email, str) or "@" not in email:
        return None
    return accounts_services.find_user(email=email)


# MCPize -------------------------------------------------------------------------


def apply_mcpize_tier(
    *,
    user_id: object,
    tier: object,
    delivery_keys: Sequence[str] = (),
    signed_at: datetime | None = None,
) -> str:
    """Set a user's tier as MCPize says (operator path). Return what happened, as for Stripe.

    ``"duplicate"`` when any of ``delivery_keys`` was handled before. Else
    the keys are claimed, and a delivery signed (``signed_at``) before the
    newest one applied to the user is ``"stale"``: it changes nothing. One
    signed in the same second is applied, in arrival order; one without a
    timestamp cannot be ordered, is applied, and leaves the newest as it was.
    """
    if tier not in tiers.BILLABLE:
        raise ValidationFailed("tier must be one of " + ", ".join(tiers.BILLABLE) + ".")
    tier = str(tier)
    try:
        uid = uuid.UUID(str(user_id))
    except ValueError:
        raise ValidationFailed("userId must be a Recall user id (a UUID).") from None
    with tenancy.operator():
        user = accounts_services.get_user(user_id=uid)
        if user is None:
            raise NotFound("no user has this userId.")
        # all() stops at the first key seen before: a replay claims no new key.
        if not all(
            claim_delivery(source="mcpize", event_id=key, event_type="subscription")
            for key in delivery_keys
        ):
            return "duplicate"
        if not _record_mcpize(user, tier, signed_at):
            return "stale"
        # A Stripe subscription the user also pays for stands beside it.
        stripe_billed, unmapped = _stripe_tier(uid)
        best = _higher(tier, stripe_billed)
        if not tiers.is_billable(user.tier):
            _leave_operator_grant(user, source="mcpize", billed=best)
            return "applied"
        if unmapped and tiers.rank(best) <= tiers.rank(user.tier):
            # What the unmapped price grants is unknown: the tier may rise, not fall.
            logger.warning(
                "tier left unchanged: a live stripe subscription has an unmapped price",
                extra={"user_id": str(uid), "billed": tier, "source": "mcpize", "prices": unmapped},
            )
            return "unknown_price"
        if user.tier == best:
            return "applied"
        accounts_services.set_user_tier(user_id=uid, tier=best)
    logger.info(
        "tier changed by mcpize", extra={"user_id": str(uid), "from": user.tier, "to": best}
    )
    return "applied"


def _record_mcpize(user: User, tier: str, signed_at: datetime | None) -> bool:
    """Record the tier MCPize bills ``user`` for; False, recording nothing, for a delivery
    signed before the newest one recorded (stale)."""
    _lock(f"billing-user:{user.id}")  # as sync_tier: each source reads the other's tier
    account, _ = BillingAccount.objects.get_or_create(user=user)
    newest = account.mcpize_event_created
    if signed_at is not None and newest is not None and signed_at < newest:
        logger.info(
            "stale mcpize delivery ignored",
            extra={
                "user_id": str(user.id),
                "signed_at": signed_at.isoformat(),
                "applied": newest.isoformat(),
            },
        )
        return False
    account.mcpize_tier = tier
    if signed_at is not None:
        account.mcpize_event_created = signed_at
    account.save(update_fields=["mcpize_tier", "mcpize_event_created", "updated_at"])
    return True


def _leave_operator_grant(user: User, *, source: str, billed: str) -> None:
    logger.info(
        "tier left alone: granted by an operator",
        extra={"user_id": str(user.id), "tier": user.tier, "source": source, "billed": billed},
    )


# Usage events --------------------------------------------------------------------


def save_usage_events(*, user_id: uuid.UUID | str, events: Sequence[Event]) -> None:
    """Insert one user's usage events in one tenant transaction (the usage recorder's writer).

    An event already stored (same ``event_id``) is skipped, so retrying a batch
    whose first write did commit, unacknowledged, stores each event once.

    An event whose agent or API key was deleted while it waited (a call still
    running when the agent went) is stored without it, as ON DELETE SET NULL
    would have left it had it been written first: usage is billed. The batch
    is then written again, in a new transaction, with those references NULL.
    """
    while True:
        try:
            _insert_usage_events(user_id, events)
            return
        except IntegrityError as exc:
            if not isinstance(exc.__cause__, psycopg.errors.ForeignKeyViolation):
                raise
            # Each round nulls at least one reference, so the loop ends.
            gone = _gone_references(user_id, events)
            if not gone:
                raise  # the user, not an agent or a key
            logger.info(
                "usage events stored without a deleted agent or key",
                extra={"user_id": str(user_id), "gone": len(gone)},
            )
            events = [
                replace(
                    e,
                    agent_id=None if e.agent_id in gone else e.agent_id,
                    api_key_id=None if e.api_key_id in gone else e.api_key_id,
                )
                for e in events
            ]


def _insert_usage_events(user_id: uuid.UUID | str, events: Sequence[Event]) -> None:
    with tenancy.tenant(user_id):
        UsageEvent.objects.bulk_create(
            (
                UsageEvent(
                    user_id=e.user_id,
                    api_key_id=e.api_key_id,
                    agent_id=e.agent_id,
                    request_id=e.request_id,
                    tool_name=e.tool_name,
                    tokens_consumed=e.tokens_consumed,
                    latency_ms=e.latency_ms,
                    success=e.success,
                    error_code=e.error_code,
                    occurred_at=e.occurred_at,
                    event_id=e.event_id,
                )
                for e in events
            ),
            ignore_conflicts=True,
        )


def _gone_references(user_id: uuid.UUID | str, events: Sequence[Event]) -> set[uuid.UUID]:
    """Return the agents and API keys these events name that no longer exist."""
    gone: set[uuid.UUID] = set()
    for agent_id in {e.agent_id for e in events if e.agent_id is not None}:
        try:
            accounts_services.get_agent(user_id=user_id, agent_id=agent_id)
        except NotFound:
            gone.add(agent_id)
    for key_id in {e.api_key_id for e in events if e.api_key_id is not None}:
        if not accounts_services.find_keys(id_or_prefix=str(key_id)):
            gone.add(key_id)
    return gone


def count_usage_events(*, user_ids: Iterable[uuid.UUID | str]) -> int:
    """Return how many usage events these users have together (operator path)."""
    with tenancy.operator():
        return UsageEvent.objects.filter(user_id__in=list(user_ids)).count()


# Subscriptions, for the dashboard and the admin ---------------------------------


def stripe_customer_id(*, user_id: uuid.UUID | str) -> str | None:
    """Return the user's Stripe customer, if checkout or a webhook linked one."""
    account = BillingAccount.objects.filter(user_id=user_id).only("stripe_customer_id").first()
    return account.stripe_customer_id if account else None


def recent_subscriptions(*, user_id: uuid.UUID | str, limit: int = 5) -> list[Subscription]:
    return list(Subscription.objects.for_user(user_id)[:limit])


def count_subscriptions(*, user_ids: Iterable[uuid.UUID | str]) -> int:
    return Subscription.objects.filter(user_id__in=list(user_ids)).count()
