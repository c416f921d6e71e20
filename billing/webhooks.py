"""Webhooks that set tiers: Stripe's and MCPize's.

Both answer 404 while their secret is unset, so an unconfigured server does
not look like it has billing. Both are thin: verify, parse, then call
billing/services.py, which applies each delivery once.

MCPize signature scheme
    ``X-MCPize-Signature`` is the hex HMAC-SHA256, under
    ``MCPIZE_BILLING_WEBHOOK_SECRET``, of the raw request body. A sender may
    also send ``X-MCPize-Timestamp`` (unix seconds); the signature then covers
    ``f"{timestamp}.{body}"``, and a delivery more than five minutes away from
    our clock is refused, so a captured request cannot be replayed later.
    Within those five minutes a replay is recognised by its signature and
    acknowledged without effect. ``Idempotency-Key`` (or an ``eventId`` in
    the body) names a delivery explicitly; a key already handled is
    acknowledged without effect. Without a timestamp, an identical body is a
    legitimate repeat (tier pro, then free, then pro again) and is applied;
    set ``MCPIZE_REQUIRE_TIMESTAMP`` to refuse such deliveries.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import re
import time
from typing import Any

import stripe
from django.conf import settings
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from billing import services, stripe_shapes
from core import safejson
from core.errors import RecallError

logger = logging.getLogger(__name__)

MCPIZE_MAX_SKEW = 300  # seconds
_UNIX_SECONDS = re.compile(r"[0-9]{1,12}")


def _error(status: int, code: str, message: str) -> JsonResponse:
    return JsonResponse({"error": {"code": code, "message": message}}, status=status)


def _not_configured(variable: str) -> JsonResponse:
    logger.warning("webhook not configured; answering 404", extra={"missing": variable})
    return _error(404, "not_found", "Not found.")


@csrf_exempt  # authenticated by signature, not by a session
@require_POST
def stripe_webhook(request: HttpRequest) -> JsonResponse:
    secret = settings.STRIPE_WEBHOOK_SECRET
    if not secret:
        return _not_configured("STRIPE_WEBHOOK_SECRET")
    try:
        # Verify first, parse after, with our own parser: Stripe's would
        # recurse into a deeply nested body, and build objects we never use.
        stripe.WebhookSignature.verify_header(
            request.body,
            request.headers.get("Stripe-Signature"),
            secret,
            tolerance=settings.STRIPE_WEBHOOK_TOLERANCE,
        )
    except (ValueError, stripe.SignatureVerificationError):
        logger.warning("stripe webhook refused: bad signature")
        return _error(400, "invalid_signature", "Invalid Stripe signature.")
    try:
        event = stripe_shapes.event(safejson.loads(request.body))
    except ValueError:
        logger.warning("stripe webhook refused: not a Stripe event we understand")
        return _error(400, "validation_failed", "Not a Stripe event.")
    outcome = services.handle_stripe_event(event)
    return JsonResponse({"received": True, "outcome": outcome})


def mcpize_signature(secret: str, body: bytes, timestamp: str | None = None) -> str:
    """Return the hex signature MCPize sends for ``body`` (and ``timestamp``, if any)."""
    signed = f"{timestamp}.".encode() + body if timestamp is not None else body
    return hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()


@csrf_exempt  # authenticated by signature, not by a session
@require_POST
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
    except ValueError:
        return _error(400, "validation_failed", "The body must be JSON.")
    if not isinstance(body, dict):
        return _error(400, "validation_failed", 'The body must be {"userId": ..., "tier": ...}.')
    key = request.headers.get("Idempotency-Key") or body.get("eventId")
    if not key and timestamp is not None:
        key = f"sig:{expected}"
    if key is not None and (not isinstance(key, str) or not 0 < len(key) <= 255):
        return _error(400, "validation_failed", "The idempotency key must be 1-255 characters.")
    try:
        applied = services.apply_mcpize_tier(
            user_id=body.get("userId"), tier=body.get("tier"), delivery_key=key
        )
    except RecallError as exc:
        return JsonResponse(exc.as_dict(), status=exc.http_status)
    return JsonResponse({"success": True, "duplicate": not applied})
