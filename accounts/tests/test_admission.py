"""admit(): the one rate-limit decision the HTTP gate, stdio and the key API all act on."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from accounts import admission, auth, ratelimit, services
from accounts.auth import AuthContext
from accounts.models import ApiKey
from accounts.ratelimit import InMemoryRateLimiter
from accounts.tests.conftest import FakeClock
from core import tenancy


@pytest.fixture
def limiter(monkeypatch, fake_clock: FakeClock) -> InMemoryRateLimiter:
    limiter = InMemoryRateLimiter(clock=fake_clock)
    monkeypatch.setattr(ratelimit, "get_rate_limiter", lambda: limiter)
    return limiter


@pytest.fixture
def alice(cast) -> AuthContext:
    caller = auth.authenticate(cast.alice_key.raw)
    assert caller is not None
    return caller


def spend(caller: AuthContext, n: int) -> None:
    for _ in range(n):
        assert admission.admit(caller).allowed


def test_it_admits_a_call_and_describes_the_bucket(alice, limiter):
    admitted = admission.admit(alice, tool="recall", request_id="r-1")

    assert admitted.allowed
    assert (admitted.error, admitted.event, admitted.retry_after) == (None, None, 0)
    assert admitted.headers == {
        "RateLimit-Limit": "10",
        "RateLimit-Remaining": "9",
        "RateLimit-Reset": "6",
    }


def test_an_unlimited_key_is_never_refused_and_has_no_bucket(cast, limiter, settings):
    settings.RATE_LIMITS = {**settings.RATE_LIMITS, "free": (1, 3600)}
    type(cast.alice).objects.filter(id=cast.alice.id).update(tier="unlimited")
    with tenancy.operator():
        ApiKey.objects.filter(id=cast.alice_key.key.id).update(tier="unlimited")
    caller = auth.authenticate(cast.alice_key.raw)
    assert caller is not None and caller.tier == "unlimited"

    decisions = [admission.admit(caller, tool="recall") for _ in range(100)]

    assert all(d.allowed and d.headers == {} and d.event is None for d in decisions)
    assert admission.admit(auth.authenticate(cast.charlie_key.raw)).headers != {}


def test_it_refuses_a_tool_call_past_the_limit_with_retry_after_and_a_usage_event(alice, limiter):
    spend(alice, 10)

    refused = admission.admit(alice, tool="remember", request_id="r-11")

    assert not refused.allowed
    assert refused.retry_after == 6  # the free tier's 10 a minute: one token every 6 s
    assert refused.headers["Retry-After"] == "6"
    assert refused.headers["RateLimit-Remaining"] == "0"
    assert refused.error is not None
    assert refused.error.code == "rate_limited"
    assert refused.error.message == "Rate limit for the free tier exceeded. Retry in 6 s."
    event = refused.event
    assert event is not None
    assert (event.user_id, event.api_key_id, event.request_id) == (
        alice.user_id,
        alice.api_key_id,
        "r-11",
    )
    assert (event.tool_name, event.success, event.error_code) == ("remember", False, "rate_limited")
    assert (event.latency_ms, event.tokens_consumed) == (0, 0)


def test_a_refused_request_that_calls_no_tool_leaves_no_usage_event(alice, limiter):
    spend(alice, 10)

    refused = admission.admit(alice)

    assert refused.error is not None
    assert refused.event is None


def test_retry_after_is_whole_seconds_rounded_up_and_never_zero(alice, limiter, fake_clock):
    spend(alice, 10)
    fake_clock.advance(5.9)  # 0.1 s short of the next token

    refused = admission.admit(alice, tool="recall")

    assert refused.retry_after == 1
    assert refused.headers["Retry-After"] == "1"
    assert refused.error is not None
    assert refused.error.message.endswith("Retry in 1 s.")


def test_each_key_has_its_own_bucket(cast, alice, limiter):
    bob = auth.authenticate(cast.bob_key.raw)
    assert bob is not None
    spend(alice, 10)

    assert not admission.admit(alice).allowed
    assert admission.admit(bob).allowed


def test_the_limit_follows_the_keys_tier(cast, limiter, settings):
    settings.RATE_LIMITS = {**settings.RATE_LIMITS, "pro": (3, 60)}
    pro = AuthContext(user_id=cast.charlie.id, api_key_id=cast.charlie_key.key.id, tier="pro")
    spend(pro, 3)

    refused = admission.admit(pro, tool="recall")

    assert refused.error is not None
    assert refused.error.message == "Rate limit for the pro tier exceeded. Retry in 20 s."


@pytest.mark.parametrize("oauth", [False, True])
def test_a_tier_bought_when_the_bucket_ran_dry_gives_its_allowance_at_once(
    cast, limiter, settings, oauth
):
    # The empty bucket carried over, refilling at the new rate: after paying,
    # the user still waited.
    settings.RATE_LIMITS = {**settings.RATE_LIMITS, "free": (2, 60), "pro": (5, 60)}
    key = None if oauth else cast.charlie_key.key.id
    free = AuthContext(user_id=cast.charlie.id, api_key_id=key, tier="free")
    spend(free, 2)
    assert not admission.admit(free).allowed

    pro = AuthContext(user_id=cast.charlie.id, api_key_id=key, tier="pro")

    assert admission.admit(pro).headers["RateLimit-Remaining"] == "4"


def test_a_long_tool_name_is_cut_to_fit_the_usage_event(alice, limiter):
    spend(alice, 10)

    refused = admission.admit(alice, tool="x" * 500)

    assert refused.event is not None
    assert refused.event.tool_name == "x" * 64


def test_async_transports_get_the_same_decision(alice, limiter):
    spend(alice, 10)

    refused = asyncio.run(admission.aadmit(alice, tool="recall", request_id="r-async"))

    assert refused.error is not None
    assert refused.event is not None
    assert refused.event.request_id == "r-async"


def test_a_users_oauth_connections_share_one_bucket_of_their_own(cast, agents, alice, limiter):
    def token(user, agent) -> AuthContext:
        return AuthContext(user_id=user.id, api_key_id=None, tier="free", agent_id=agent.id)

    spend(token(cast.alice, agents.research), 10)

    # Any other token of Alice's, whatever its agent, finds the bucket empty...
    assert not admission.admit(token(cast.alice, agents.writer)).allowed
    # ...while her key, and Charlie's tokens, have buckets of their own.
    assert admission.admit(alice).allowed
    assert admission.admit(token(cast.charlie, agents.helper)).allowed


def rotate(cast, old_key_id: uuid.UUID) -> tuple[uuid.UUID, AuthContext]:
    """Revoke a key of Alice's and make her a new one, as the dashboard does (unmetered)."""
    from conftest import issue_key

    services.revoke_keys([old_key_id])
    new = issue_key(cast.alice, "replacement")
    caller = auth.authenticate(new.raw)
    assert caller is not None
    return new.key.id, caller


