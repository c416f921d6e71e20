"""The query-embedding cache: in process, and shared through a real redis-server."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence

import numpy as np
import pytest

from accounts.tests.conftest import FakeClock
from accounts.tests.redis_server import RedisServer, RedisServerMissing
from memories import embeddings
from memories.embeddings import LocalEmbedder
from memories.embeddings.cache import KEY_PREFIX, QueryCache, cache_key, redis_name, scope

QUERY = "What does the user prefer for web frameworks?"
ALICE = scope("alice")
CHARLIE = scope("charlie")


class Counting(LocalEmbedder):
    """The bundled model, counting the texts it is asked to embed."""

    def __init__(self, model_id: str | None = None) -> None:
        super().__init__()
        if model_id:
            self.model_id = model_id
        self.texts: list[str] = []

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        self.texts.extend(texts)
        return super().embed(texts)

    def embed_one(self, text: str) -> np.ndarray:
        self.texts.append(text)
        return super().embed_one(text)


@pytest.fixture(scope="module")
def model() -> Counting:
    embedder = Counting()
    embedder.load()
    return embedder


@pytest.fixture(autouse=True)
def forget_model_calls(model: Counting) -> None:
    model.texts.clear()


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    try:
        server = RedisServer.start_new()
    except RedisServerMissing as exc:
        pytest.skip(str(exc))
    yield server
    server.close()


def cache(clock: FakeClock | None = None, **kwargs) -> QueryCache:
    kwargs.setdefault("max_entries", 100)
    kwargs.setdefault("ttl", 3600)
    return QueryCache(clock=clock or FakeClock(), **kwargs)


def test_a_repeated_query_is_served_from_the_cache_without_running_the_model(model):
    queries = cache()

    first, first_source = queries.embed(model, QUERY, scope=ALICE)
    second, second_source = queries.embed(model, QUERY, scope=ALICE)

    assert (first_source, second_source) == ("model", "cache")
    assert model.texts == [QUERY]
    np.testing.assert_array_equal(first, second)
    np.testing.assert_allclose(second, LocalEmbedder.embed_one(model, QUERY), atol=1e-6)
    stats = queries.stats()
    assert (stats.hits, stats.misses, stats.size, stats.hit_rate) == (1, 1, 1, 0.5)
    assert stats.avg_hit_ms is not None and stats.avg_miss_ms is not None


def test_a_cached_vector_cannot_be_changed_by_a_caller(model):
    queries = cache()
    queries.embed(model, QUERY, scope=ALICE)
    vector, _ = queries.embed(model, QUERY, scope=ALICE)

    with pytest.raises(ValueError):
        vector[0] = 42.0


def test_entries_are_keyed_by_model_as_well_as_text(model):
    queries = cache()
    other = Counting("another-model")
    other.load()

    queries.embed(model, QUERY, scope=ALICE)
    _, source = queries.embed(other, QUERY, scope=ALICE)

    assert source == "model"
    assert other.texts == [QUERY]


def test_different_texts_are_different_entries(model):
    queries = cache()

    queries.embed(model, QUERY, scope=ALICE)
    _, source = queries.embed(model, QUERY + "?", scope=ALICE)

    assert source == "model"
    assert cache_key(ALICE, model.model_id, QUERY) != cache_key(ALICE, model.model_id, QUERY + "?")


def test_an_entry_expires_after_its_ttl(model):
    clock = FakeClock()
    queries = cache(clock, ttl=60)
    queries.embed(model, QUERY, scope=ALICE)

    clock.advance(59)
    assert queries.embed(model, QUERY, scope=ALICE)[1] == "cache"
    clock.advance(2)
    assert queries.embed(model, QUERY, scope=ALICE)[1] == "model"
    assert queries.stats().expirations == 1


def test_the_least_recently_used_entry_is_evicted_at_the_size_limit(model):
    queries = cache(max_entries=2)
    queries.embed(model, "first", scope=ALICE)
    queries.embed(model, "second", scope=ALICE)
    queries.embed(model, "first", scope=ALICE)  # now the most recently used

    queries.embed(model, "third", scope=ALICE)

    assert queries.embed(model, "first", scope=ALICE)[1] == "cache"
    assert queries.embed(model, "second", scope=ALICE)[1] == "model"
    assert queries.stats().evictions == 2  # second, then third to make room for it again


def test_size_zero_turns_the_cache_off(model):
    queries = cache(max_entries=0)

    queries.embed(model, QUERY, scope=ALICE)
    _, source = queries.embed(model, QUERY, scope=ALICE)

    assert source == "model"
    assert model.texts == [QUERY, QUERY]
    assert len(queries) == 0


def test_bypassing_the_cache_runs_the_model_and_refreshes_the_entry(model):
    queries = cache()
    queries.embed(model, QUERY, scope=ALICE)

    _, source = queries.embed(model, QUERY, use_cache=False, scope=ALICE)

    assert source == "model"
    assert model.texts == [QUERY, QUERY]


def test_optimize_expires_stale_entries_and_demotes_the_least_recently_used(model):
    clock = FakeClock()
    queries = cache(clock, ttl=100)
    queries.embed(model, "old", scope=ALICE)
    clock.advance(90)
    for text in ("a", "b", "c"):
        queries.embed(model, text, scope=ALICE)
    clock.advance(20)  # "old" is now past its TTL
    before = queries.stats().bytes

    done = queries.optimize(scope=ALICE, model_id=model.model_id, max_entries=2)

    assert (done.expired, done.demoted, done.kept, done.refreshed) == (1, 1, 2, 0)
    assert done.bytes_freed == before - queries.stats().bytes > 0
    assert queries.embed(model, "c", scope=ALICE)[1] == "cache"
    assert queries.embed(model, "a", scope=ALICE)[1] == "model"


def test_optimize_drops_entries_of_a_model_no_longer_configured(model):
    queries = cache()
    other = Counting("retired-model")
    other.load()
    queries.embed(other, QUERY, scope=ALICE)
    queries.embed(model, QUERY, scope=ALICE)

    done = queries.optimize(scope=ALICE, model_id=model.model_id)

    assert (done.expired, done.kept) == (1, 1)


def test_force_refresh_empties_the_cache(model):
    queries = cache()
    queries.embed(model, "a", scope=ALICE)
    queries.embed(model, "b", scope=ALICE)

    done = queries.optimize(scope=ALICE, model_id=model.model_id, force_refresh=True)

    assert (done.refreshed, done.kept, len(queries)) == (2, 0, 0)
    assert queries.embed(model, "a", scope=ALICE)[1] == "model"


# One tenant's entries are its own --------------------------------------------------


def test_a_query_cached_for_one_tenant_is_a_model_run_for_another(model):
    queries = cache()
    queries.embed(model, QUERY, scope=ALICE)

    _, source = queries.embed(model, QUERY, scope=CHARLIE)

    assert source == "model"
    assert model.texts == [QUERY, QUERY]
    assert queries.embed(model, QUERY, scope=CHARLIE)[1] == "cache"  # his own, now


def test_an_agent_does_not_see_what_its_user_cached(model):
    queries = cache()
    queries.embed(model, QUERY, scope=ALICE)

    _, source = queries.embed(model, QUERY, scope=scope("alice", "research"))

    assert source == "model"
    assert cache_key(ALICE, model.model_id, QUERY) != cache_key(
        scope("alice", "research"), model.model_id, QUERY
    )


def test_stats_count_only_the_scopes_own_entries_and_lookups(model):
    queries = cache()
    for text in ("a", "b", "c"):
        queries.embed(model, text, scope=ALICE)
    queries.embed(model, "a", scope=ALICE)
    queries.embed(model, "z", scope=CHARLIE)

    alice, charlie, everyone = queries.stats(ALICE), queries.stats(CHARLIE), queries.stats()

    assert (alice.size, alice.hits, alice.misses) == (3, 1, 3)
    assert (charlie.size, charlie.hits, charlie.misses) == (1, 0, 1)
    assert charlie.bytes * 3 == alice.bytes > 0
    assert (everyone.size, everyone.hits, everyone.misses) == (4, 1, 4)
    assert queries.stats(scope("nobody")).size == 0


def test_an_eviction_is_counted_to_the_tenant_whose_entry_went(model):
    queries = cache(max_entries=2)
    queries.embed(model, "alice's", scope=ALICE)
    queries.embed(model, "charlie's 1", scope=CHARLIE)

    queries.embed(model, "charlie's 2", scope=CHARLIE)

    assert (queries.stats(ALICE).evictions, queries.stats(ALICE).size) == (1, 0)
    assert (queries.stats(CHARLIE).evictions, queries.stats(CHARLIE).size) == (0, 2)


def test_optimize_touches_only_the_callers_entries(model):
    clock = FakeClock()
    queries = cache(clock, ttl=100)
    queries.embed(model, "old", scope=ALICE)
    queries.embed(model, "old", scope=CHARLIE)
    clock.advance(90)
    for text in ("a", "b", "c"):
        queries.embed(model, text, scope=ALICE)
    clock.advance(20)

    trimmed = queries.optimize(scope=CHARLIE, model_id=model.model_id, max_entries=0)

    assert (trimmed.expired, trimmed.demoted, trimmed.kept) == (1, 0, 0)
    assert queries.stats(ALICE).size == 4  # her stale entry too: only hers to expire
    refreshed = queries.optimize(scope=CHARLIE, model_id=model.model_id, force_refresh=True)
    assert refreshed.refreshed == 0
    assert queries.embed(model, "a", scope=ALICE)[1] == "cache"


def test_clear_drops_a_user_with_its_agents_or_everyone(model):
    queries = cache()
    queries.embed(model, QUERY, scope=ALICE)
    queries.embed(model, QUERY, scope=scope("alice", "research"))
    queries.embed(model, QUERY, scope=CHARLIE)
    queries.embed(model, QUERY, scope=scope("alicex"))  # a prefix of Alice's, not hers

    assert queries.clear(ALICE) == 2
    assert queries.embed(model, QUERY, scope=CHARLIE)[1] == "cache"
    assert queries.embed(model, QUERY, scope=scope("alicex"))[1] == "cache"
    assert queries.clear() == 2
    assert len(queries) == 0 and queries.stats().size == 0


# Shared through Redis --------------------------------------------------------------


def test_a_vector_computed_by_one_process_is_a_hit_in_another(model, redis_server):
    here = cache(redis_url=redis_server.url)
    there = cache(redis_url=redis_server.url)

    computed, _ = here.embed(model, QUERY, scope=ALICE)
    shared, source = there.embed(model, QUERY, scope=ALICE)

    assert source == "shared-cache"
    assert model.texts == [QUERY]
    np.testing.assert_array_equal(computed, shared)
    assert there.embed(model, QUERY, scope=ALICE)[1] == "cache"  # now held locally too
    assert there.stats().shared_hits == 1


def test_redis_holds_vectors_under_hashed_keys_and_never_the_query_text(model, redis_server):
    queries = cache(redis_url=redis_server.url, ttl=600)
    queries.embed(model, "my bank PIN is 4921", scope=ALICE)

    with redis_server.client() as client:
        names = list(client.scan_iter(match="*"))
        [name] = names
        hashed = cache_key(ALICE, model.model_id, "my bank PIN is 4921")
        assert name.decode() == redis_name(ALICE, hashed)
        assert b"4921" not in client.get(name)
        assert 0 < client.ttl(name) <= 600


def test_with_redis_down_it_caches_in_process_and_warns_once(model, redis_server, caplog):
    queries = cache(redis_url=redis_server.url)
    redis_server.stop()

    with caplog.at_level(logging.WARNING, logger="memories.embeddings.cache"):
        assert queries.embed(model, QUERY, scope=ALICE)[1] == "model"
        assert queries.embed(model, QUERY, scope=ALICE)[1] == "cache"
        assert queries.embed(model, "another", scope=ALICE)[1] == "model"

    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert not queries.stats().shared_available


def test_optimize_promotes_kept_entries_to_redis_and_force_refresh_clears_it(model, redis_server):
    queries = cache(redis_url=redis_server.url)
    queries.embed(model, "a", scope=ALICE)
    queries.embed(model, "b", scope=ALICE)
    with redis_server.client() as client:
        client.flushall()  # as if Redis had restarted empty

        promoted = queries.optimize(scope=ALICE, model_id=model.model_id)
        assert promoted.promoted == 2
        assert len(list(client.scan_iter(match=KEY_PREFIX + "*"))) == 2

        refreshed = queries.optimize(scope=ALICE, model_id=model.model_id, force_refresh=True)
        assert refreshed.refreshed == 4  # two here, two in Redis
        assert list(client.scan_iter(match=KEY_PREFIX + "*")) == []


def test_redis_shares_a_tenants_vectors_with_its_own_lookups_only(model, redis_server):
    here = cache(redis_url=redis_server.url)
    there = cache(redis_url=redis_server.url)
    here.embed(model, QUERY, scope=ALICE)

    assert there.embed(model, QUERY, scope=CHARLIE)[1] == "model"
    assert there.embed(model, QUERY, scope=ALICE)[1] == "shared-cache"
    assert (there.shared_size(ALICE), there.shared_size(CHARLIE), there.shared_size()) == (1, 1, 2)


def test_force_refresh_in_redis_leaves_other_tenants_entries(model, redis_server):
    queries = cache(redis_url=redis_server.url)
    queries.embed(model, "a", scope=ALICE)
    queries.embed(model, "b", scope=ALICE)
    queries.embed(model, "a", scope=CHARLIE)

    done = queries.optimize(scope=CHARLIE, model_id=model.model_id, force_refresh=True)

    assert done.refreshed == 2  # his one entry, here and in Redis
    assert queries.shared_size(ALICE) == 2
    assert cache(redis_url=redis_server.url).embed(model, "b", scope=ALICE)[1] == "shared-cache"


def test_clearing_a_user_in_redis_takes_its_agents_and_leaves_the_rest(model, redis_server):
    queries = cache(redis_url=redis_server.url)
    research = scope("alice", "research")
    for owner in (ALICE, research, CHARLIE, scope("alicex")):
        queries.embed(model, QUERY, scope=owner)

    assert queries.clear(ALICE, shared=True) == 4  # two here, two in Redis
    assert (queries.shared_size(ALICE), queries.shared_size(research)) == (0, 0)
    assert (queries.shared_size(CHARLIE), queries.shared_size(scope("alicex"))) == (1, 1)


# Searches go through it ----------------------------------------------------------------


def test_recall_embeds_a_repeated_query_once(cast, settings):
    from accounts.tiers import Tier
    from memories import services

    embeddings.reset_query_cache()
    services.remember(user_id=cast.alice.id, tier=Tier.PRO, content="The user prefers FastAPI.")
    before = embeddings.get_query_cache().stats()

    first = services.recall(user_id=cast.alice.id, query="web frameworks?", threshold=0)
    second = services.recall(user_id=cast.alice.id, query="  web frameworks?\r\n", threshold=0)

    after = embeddings.get_query_cache().stats()
    assert first == second
    assert (after.misses - before.misses, after.hits - before.hits) == (1, 1)
