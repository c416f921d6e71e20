"""Rate-limit admission: whether a caller's request may run now.

One rule for every transport. The HTTP gate (for each ``tools/call``), the
stdio server (for each tool call) and the self-service key API (for each
request) call ``admit()`` and act on the ``Admission`` it returns: the
``RateLimit-*`` headers go on the response either way (a key of the Unlimited
tier has none, and is never refused); a refusal is answered
with ``Admission.error`` and ``Retry-After``, and a refused tool call leaves
the usage event ``Admission.event`` for the transport to record. The tool
never runs.
"""

from __future__ import annotations

import hashlib
import logging
import math
import unicodedata
from dataclasses import dataclass

import anyio
from django.conf import settings

from accounts import ratelimit
from accounts.auth import AuthContext
from core import usage
from core.errors import RateLimited

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Admission:
    # Whole seconds until a retry can succeed, rounded up; 0 when admitted.
    retry_after: int
    # RateLimit-* headers (IETF draft names), and Retry-After when refused.
    headers: dict[str, str]
    # The refusal, in the project's error vocabulary; None when admitted.
    error: RateLimited | None = None
    # What a refused tool call leaves in usage_events; None otherwise.
    event: usage.Event | None = None

    @property
    def allowed(self) -> bool:
        return self.error is None


def admit(
    caller: AuthContext, *, tool: str | None = None, request_id: str = "", shared: bool = True
) -> Admission:
    """Take one token from the caller's bucket (its key's, or its user's OAuth bucket), or refuse.

    A key's call also takes one from its user's ceiling for the key's tier
    (``AuthContext.ceiling_key``): ``MAX_KEYS_PER_USER`` allowances shared by
    all the user's keys, revoked ones included, and it is refused if that is empty.
    ``shared=False`` leaves the ceiling out: revoking a key, which a leaked key
    that spent the ceiling must not be able to prevent.

    Pass ``tool`` for a tool call: its refusal comes with a ``rate_limited``
    usage event that consumed no tokens. Other requests (the key API) leave
    no usage event.
    """
    limit = ratelimit.limit_for_tier(caller.tier)
    if limit is None:
        # The Unlimited tier: no bucket, and no RateLimit-* headers to describe one.
        return Admission(retry_after=0, headers={})
    decision = _check(caller, *limit, shared=shared)
    headers = decision.headers()
    if decision.allowed:
        return Admission(retry_after=0, headers=headers)

    wait = max(1, math.ceil(decision.retry_after))
    headers["Retry-After"] = str(wait)
    event = None
    if tool is not None:
        event = usage.event_of(
            caller,
            tool,
            request_id=request_id,
            error_code="rate_limited",
            latency_ms=0,
            tokens_consumed=0,
        )
    logger.info(
        "rate limited",
        extra={
            "request_id": request_id,
            "tool": tool[:64] if tool is not None else None,
            "api_key_id": str(caller.api_key_id) if caller.api_key_id else None,
            "agent_id": str(caller.agent_id) if caller.agent_id else None,
            "retry_after_s": wait,
        },
    )
    error = RateLimited(f"Rate limit for the {caller.tier} tier exceeded. Retry in {wait} s.")
    return Admission(retry_after=wait, headers=headers, error=error, event=event)


def _check(
    caller: AuthContext, capacity: int, refill_per_s: float, *, shared: bool = True
) -> ratelimit.RateDecision:
    """Take a token from the caller's bucket and then from its ceiling, if it has one.

    The call goes ahead only if both have a token. The ceiling is asked only
    after the key's bucket admitted, so a client retrying against its own
    empty bucket spends nothing of the allowance its user's other keys share.
    When the ceiling refuses, the key's token is already spent: that key only
    waits a little longer, and no call is ever admitted beyond either bucket.
    The decision returned describes the bucket nearer to refusing.
    """
    limiter = ratelimit.get_rate_limiter()
    decision = limiter.check(caller.rate_key, capacity, refill_per_s)
    ceiling_key = caller.ceiling_key if shared else None
    if not decision.allowed or ceiling_key is None:
        return decision
    keys = settings.MAX_KEYS_PER_USER
    ceiling = limiter.check(ceiling_key, capacity * keys, refill_per_s * keys)
    if not ceiling.allowed or ceiling.remaining < decision.remaining:
        return ceiling
    return decision


