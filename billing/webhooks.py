"""Webhooks that set tiers: Stripe's and MCPize's.

Both answer 404 while their secret is unset, so an unconfigured server does
not look like it has billing. Both are thin: verify, parse, then call
billing/services/, which applies each delivery once.

MCPize signature scheme
    ``X-MCPize-Signature`` is the hex HMAC-SHA256, under
    ``MCPIZE_BILLING_WEBHOOK_SECRET``, of the raw request body. A sender may
    also send ``X-MCPize-Timestamp`` (unix seconds); the signature then covers
    ``f"{timestamp}.{body}"``, and a delivery more than five minutes away from
    our clock is refused, so a captured request cannot be replayed later.
    Within those five minutes a replay is recognised by its signature and
    acknowledged without effect. ``Idempotency-Key`` (or an ``eventId`` in
    the body) names a delivery explicitly; a key already handled is
    acknowledged without effect. The header is not signed, so it never
    replaces what is: a delivery is known by its ``eventId`` and, timestamped,
    its signature, whatever header it carries.
    A timestamped delivery older than the newest one applied to its user (a
    late retry) is acknowledged as ``"outcome": "stale"`` and changes
    nothing, as a stale Stripe event does. Without a timestamp, an identical
    body is a legitimate repeat (tier pro, then free, then pro again) and is
    applied; set ``MCPIZE_REQUIRE_TIMESTAMP`` to refuse such deliveries.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import re
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from functools import wraps
from typing import Any

import stripe
from django.conf import settings
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from billing import services, stripe_shapes
from billing.models import WebhookEvent
from core import errors, safejson, storable
from core.errors import RecallError

logger = logging.getLogger(__name__)

MCPIZE_MAX_SKEW = 300  # seconds
KEY_MAX = storable.column_length(WebhookEvent, "event_id")
_UNIX_SECONDS = re.compile(r"[0-9]{1,12}")


def _error(status: int, code: str, message: str) -> JsonResponse:
    return JsonResponse({"error": {"code": code, "message": message}}, status=status)


def _posted(view: Callable[[HttpRequest], JsonResponse]) -> Callable[[HttpRequest], JsonResponse]:
    """Answer any method but POST with 405 in the webhooks' JSON, not an empty page."""

    @wraps(view)
    def only_post(request: HttpRequest) -> JsonResponse:
        if request.method != "POST":
            refused = _error(405, "method_not_allowed", "Webhooks take POST only.")
            refused["Allow"] = "POST"
            return refused
        return view(request)

    return only_post


def _not_configured(variable: str) -> JsonResponse:
    logger.warning("webhook not configured; answering 404", extra={"missing": variable})
    return _error(404, "not_found", "Not found.")


@csrf_exempt  # authenticated by signature, not by a session
@_posted
def stripe_webhook(request: HttpRequest) -> JsonResponse:
    secret = settings.STRIPE_WEBHOOK_SECRET
    if not secret:
        return _not_configured("STRIPE_WEBHOOK_SECRET")
    header = request.headers.get("Stripe-Signature")
    try:
        # A signature is ASCII: the SDK's comparison raised TypeError on
        # anything else, a 500 to an unauthenticated caller.
        if header is not None and not header.isascii():
            raise ValueError("the signature is not ASCII")
        # Verify first, parse after, with our own parser: Stripe's would
        # recurse into a deeply nested body, and build objects we never use.
        stripe.WebhookSignature.verify_header(
            request.body, header, secret, tolerance=settings.STRIPE_WEBHOOK_TOLERANCE
        )
        # The SDK refuses only old signatures; one dated ahead of our clock could
        # be replayed for as long as it is ahead, so it is refused as MCPize's is.
        if _stripe_signed_at(header or "") > time.time() + settings.STRIPE_WEBHOOK_TOLERANCE:
            raise ValueError("the signature is dated ahead of our clock")
    except (ValueError, stripe.SignatureVerificationError):
        logger.warning("stripe webhook refused: bad signature")
        return _error(400, "invalid_signature", "Invalid Stripe signature.")
    try:
        body = safejson.loads(request.body)
    except ValueError as exc:
        return _refused("stripe", _unreadable(exc))
    try:
        event = stripe_shapes.event(body)
    except stripe_shapes.Refused as exc:
        return _refused("stripe", exc.reason, event_id=exc.event_id, event_type=exc.event_type)
    try:
        outcome = services.handle_stripe_event(event)
    except RecallError as exc:
        # Nothing was written, the delivery included: once the operator has
        # mended what it names, Stripe's retry (or "Resend") applies it.
        return _failed("stripe", exc, event_id=event["id"], event_type=event.get("type"))
    return JsonResponse({"received": True, "outcome": outcome})


def _refused(
    source: str,
    reason: str,
    *,
    status: int = 400,
    code: str = "validation_failed",
    event_id: object = None,
    event_type: object = None,
    details: Mapping[str, Any] | None = None,
) -> JsonResponse:
    """Answer a signed delivery we cannot apply, and keep it for the operator."""
    services.record_rejection(
        source=source, reason=reason, status=status, event_id=event_id, event_type=event_type
    )
    # A service's message may end in a full stop of its own.
    return JsonResponse(
        errors.body(code, f"Refused: {reason.rstrip('.')}.", details), status=status
    )