def test_revoking_and_creating_keys_buys_no_more_than_max_keys_allowances(
    cast, alice, limiter, settings
):
    settings.RATE_LIMITS = {**settings.RATE_LIMITS, "free": (2, 60)}
    settings.MAX_KEYS_PER_USER = 2
    bob = auth.authenticate(cast.bob_key.raw)
    assert bob is not None
    # The normal case: each of her two live keys spends its own whole burst.
    spend(alice, 2)
    spend(bob, 2)

    key_id = cast.bob_key.key.id
    refusals = []
    for _ in range(3):
        key_id, fresh = rotate(cast, key_id)
        refusals.append(admission.admit(fresh, tool="recall", request_id="r-rot"))

    assert [r.allowed for r in refusals] == [False] * 3
    refused = refusals[-1]
    # The ceiling's wait: four calls a minute for her keys together, one every 15 s.
    assert refused.retry_after == 15
    assert refused.headers["Retry-After"] == "15"
    assert refused.headers["RateLimit-Limit"] == "4"
    assert refused.headers["RateLimit-Remaining"] == "0"
    assert refused.error is not None
    assert refused.error.message == "Rate limit for the free tier exceeded. Retry in 15 s."
    assert refused.event is not None
    assert (refused.event.api_key_id, refused.event.error_code) == (key_id, "rate_limited")


def test_the_ceiling_refills_at_max_keys_times_the_tiers_rate(
    cast, alice, limiter, settings, fake_clock
):
    settings.RATE_LIMITS = {**settings.RATE_LIMITS, "free": (2, 60)}
    settings.MAX_KEYS_PER_USER = 2
    key_id = cast.bob_key.key.id
    admitted = 0
    for _ in range(10):  # a new key every 5 s for 50 s
        key_id, fresh = rotate(cast, key_id)
        admitted += sum(admission.admit(fresh).allowed for _ in range(2))
        fake_clock.advance(5)

    # A full ceiling (4) and what it refilled in 45 s at 4 a minute (3), not 2 per new key.
    assert admitted == 4 + 3


def test_a_refusal_by_its_own_bucket_leaves_the_ceiling_alone(cast, alice, limiter, settings):
    settings.RATE_LIMITS = {**settings.RATE_LIMITS, "free": (2, 60)}
    settings.MAX_KEYS_PER_USER = 2
    spend(alice, 2)
    assert [admission.admit(alice).allowed for _ in range(50)] == [False] * 50

    bob = auth.authenticate(cast.bob_key.raw)
    assert bob is not None
    spend(bob, 2)  # the ceiling still held the two calls that were Bob's to make


def test_oauth_connections_do_not_draw_from_the_keys_ceiling(
    cast, agents, alice, limiter, settings
):
    settings.RATE_LIMITS = {**settings.RATE_LIMITS, "free": (2, 60)}
    settings.MAX_KEYS_PER_USER = 1
    spend(alice, 2)  # the ceiling for one key is empty

    connection = AuthContext(
        user_id=cast.alice.id, api_key_id=None, tier="free", agent_id=agents.research.id
    )
    spend(connection, 2)


@pytest.mark.parametrize("attempt", [admission.sign_in, admission.password_reset])
def test_an_address_out_of_attempts_makes_no_bucket_for_each_account_it_names(settings, attempt):
    settings.SIGN_IN_RATE_LIMIT = (1, 3600)  # ten an hour per address, across accounts
    ratelimit.reset_rate_limiter()
    limiter = ratelimit.get_rate_limiter()
    assert isinstance(limiter, InMemoryRateLimiter)
    for n in range(10):
        assert attempt("203.0.113.7", f"user{n}@example.com") == 0
    held = len(limiter)

    refused = [attempt("203.0.113.7", f"more{n}@example.com") for n in range(50)]

    assert all(wait > 0 for wait in refused)
    # Before, each refused attempt left a bucket for the account it named: one
    # address could make as many as it liked, and in the workers' shared table
    # push others' buckets out.
    assert len(limiter) == held
    ratelimit.reset_rate_limiter()
