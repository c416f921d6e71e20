"""The shape of the Stripe events we act on, checked before any of it is used.

A signed body is authentic, not necessarily well formed: a test fixture, a
replayed fragment or an API change can put a string where an object belongs.
``event()`` checks every field ``billing.services`` reads, with the types it
assumes, and raises ValueError for anything else, so the webhook answers 400
and changes nothing instead of failing half-way through.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr, ValidationError

from billing.services import SUBSCRIPTION_EVENTS

Id = Annotated[StrictStr, Field(min_length=1, max_length=255)]
# Unix seconds, up to the year 9999: datetime refuses anything later.
Timestamp = Annotated[StrictInt, Field(ge=0, le=253_402_300_799)]


class _Shape(BaseModel):
    # Stripe sends many fields we do not read; only the ones we read are checked.
    model_config = ConfigDict(extra="ignore")


class _Price(_Shape):
    id: Id | None = None


class _Item(_Shape):
    price: _Price | None = None


class _Items(_Shape):
    data: list[_Item] | None = None


class _Subscription(_Shape):
    id: Id | None = None
    customer: Id | None = None
    status: Annotated[StrictStr, Field(max_length=64)] | None = None
    items: _Items | None = None
    plan: _Price | None = None
    metadata: dict[str, Any] | None = None


class _CustomerDetails(_Shape):
    email: StrictStr | None = None


class _CheckoutSession(_Shape):
    customer: Id | None = None
    client_reference_id: StrictStr | None = None
    customer_details: _CustomerDetails | None = None
    customer_email: StrictStr | None = None


class _Data(_Shape):
    object: dict[str, Any]


class _Event(_Shape):
    id: Id
    type: Annotated[StrictStr, Field(max_length=255)]
    created: Timestamp
    data: _Data


_OBJECTS: dict[str, type[_Shape]] = {
    "checkout.session.completed": _CheckoutSession,
    **dict.fromkeys(SUBSCRIPTION_EVENTS, _Subscription),
}


def event(value: object) -> dict[str, Any]:
    """Return ``value`` if it is a Stripe event of the shape we read; else raise ValueError."""
    try:
        checked = _Event.model_validate(value)
        shape = _OBJECTS.get(checked.type)
        if shape is not None:
            shape.model_validate(checked.data.object)
    except ValidationError:
        # Never the validation message: it quotes the body.
        raise ValueError("not a Stripe event of a known shape") from None
    assert isinstance(value, dict)
    return value