def _failed(
    source: str, exc: RecallError, *, event_id: object, event_type: object = None
) -> JsonResponse:
    """Answer a delivery the service could not apply: refused in the webhooks' words with
    the error's details, or, for a failure of ours (5xx), as it is, for the sender to retry."""
    if exc.http_status < 500:
        return _refused(
            source,
            exc.message,
            status=exc.http_status,
            code=exc.code,
            event_id=event_id,
            event_type=event_type,
            details=exc.details,
        )
    services.record_rejection(
        source=source,
        reason=exc.message,
        status=exc.http_status,
        event_id=event_id,
        event_type=event_type,
    )
    return JsonResponse(exc.as_dict(), status=exc.http_status)


def _unreadable(exc: ValueError) -> str:
    """Say why a signed body could not be read, for its refusal."""
    if isinstance(exc, safejson.TooDeep):
        return f"the body is nested more than {safejson.MAX_DEPTH} deep"
    if isinstance(exc, safejson.TooLong):
        return "the body has a number too long to read"
    return "the body is not JSON"


def _stripe_signed_at(header: str) -> int:
    """Return the time a verified ``Stripe-Signature`` header was signed at, read as the SDK
    reads it: its first ``t=``."""
    for item in header.split(","):
        name, *value = item.split("=", 2)
        if name == "t" and value:
            return int(value[0])
    raise ValueError("the signature has no timestamp")


def _key_problem(key: object) -> str | None:
    """Why a delivery's idempotency key cannot be stored, or None (no key is fine)."""
    if key is None:
        return None
    if not isinstance(key, str):
        return "must be a string"
    if not key:
        return "must not be empty"
    return storable.problem(key, max_length=KEY_MAX)


def mcpize_signature(secret: str, body: bytes, timestamp: str | None = None) -> str:
    """Return the hex signature MCPize sends for ``body`` (and ``timestamp``, if any)."""
    signed = f"{timestamp}.".encode() + body if timestamp is not None else body
    return hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()


@csrf_exempt  # authenticated by signature, not by a session
@_posted
def mcpize_webhook(request: HttpRequest) -> JsonResponse:
    secret = settings.MCPIZE_BILLING_WEBHOOK_SECRET
    if not secret:
        return _not_configured("MCPIZE_BILLING_WEBHOOK_SECRET")

    timestamp = request.headers.get("X-MCPize-Timestamp")
    if timestamp is None and settings.MCPIZE_REQUIRE_TIMESTAMP:
        return _error(401, "unauthorized", "X-MCPize-Timestamp is required.")
    # ASCII digits only: str.isdigit() also takes "²", which int() refuses.
    if timestamp is not None and not _UNIX_SECONDS.fullmatch(timestamp):
        return _error(401, "unauthorized", "X-MCPize-Timestamp must be unix seconds.")
    given = request.headers.get("X-MCPize-Signature", "").strip().lower()
    expected = mcpize_signature(secret, request.body, timestamp)
    if not hmac.compare_digest(expected.encode(), given.encode("latin-1", "replace")):
        logger.warning("mcpize webhook refused: bad signature")
        return _error(401, "unauthorized", "Invalid signature.")
    if timestamp is not None and abs(time.time() - int(timestamp)) > MCPIZE_MAX_SKEW:
        logger.warning("mcpize webhook refused: timestamp outside five minutes")
        return _error(401, "unauthorized", "The timestamp is too old or too far ahead.")

    try:
        body: Any = safejson.loads(request.body)
    except ValueError as exc:
        return _refused("mcpize", _unreadable(exc))
    if not isinstance(body, dict):
        return _refused("mcpize", 'the body must be {"userId": ..., "tier": ...}')
    event_id = body.get("eventId")
    header = request.headers.get("Idempotency-Key")
    for name, given_key in (("eventId", event_id), ("the Idempotency-Key header", header)):
        why = _key_problem(given_key)
        if why is not None:
            return _refused("mcpize", f"{name} {why}", event_id=given_key)
    # Idempotency-Key is not signed: a replay that adds a fresh one must still
    # be known by what is signed, its eventId and (timestamped) its signature,
    # so a delivery claims every name it has.
    signature_key = f"sig:{expected}" if timestamp is not None else None
    keys = list(dict.fromkeys(k for k in (signature_key, event_id, header) if k))
    key = event_id or header
    signed_at = datetime.fromtimestamp(int(timestamp), UTC) if timestamp is not None else None
    try:
        outcome = services.apply_mcpize_tier(
            user_id=body.get("userId"),
            tier=body.get("tier"),
            delivery_keys=keys,
            signed_at=signed_at,
        )
    except RecallError as exc:
        return _failed("mcpize", exc, event_id=key or signature_key)
    return JsonResponse({"success": True, "duplicate": outcome == "duplicate", "outcome": outcome})