async def aadmit(
    caller: AuthContext, *, tool: str | None = None, request_id: str = ""
) -> Admission:
    """``admit()`` for async transports: with Redis, off the event loop."""
    if settings.REDIS_URL:  # network I/O
        return await anyio.to_thread.run_sync(
            lambda: admit(caller, tool=tool, request_id=request_id)
        )
    return admit(caller, tool=tool, request_id=request_id)


# An address may try this many times an account's allowance, across accounts:
# room for an office or a carrier's NAT, where many people sign in from one.
SIGN_IN_ADDRESS_FACTOR = 10


def sign_in(address: str | None, account: str) -> int:
    """Take one sign-in attempt for ``account`` from ``address``: 0 if it may go ahead,
    else the seconds until it may.

    Every attempt counts, right or wrong, before the password is checked, so
    a refused one learns nothing. Two buckets (``SIGN_IN_RATE_LIMIT``): the
    address's across accounts, ten times as large, then the address's for
    this account. Counting by account alone would let anyone lock a user
    out; by address alone, one address could try every account. A guesser
    spread over many addresses is paced per address only.
    """
    count, period = settings.SIGN_IN_RATE_LIMIT
    where = address or "unknown"
    who = _account(account)
    return _paced(
        "sign-in",
        where,
        period,
        ((f"sign-in:{where}", count * SIGN_IN_ADDRESS_FACTOR), (f"sign-in:{where}:{who}", count)),
    )


def password_reset(address: str | None, account: str) -> int:
    """Take one password-reset request for ``account`` from ``address``: 0 if it may go
    ahead, else the seconds until it may.

    Each request mails the account, so besides the sign-in's two buckets (an
    address across accounts, an address for this account) the account has one of
    its own, whatever the address: a sender spread over many addresses cannot
    fill a user's inbox. At worst they delay the user's own reset by as long;
    signing in is not touched (these buckets are apart from the sign-in's).
    """
    count, period = settings.SIGN_IN_RATE_LIMIT
    where = address or "unknown"
    who = _account(account)
    return _paced(
        "password reset",
        where,
        period,
        (
            (f"reset:{where}", count * SIGN_IN_ADDRESS_FACTOR),
            (f"reset:{where}:{who}", count),
            (f"reset:{who}", count),
        ),
    )


def new_client_document(address: str | None) -> int:
    """Take one first fetch of a client's metadata document for ``address``: 0 if it may
    go ahead, else the seconds until it may.

    An authorization (or token) request naming an https ``client_id`` not seen
    before makes the server fetch that URL and store a client, before anyone
    signs in: registration by another road, held to registration's allowance
    per address (``OAUTH_REGISTRATIONS_PER_HOUR``). Every first fetch counts,
    whether the document is good or not.
    """
    count = settings.OAUTH_REGISTRATIONS_PER_HOUR
    where = address or "unknown"
    return _paced("client metadata document", where, 3600.0, ((f"cimd:{where}", count),))


def _account(account: str) -> str:
    # As Django finds the account: its reset form compares NFKC and casefold, so
    # "\u017fales@" (long s) reached "sales@" in a bucket of its own.
    folded = unicodedata.normalize("NFKC", account.strip()).casefold()[:320]
    return hashlib.sha256(folded.encode("utf-8", "replace")).hexdigest()[:32]


def _paced(what: str, where: str, period: float, buckets: tuple[tuple[str, int], ...]) -> int:
    # The address's bucket comes first: an attempt it refuses makes no bucket for
    # the account it names, so one address cannot fill the limiter with buckets
    # (and, in the workers' shared table, push other buckets out) by naming
    # ever more accounts.
    limiter = ratelimit.get_rate_limiter()
    for key, capacity in buckets:
        decision = limiter.check(key, capacity, capacity / period)
        if not decision.allowed:
            wait = max(1, math.ceil(decision.retry_after))
            logger.info(f"{what} throttled", extra={"address": where, "retry_after_s": wait})
            return wait
    return 0
