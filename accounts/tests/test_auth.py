from __future__ import annotations

import time

from django.utils import timezone

from accounts import auth
from accounts.auth import AuthCache, AuthContext
from accounts.models import ApiKey
from core import tenancy


def context(n: int) -> AuthContext:
    import uuid

    return AuthContext(user_id=uuid.UUID(int=n), api_key_id=uuid.UUID(int=n), tier="free")


def test_the_cache_is_bounded_and_least_recently_used_goes_first():
    cache = AuthCache(max_entries=2, ttl=60)
    cache.put("a", context(1))
    cache.put("b", context(2))
    cache.get("a")
    cache.put("c", context(3))
    assert cache.get("a") == context(1)
    assert cache.get("b") is None
    assert len(cache) == 2


def test_cached_entries_expire(monkeypatch):
    cache = AuthCache(ttl=10)
    now = [1000.0]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])
    cache.put("a", context(1))
    now[0] += 9.9
    assert cache.get("a") is not None
    now[0] += 0.2
    assert cache.get("a") is None


def test_it_authenticates_a_key_and_then_answers_from_the_cache(cast, django_assert_num_queries):
    found = auth.authenticate(cast.alice_key.raw)
    assert found == AuthContext(cast.alice.id, cast.alice_key.key.id, "free")
    with django_assert_num_queries(0):
        assert auth.authenticate(cast.alice_key.raw) == found
        assert auth.cached(cast.alice_key.raw) == found


def test_the_cache_never_holds_the_raw_key(cast):
    auth.authenticate(cast.alice_key.raw)
    assert cast.alice_key.raw not in repr(auth.get_cache()._entries)


def test_a_revocation_in_this_process_takes_effect_at_once(cast):
    from accounts import services

    assert auth.authenticate(cast.alice_key.raw) is not None
    services.revoke_keys([cast.alice_key.key.id])
    assert auth.authenticate(cast.alice_key.raw) is None


def test_a_tier_change_in_this_process_takes_effect_at_once(cast):
    from accounts import services

    assert auth.authenticate(cast.alice_key.raw).tier == "free"
    services.set_user_tier(user_id=cast.alice.id, tier="team")
    assert auth.authenticate(cast.alice_key.raw).tier == "team"
    assert auth.authenticate(cast.bob_key.raw).tier == "team"  # all of Alice's keys


def test_without_invalidation_a_revoked_key_lives_only_until_the_ttl(cast, settings):
    settings.AUTH_CACHE_TTL_SECONDS = 0
    auth.reset()
    assert auth.authenticate(cast.alice_key.raw) is not None
    with tenancy.operator():  # behind the services' back, e.g. raw SQL
        ApiKey.objects.filter(id=cast.alice_key.key.id).update(revoked_at=timezone.now())
    assert auth.authenticate(cast.alice_key.raw) is None


def test_a_revocation_committed_while_a_key_is_looked_up_is_not_cached_back(cast, monkeypatch):
    # The lookup read the row while it was live; the revocation then
    # committed and cleared the cache, and the lookup's put brought the key
    # back for the TTL in a process no other signal reaches.
    from accounts import services

    real = services.find_live_key

    def read_then_revoked(**kwargs):
        key = real(**kwargs)
        services.revoke_keys([cast.alice_key.key.id])
        return key

    monkeypatch.setattr(services, "find_live_key", read_then_revoked)
    assert auth.authenticate(cast.alice_key.raw) is not None  # what it read, this once
    monkeypatch.undo()

    assert auth.authenticate(cast.alice_key.raw) is None


def test_a_put_after_a_clear_keeps_nothing_read_before_it():
    cache = AuthCache()
    context = AuthContext(user_id="u", api_key_id="k", tier="free")
    since = cache.generation
    cache.clear()
    cache.put("digest", context, since=since)
    assert cache.get("digest") is None
    cache.put("digest", context, since=cache.generation)
    assert cache.get("digest") is context
