"""The shape of the Stripe events we act on, checked before any of it is used.

A signed body is authentic, not necessarily well formed: a test fixture, a
replayed fragment or an API change can put a string where an object belongs,
a status longer than its column, or a NUL character PostgreSQL refuses.
``event()`` checks every field ``billing.services`` reads, with the types it
assumes, and every string that reaches the database against its column (or,
for those only compared, against PostgreSQL's text rules), and raises
``Refused`` for anything else, so the webhook answers 400 with the reason and
changes nothing instead of failing half-way through.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictInt,
    StrictStr,
    ValidationError,
)

from accounts.models import User
from billing.models import BillingAccount, Subscription, WebhookEvent
from billing.services import SUBSCRIPTION_EVENTS
from core import storable


class Refused(ValueError):
    """A signed event we cannot apply; ``reason`` names the field, never its value."""

    def __init__(self, reason: str, *, event_id: object = None, event_type: object = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.event_id = event_id
        self.event_type = event_type


def _storable(max_length: int | None = None) -> AfterValidator:
    def check(value: str) -> str:
        why = storable.problem(value, max_length=max_length)
        if why is not None:
            raise ValueError(why)
        return value

    return AfterValidator(check)


def _fits(model: Any, name: str) -> AfterValidator:
    return _storable(storable.column_length(model, name))


# Non-empty strings that fit the columns they are stored in.
EventId = Annotated[StrictStr, Field(min_length=1), _fits(WebhookEvent, "event_id")]
SubscriptionId = Annotated[StrictStr, Field(min_length=1), _fits(Subscription, "id")]
CustomerId = Annotated[StrictStr, Field(min_length=1), _fits(BillingAccount, "stripe_customer_id")]
PriceId = Annotated[StrictStr, Field(min_length=1), _fits(Subscription, "price_id")]
# An empty status reads as canceled (billing.services).
Status = Annotated[StrictStr, _fits(Subscription, "status")]
# Compared, never stored: only PostgreSQL's text rules apply (and an email
# longer than the column cannot be anyone's).
Email = Annotated[StrictStr, _fits(User, "email")]
Reference = Annotated[StrictStr, _storable(255)]
# Unix seconds, up to the year 9999: datetime refuses anything later.
Timestamp = Annotated[StrictInt, Field(ge=0, le=253_402_300_799)]


class _Shape(BaseModel):
    # Stripe sends many fields we do not read; only the ones we read are checked.
    model_config = ConfigDict(extra="ignore")


class _Price(_Shape):
    id: PriceId | None = None


class _Item(_Shape):
    price: _Price | None = None


class _Items(_Shape):
    data: list[_Item] | None = None


class _Subscription(_Shape):
    id: SubscriptionId | None = None
    customer: CustomerId | None = None
    status: Status | None = None
    items: _Items | None = None
    plan: _Price | None = None
    metadata: dict[str, Any] | None = None


class _CustomerDetails(_Shape):
    email: Email | None = None


class _CheckoutSession(_Shape):
    customer: CustomerId | None = None
    client_reference_id: Reference | None = None
    customer_details: _CustomerDetails | None = None
    customer_email: Email | None = None


class _Data(_Shape):
    object: dict[str, Any]


class _Event(_Shape):
    id: EventId
    type: Annotated[StrictStr, Field(max_length=255), _storable()]
    created: Timestamp
    data: _Data


_OBJECTS: dict[str, type[_Shape]] = {
    "checkout.session.completed": _CheckoutSession,
    **dict.fromkeys(SUBSCRIPTION_EVENTS, _Subscription),
}


def event(value: object) -> dict[str, Any]:
    """Return ``value`` if it is a Stripe event of the shape we read; else raise ``Refused``."""
    fields = value if isinstance(value, dict) else {}
    where = ""
    try:
        checked = _Event.model_validate(value)
        shape = _OBJECTS.get(checked.type)
        if shape is not None:
            where = "data.object."
            shape.model_validate(checked.data.object)
    except ValidationError as exc:
        raise Refused(
            where + _reason(exc), event_id=fields.get("id"), event_type=fields.get("type")
        ) from None
    assert isinstance(value, dict)
    return value


def _reason(exc: ValidationError) -> str:
    """Name the first bad field and what is wrong with it, in our words.

    Never pydantic's message as a whole: it can quote the body.
    """
    error = exc.errors(include_input=False, include_url=False)[0]
    field = ".".join(str(part) for part in error["loc"]) or "the event"
    kind = error["type"]
    context = error.get("ctx") or {}
    if kind == "missing":
        return f"{field} is missing"
    if kind == "string_too_long":
        return f"{field} must be at most {context.get('max_length')} characters"
    if kind == "string_too_short":
        return f"{field} must not be empty"
    if kind == "string_unicode":
        return f"{field} must be valid Unicode text"
    if kind == "value_error":
        return f"{field} {context.get('error')}"
    if kind in ("string_type", "int_type", "dict_type", "list_type", "model_type"):
        return f"{field} has the wrong type"
    return f"{field} is not valid"
